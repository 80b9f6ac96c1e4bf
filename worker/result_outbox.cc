// ResultOutbox.
#include "worker/result_outbox.h"

#include <algorithm>
#include <utility>

namespace deepinfer {

void ResultOutbox::Add(std::vector<RequestResult> results) {
  absl::MutexLock lock(&mu_);
  for (RequestResult& r : results) pending_.push_back(std::move(r));
}

std::vector<RequestResult> ResultOutbox::Peek(size_t max) const {
  absl::MutexLock lock(&mu_);
  const size_t n = std::min(max, pending_.size());
  return std::vector<RequestResult>(pending_.begin(), pending_.begin() + n);
}

void ResultOutbox::Pop(size_t n) {
  absl::MutexLock lock(&mu_);
  n = std::min(n, pending_.size());
  pending_.erase(pending_.begin(), pending_.begin() + n);
  delivered_ += n;
}

bool ResultOutbox::WaitForResults(absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto waiting = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !pending_.empty() || interrupted_;
  };
  mu_.AwaitWithTimeout(absl::Condition(&waiting), timeout);
  return !pending_.empty();
}

void ResultOutbox::Interrupt() {
  absl::MutexLock lock(&mu_);
  interrupted_ = true;
}

size_t ResultOutbox::size() const {
  absl::MutexLock lock(&mu_);
  return pending_.size();
}

size_t ResultOutbox::delivered() const {
  absl::MutexLock lock(&mu_);
  return delivered_;
}

}  // namespace deepinfer
