// ThreadPool: a fixed set of std::threads that the CPU backend uses to split loops. ParallelFor
// blocks the caller until every chunk has run, which keeps op semantics synchronous.
#ifndef DEEPINFER_WORKER_BACKEND_CPU_THREAD_POOL_H_
#define DEEPINFER_WORKER_BACKEND_CPU_THREAD_POOL_H_

#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace deepinfer {

class ThreadPool {
 public:
  // num_threads <= 0 means std::thread::hardware_concurrency(). With one thread everything runs
  // on the caller.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(begin, end) over disjoint ranges covering [0, n), each at least min_chunk long
  // (except possibly the last), and returns when all calls have finished. Not reentrant: fn
  // must not call ParallelFor on the same pool.
  void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();

  const int num_threads_;
  std::vector<std::thread> workers_;
  absl::Mutex mu_;
  // Current job; workers claim chunk indices from next_chunk_.
  const std::function<void(int64_t, int64_t)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t job_n_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t chunk_size_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t num_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_chunk_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t done_chunks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CPU_THREAD_POOL_H_
