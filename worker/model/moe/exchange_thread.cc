// ExchangeThread: a FIFO of expert exchanges on one thread.
#include "worker/model/moe/exchange_thread.h"

#include <utility>

namespace deepinfer {

ExchangeThread::~ExchangeThread() {
  (void)WaitAll();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

ExchangeThread::Ticket ExchangeThread::Submit(ExpertDispatcher::Exchange exchange) {
  absl::MutexLock lock(&mu_);
  const Ticket ticket = next_++;
  queue_.emplace_back(ticket, std::move(exchange));
  if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  return ticket;
}

absl::Status ExchangeThread::Wait(Ticket ticket) {
  absl::MutexLock lock(&mu_);
  auto ran = [this, ticket]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ran_ > ticket; };
  mu_.Await(absl::Condition(&ran));
  auto it = finished_.find(ticket);
  if (it == finished_.end()) return absl::OkStatus();  // waited for before
  absl::Status status = std::move(it->second);
  finished_.erase(it);
  return status;
}

absl::Status ExchangeThread::WaitAll() {
  absl::MutexLock lock(&mu_);
  auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return ran_ == next_; };
  mu_.Await(absl::Condition(&all));
  absl::Status first;
  for (auto& [ticket, status] : finished_) {
    if (first.ok()) first = std::move(status);
  }
  finished_.clear();
  return first;
}

void ExchangeThread::Loop() {
  while (true) {
    std::pair<Ticket, ExpertDispatcher::Exchange> next;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || !queue_.empty(); };
      mu_.Await(absl::Condition(&work));
      if (queue_.empty()) return;  // stop_
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    absl::Status status = next.second ? next.second() : absl::OkStatus();
    absl::MutexLock lock(&mu_);
    finished_[next.first] = std::move(status);
    ran_ = next.first + 1;
  }
}

}  // namespace deepinfer
