// RequestQueue.
#include "worker/engine/request_queue.h"

#include <utility>

namespace deepinfer {

void RequestQueue::Push(std::vector<WorkItem> items) {
  absl::MutexLock lock(&mu_);
  for (WorkItem& item : items) {
    tokens_ += item.prompt_token_ids_size();
    items_.push_back(std::move(item));
  }
  woken_ = true;
}

void RequestQueue::Cancel(const std::vector<std::string>& request_ids) {
  absl::MutexLock lock(&mu_);
  cancelled_.insert(cancelled_.end(), request_ids.begin(), request_ids.end());
  woken_ = true;
}

RequestQueue::Drained RequestQueue::Drain() {
  absl::MutexLock lock(&mu_);
  Drained out;
  out.items.swap(items_);
  out.cancelled.swap(cancelled_);
  tokens_ = 0;
  woken_ = false;
  return out;
}

void RequestQueue::WaitForWork(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&woken_), timeout);
  woken_ = false;
}

void RequestQueue::Wake() {
  absl::MutexLock lock(&mu_);
  woken_ = true;
}

int32_t RequestQueue::num_items() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int32_t>(items_.size());
}

int64_t RequestQueue::num_tokens() const {
  absl::MutexLock lock(&mu_);
  return tokens_;
}

}  // namespace deepinfer
