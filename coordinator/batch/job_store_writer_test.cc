// JobStoreWriter over a store whose SQLite writes fail as on a full disk (SimulatedFullDisk):
// refused writes are held in order and stored once there is room, retries back off, held
// results past the limit refuse more, a cancelled job's held writes are dropped, lagging
// output files are caught up.
#include "coordinator/batch/job_store_writer.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "coordinator/batch/simulated_full_disk.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kInput[] = "a\nb\nc\n";

class JobStoreWriterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir =
        absl::StrCat(std::getenv("TEST_TMPDIR"), "/",
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
    store_ = std::move(*BatchJobStore::Open(dir));
    job_ = *store_->CreateJob("j", kInput, 0);
  }

  JobStoreWriter::Batch Results(const std::string& job, std::vector<int64_t> lines) {
    JobStoreWriter::Batch batch;
    for (int64_t line : lines) {
      batch.results.push_back({job, line, absl::StrCat("out-", line), false, 1});
      batch.request_ids.push_back(absl::StrCat(job, ":", line));
    }
    return batch;
  }

  std::vector<std::string> Stored(const std::string& job) {
    return *store_->ReadResults(job, 0, 0);
  }

  SimulatedFullDisk disk_;
  std::unique_ptr<BatchJobStore> store_;
  std::string job_;
  const absl::Time t0_ = absl::UnixEpoch() + absl::Hours(1);
};

TEST_F(JobStoreWriterTest, StoresAtOnceWhenThereIsRoom) {
  JobStoreWriter writer(store_.get(), {});
  auto written = writer.WriteResults(Results(job_, {2, 1}), t0_);
  ASSERT_TRUE(written.has_value());
  EXPECT_THAT(written->recorded, ElementsAre(true, true));
  EXPECT_THAT(written->batch.request_ids, ElementsAre(job_ + ":2", job_ + ":1"));
  written = writer.WriteResults(Results(job_, {1}), t0_);  // a resend
  ASSERT_TRUE(written.has_value());
  EXPECT_THAT(written->recorded, ElementsAre(false));
  EXPECT_FALSE(writer.holding());
  EXPECT_EQ(writer.stalled_reason(), "");
  EXPECT_EQ(writer.storage_error(), "");
  EXPECT_THAT(Stored(job_), ElementsAre("out-2", "out-1"));
}

TEST_F(JobStoreWriterTest, HoldsRefusedWritesInOrderAndStoresThemOnceThereIsRoom) {
  JobStoreWriter writer(store_.get(), {int64_t{1} << 20, absl::Seconds(1), absl::Seconds(3)});
  disk_.set_full(true);
  EXPECT_FALSE(writer.WriteResults(Results(job_, {3}), t0_).has_value());
  EXPECT_TRUE(writer.holding());
  EXPECT_THAT(writer.stalled_reason(), HasSubstr("sqlite: database or disk is full"));
  EXPECT_THAT(writer.storage_error(), HasSubstr("1 result(s) held in memory"));
  // Later writes wait behind it without trying the store.
  const int64_t refused = disk_.refused_writes();
  EXPECT_FALSE(writer.WriteResults(Results(job_, {1, 2}), t0_).has_value());
  writer.SetJobState(job_, Job::COMPLETED, "", t0_);
  EXPECT_EQ(disk_.refused_writes(), refused);
  EXPECT_EQ(writer.held_results(), 3);
  Job job = *store_->GetJob(job_);
  writer.ApplyHeldState(&job);
  EXPECT_EQ(job.state(), Job::COMPLETED);

  // Retries: after 1 s, then 2 s, then 3 s (the longest), while the disk stays full.
  EXPECT_TRUE(writer.Retry(t0_ + absl::Milliseconds(999)).empty());
  EXPECT_EQ(disk_.refused_writes(), refused);
  EXPECT_TRUE(writer.Retry(t0_ + absl::Seconds(1)).empty());
  const int64_t refused_once = disk_.refused_writes();
  EXPECT_GT(refused_once, refused);
  EXPECT_TRUE(writer.Retry(t0_ + absl::Milliseconds(2999)).empty());
  EXPECT_EQ(disk_.refused_writes(), refused_once);
  EXPECT_TRUE(writer.Retry(t0_ + absl::Seconds(3)).empty());
  EXPECT_GT(disk_.refused_writes(), refused_once);
  EXPECT_TRUE(writer.Retry(t0_ + absl::Seconds(6)).empty());
  const int64_t refused_thrice = disk_.refused_writes();
  EXPECT_TRUE(writer.Retry(t0_ + absl::Milliseconds(8999)).empty());
  EXPECT_EQ(disk_.refused_writes(), refused_thrice);
  EXPECT_EQ(store_->GetJob(job_)->state(), Job::QUEUED);

  disk_.set_full(false);
  std::vector<JobStoreWriter::Written> written = writer.Retry(t0_ + absl::Seconds(9));
  ASSERT_EQ(written.size(), 2u);
  EXPECT_THAT(written[0].batch.request_ids, ElementsAre(job_ + ":3"));
  EXPECT_THAT(written[1].recorded, ElementsAre(true, true));
  EXPECT_FALSE(writer.holding());
  EXPECT_EQ(writer.stalled_reason(), "");
  EXPECT_EQ(writer.storage_error(), "");
  EXPECT_THAT(Stored(job_), ElementsAre("out-3", "out-1", "out-2"));
  EXPECT_EQ(store_->GetJob(job_)->state(), Job::COMPLETED);
  // Nothing held: the next write goes to the store at once.
  disk_.set_full(true);
  writer.SetJobState(job_, Job::FAILED, "x", t0_ + absl::Seconds(9));
  EXPECT_GT(disk_.refused_writes(), refused_thrice);
  EXPECT_TRUE(writer.holding());
}

