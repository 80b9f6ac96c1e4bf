// ThreadPool implementation: one job at a time, chunks claimed under the mutex.
#include "worker/backend/cpu/thread_pool.h"

#include <algorithm>

namespace deepinfer {

ThreadPool::ThreadPool(int num_threads)
    : num_threads_(num_threads > 0 ? num_threads
                                   : std::max(1u, std::thread::hardware_concurrency())) {
  // The caller works too, so num_threads_ - 1 helpers.
  for (int i = 1; i < num_threads_; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::ParallelFor(int64_t n, int64_t min_chunk,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  min_chunk = std::max<int64_t>(1, min_chunk);
  // A few chunks per thread balance uneven work without much locking.
  int64_t chunk = std::max(min_chunk, (n + 4 * num_threads_ - 1) / (4 * num_threads_));
  if (num_threads_ == 1 || chunk >= n) {
    fn(0, n);
    return;
  }
  int64_t num_chunks = (n + chunk - 1) / chunk;
  {
    absl::MutexLock lock(&mu_);
    job_ = &fn;
    job_n_ = n;
    chunk_size_ = chunk;
    num_chunks_ = num_chunks;
    next_chunk_ = 0;
    done_chunks_ = 0;
    ++generation_;
  }
  // The caller claims chunks like any worker, then waits for the stragglers.
  while (true) {
    int64_t c;
    {
      absl::MutexLock lock(&mu_);
      if (next_chunk_ >= num_chunks_) break;
      c = next_chunk_++;
    }
    fn(c * chunk, std::min(n, (c + 1) * chunk));
    absl::MutexLock lock(&mu_);
    ++done_chunks_;
  }
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](ThreadPool* p)
           ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) { return p->done_chunks_ == p->num_chunks_; },
      this));
  job_ = nullptr;
}

void ThreadPool::WorkerLoop() {
  uint64_t seen = 0;
  while (true) {
    const std::function<void(int64_t, int64_t)>* fn;
    int64_t c, chunk, n;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this, &seen]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || (job_ != nullptr && next_chunk_ < num_chunks_) || generation_ != seen;
      };
      mu_.Await(absl::Condition(&has_work));
      if (stop_) return;
      seen = generation_;
      if (job_ == nullptr || next_chunk_ >= num_chunks_) continue;
      fn = job_;
      c = next_chunk_++;
      chunk = chunk_size_;
      n = job_n_;
    }
    (*fn)(c * chunk, std::min(n, (c + 1) * chunk));
    absl::MutexLock lock(&mu_);
    ++done_chunks_;
  }
}

}  // namespace deepinfer
