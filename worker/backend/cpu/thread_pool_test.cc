// Tests for ThreadPool: every index is visited exactly once, for many sizes and pool widths.
#include "worker/backend/cpu/thread_pool.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 100, 1001}) {
      std::vector<std::atomic<int>> hits(n);
      for (auto& h : hits) h = 0;
      pool.ParallelFor(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[i]++;
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << threads << " " << n;
    }
  }
}

TEST(ThreadPoolTest, ManyConsecutiveJobs) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 500; ++job) {
    pool.ParallelFor(64, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) sum += i;
    });
  }
  EXPECT_EQ(sum.load(), 500 * (63 * 64 / 2));
}

}  // namespace
}  // namespace deepinfer