TEST_F(JobStoreWriterTest, RefusesResultsOnceTheHeldOnesReachTheLimit) {
  JobStoreWriter writer(store_.get(), {10, absl::Seconds(1), absl::Seconds(1)});
  disk_.set_full(true);
  EXPECT_TRUE(writer.RoomForResults().ok());
  EXPECT_FALSE(writer.WriteResults(Results(job_, {1, 2}), t0_).has_value());  // 10 bytes
  absl::Status room = writer.RoomForResults();
  EXPECT_TRUE(absl::IsResourceExhausted(room)) << room;
  EXPECT_THAT(std::string(room.message()), HasSubstr("database or disk is full"));
  EXPECT_THAT(writer.storage_error(), HasSubstr("at the limit"));
  disk_.set_full(false);
  EXPECT_EQ(writer.Retry(t0_ + absl::Seconds(1)).size(), 1u);
  EXPECT_TRUE(writer.RoomForResults().ok());
}

TEST_F(JobStoreWriterTest, DropJobForgetsItsHeldWrites) {
  const std::string other = *store_->CreateJob("k", kInput, 0);
  JobStoreWriter writer(store_.get(), {int64_t{1} << 20, absl::Seconds(1), absl::Seconds(1)});
  disk_.set_full(true);
  JobStoreWriter::Batch mixed = Results(job_, {1});
  JobStoreWriter::Batch theirs = Results(other, {2});
  mixed.results.push_back(theirs.results[0]);
  EXPECT_FALSE(writer.WriteResults(mixed, t0_).has_value());
  EXPECT_FALSE(writer.WriteResults(Results(job_, {3}), t0_).has_value());
  writer.SetJobState(job_, Job::RUNNING, "", t0_);
  writer.DropJob(job_);
  EXPECT_EQ(writer.held_results(), 1);
  disk_.set_full(false);
  ASSERT_EQ(writer.Retry(t0_ + absl::Seconds(1)).size(), 1u);
  EXPECT_TRUE(Stored(job_).empty());
  EXPECT_EQ(store_->GetJob(job_)->state(), Job::QUEUED);
  EXPECT_THAT(Stored(other), ElementsAre("out-2"));
  writer.DropJob(other);  // nothing held: nothing changes
  EXPECT_FALSE(writer.holding());
}

TEST_F(JobStoreWriterTest, RetryCatchesUpLaggingOutputFiles) {
  const std::string path = store_->OutputPath(job_);
  if (access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full here";
  ASSERT_EQ(std::remove(path.c_str()), 0);
  ASSERT_EQ(symlink("/dev/full", path.c_str()), 0);
  JobStoreWriter writer(store_.get(), {int64_t{1} << 20, absl::Seconds(1), absl::Seconds(1)});
  ASSERT_TRUE(writer.WriteResults(Results(job_, {1}), t0_).has_value());  // in the database
  EXPECT_TRUE(writer.Retry(t0_).empty());                                 // the catch-up fails
  EXPECT_FALSE(writer.holding());
  EXPECT_EQ(writer.stalled_reason(), "");
  EXPECT_THAT(writer.storage_error(), HasSubstr("output files lag the database"));
  ASSERT_EQ(std::remove(path.c_str()), 0);
  writer.Retry(t0_ + absl::Milliseconds(999));  // not due yet
  EXPECT_TRUE(store_->OutputFilesBehind());
  writer.Retry(t0_ + absl::Seconds(1));
  EXPECT_FALSE(store_->OutputFilesBehind());
  EXPECT_EQ(writer.storage_error(), "");
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_EQ(text.str(), "out-1\n");
}

}  // namespace
}  // namespace deepinfer
