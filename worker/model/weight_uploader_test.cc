// WeightUploader on made-up jobs: serial and parallel runs give every buffer exactly its job's
// bytes, with shards of different lengths, a staging budget smaller than some jobs (each then
// runs alone) and zero-byte buffers; a job's error is returned and the run stops; with several
// failing jobs the lowest-numbered one's error is returned, whichever fails first.
#include "worker/model/weight_uploader.h"

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

// Byte k of buffer b of job j.
char ByteOf(int j, int b, size_t k) { return static_cast<char>((j * 131 + b * 17 + k * 7) % 251); }

struct Jobs {
  std::vector<std::unique_ptr<DeviceBuffer>> buffers;  // two per job
  std::vector<std::vector<size_t>> sizes;
};

// `n` jobs over 3 shards (the first has most of them), two buffers each, of varied sizes.
void AddJobs(WeightUploader* up, int n, Jobs* jobs) {
  jobs->buffers.resize(2 * n);
  jobs->sizes.resize(n);
  for (int j = 0; j < n; ++j) {
    const size_t a = static_cast<size_t>((j * 977) % 5000),
                 b = static_cast<size_t>(j % 3 == 0 ? 0 : 40000 + j);
    jobs->sizes[j] = {a, b};
    const std::string shard = j % 5 < 3 ? "s0" : absl::StrCat("s", j % 5 - 2);
    up->Add(shard, {a, b}, {&jobs->buffers[2 * j], &jobs->buffers[2 * j + 1]},
            /*scratch_bytes=*/static_cast<int64_t>(a), [j, a, b](const std::vector<char*>& out) {
              for (size_t k = 0; k < a; ++k) out[0][k] = ByteOf(j, 0, k);
              for (size_t k = 0; k < b; ++k) out[1][k] = ByteOf(j, 1, k);
              return absl::OkStatus();
            });
  }
}

void ExpectBytes(Backend& be, const Jobs& jobs) {
  for (size_t j = 0; j < jobs.sizes.size(); ++j) {
    for (int b = 0; b < 2; ++b) {
      const auto& buf = jobs.buffers[2 * j + b];
      ASSERT_NE(buf, nullptr) << j;
      ASSERT_EQ(buf->size_bytes(), jobs.sizes[j][b]);
      std::vector<char> host(buf->size_bytes());
      be.CopyToHost(buf->data(), host.size(), host.data());
      for (size_t k = 0; k < host.size(); ++k) {
        ASSERT_EQ(host[k], ByteOf(static_cast<int>(j), b, k)) << j << " " << b << " " << k;
      }
    }
  }
}

TEST(WeightUploaderTest, SerialAndParallelRunsGiveEveryJobItsBytes) {
  CpuBackend be(1);
  for (int threads : {1, 2, 5}) {
    for (int64_t budget : {int64_t{1} << 30, int64_t{30000}}) {
      SCOPED_TRACE(absl::StrCat(threads, " threads, budget ", budget));
      WeightUploader up(&be, {threads, budget});
      Jobs jobs;
      AddJobs(&up, 60, &jobs);
      int64_t expected = 0;
      for (const auto& s : jobs.sizes) expected += static_cast<int64_t>(s[0] + s[1]);
      EXPECT_EQ(up.bytes(), expected);
      EXPECT_EQ(up.jobs(), 60);
      ASSERT_TRUE(up.Run().ok());
      ExpectBytes(be, jobs);
    }
  }
}

TEST(WeightUploaderTest, AJobsErrorStopsTheRun) {
  CpuBackend be(1);
  for (int threads : {1, 3}) {
    WeightUploader up(&be, {threads, 1 << 20});
    std::vector<std::unique_ptr<DeviceBuffer>> out(40);
    std::atomic<int> produced{0};
    for (int j = 0; j < 40; ++j) {
      up.Add(absl::StrCat("s", j % 2), {16}, {&out[j]}, 0,
             [j, &produced](const std::vector<char*>& dst) -> absl::Status {
               if (j == 7) return absl::DataLossError("shard 1: tensor 7 is truncated");
               std::memset(dst[0], 1, 16);
               ++produced;
               return absl::OkStatus();
             });
    }
    const absl::Status st = up.Run();
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss) << threads;
    EXPECT_EQ(st.message(), "shard 1: tensor 7 is truncated");
    EXPECT_EQ(out[7], nullptr);
    if (threads == 1) {
      EXPECT_EQ(produced.load(), 7);  // jobs 0..6 before it
    }
  }
}

TEST(WeightUploaderTest, TheLowestNumberedFailingJobsErrorIsReturned) {
  CpuBackend be(1);
  for (int threads : {2, 4}) {
    SCOPED_TRACE(absl::StrCat(threads, " threads"));
    WeightUploader up(&be, {threads, 1 << 20});
    std::vector<std::unique_ptr<DeviceBuffer>> out(40);
    // Shard s0 holds the even jobs, s1 the odd ones, and each has a thread starting on it. Job 4
    // and job 30
    // fail only once job 9 (another thread's) has failed, so job 9's error comes first.
    absl::Notification nine_failed;
    for (int j = 0; j < 40; ++j) {
      up.Add(absl::StrCat("s", j % 2), {16}, {&out[j]}, 0,
             [j, &nine_failed](const std::vector<char*>& dst) -> absl::Status {
               if (j == 4) {
                 nine_failed.WaitForNotification();
                 return absl::DataLossError("tensor 4 is truncated");
               }
               if (j == 9) {
                 nine_failed.Notify();
                 return absl::DataLossError("tensor 9 is truncated");
               }
               if (j == 30) {
                 nine_failed.WaitForNotification();
                 return absl::NotFoundError("tensor 30 is missing");
               }
               std::memset(dst[0], 1, 16);
               return absl::OkStatus();
             });
    }
    const absl::Status st = up.Run();
    EXPECT_EQ(st.code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(st.message(), "tensor 4 is truncated");
  }
}

}  // namespace
}  // namespace deepinfer
