// BatchJobStore on a full disk: SQLite's writes refused (SimulatedFullDisk) fail cleanly and
// work again once there is room; a store opens and reads on a full disk; an output file that
// cannot be written (pointed at /dev/full, which answers every write with ENOSPC) lags the
// database and catches up; a second store on the same directory is refused.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "coordinator/batch/batch_job_store.h"
#include "coordinator/batch/simulated_full_disk.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string FreshDir(const std::string& name) {
  std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name);
  std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  return dir;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream b;
  b << in.rdbuf();
  return b.str();
}

// Points `path` at /dev/full; false (the test skips) where there is no /dev/full.
bool PointAtDevFull(const std::string& path) {
  if (access("/dev/full", W_OK) != 0) return false;
  std::remove(path.c_str());
  return symlink("/dev/full", path.c_str()) == 0;
}

constexpr char kInput[] = "{\"a\":1}\n\n{\"b\":2}\n   \n{\"c\":3}\n";

TEST(BatchJobStoreFullDiskTest, WritesFailCleanlyAndWorkOnceThereIsRoom) {
  SimulatedFullDisk disk;
  auto store = BatchJobStore::Open(FreshDir("full"));
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string id = *(*store)->CreateJob("j", kInput, 0);
  ASSERT_TRUE(*(*store)->RecordResult(id, 1, "r1", false));

  disk.set_full(true);
  auto refused = (*store)->RecordResults({{id, 3, "r3", false, 5}, {id, 5, "r5", true, 0}});
  EXPECT_TRUE(absl::IsResourceExhausted(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("sqlite: database or disk is full"));
  EXPECT_TRUE(absl::IsResourceExhausted((*store)->SetJobState(id, Job::RUNNING, "", 0)));
  EXPECT_GT(disk.refused_writes(), 0);
  // Reads work, and nothing of the refused writes shows.
  auto job = (*store)->GetJob(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->completed_requests(), 1);
  EXPECT_EQ(job->failed_requests(), 0);
  EXPECT_EQ(job->generated_tokens(), 0);
  EXPECT_EQ(job->state(), Job::QUEUED);
  EXPECT_EQ((*store)->PendingRequests(id)->size(), 2u);
  EXPECT_THAT(*(*store)->ReadResults(id, 0, 0), ElementsAre("r1"));
  EXPECT_EQ((*store)->ListJobs(10, "")->size(), 1u);

  disk.set_full(false);
  auto recorded = (*store)->RecordResults({{id, 3, "r3", false, 5}, {id, 5, "r5", true, 0}});
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_THAT(*recorded, ElementsAre(true, true));
  ASSERT_TRUE((*store)->SetJobState(id, Job::COMPLETED, "", 9).ok());
  job = (*store)->GetJob(id);
  EXPECT_EQ(job->completed_requests(), 2);
  EXPECT_EQ(job->failed_requests(), 1);
  EXPECT_EQ(job->generated_tokens(), 5);
  EXPECT_EQ(job->state(), Job::COMPLETED);
  EXPECT_EQ(ReadFile((*store)->OutputPath(id)), "r1\nr3\nr5\n");
}

TEST(BatchJobStoreFullDiskTest, OpensAndReadsOnAFullDisk) {
  SimulatedFullDisk disk;
  const std::string dir = FreshDir("open_full");
  std::string id;
  {
    auto store = BatchJobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    id = *(*store)->CreateJob("j", kInput, 0);
    ASSERT_TRUE(*(*store)->RecordResult(id, 3, "r3", false));
  }
  disk.set_full(true);
  auto store = BatchJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  auto unfinished = (*store)->UnfinishedJobs();
  ASSERT_TRUE(unfinished.ok()) << unfinished.status();
  ASSERT_EQ(unfinished->size(), 1u);
  EXPECT_EQ((*unfinished)[0].completed_requests(), 1);
  EXPECT_EQ((*store)->PendingRequests(id)->size(), 2u);
  EXPECT_THAT(*(*store)->ReadResults(id, 0, 0), ElementsAre("r3"));
  // Only what needs room fails.
  EXPECT_TRUE(absl::IsResourceExhausted((*store)->StartLoading(id).status()));
  EXPECT_TRUE(absl::IsResourceExhausted((*store)->CreateJob("k", kInput, 0).status()));
  disk.set_full(false);
  EXPECT_TRUE(*(*store)->RecordResult(id, 5, "r5", false));
  EXPECT_EQ(ReadFile((*store)->OutputPath(id)), "r3\nr5\n");
}

TEST(BatchJobStoreFullDiskTest, OutputFileThatCannotBeWrittenLagsAndCatchesUp) {
  auto store = BatchJobStore::Open(FreshDir("lagging"));
  ASSERT_TRUE(store.ok()) << store.status();
  const std::string id = *(*store)->CreateJob("j", kInput, 0);
  const std::string path = (*store)->OutputPath(id);
  ASSERT_TRUE(*(*store)->RecordResult(id, 1, "r1", false));
  if (!PointAtDevFull(path)) GTEST_SKIP() << "no writable /dev/full here";
  EXPECT_FALSE((*store)->OutputFilesBehind());
  // Stored in the database; the append fails.
  ASSERT_TRUE(*(*store)->RecordResult(id, 3, "r3", false));
  EXPECT_TRUE((*store)->OutputFilesBehind());
  absl::Status caught_up = (*store)->CatchUpOutputFiles();
  EXPECT_TRUE(absl::IsResourceExhausted(caught_up)) << caught_up;
  EXPECT_THAT(std::string(caught_up.message()), HasSubstr(path));
  EXPECT_THAT(*(*store)->ReadResults(id, 0, 0), ElementsAre("r1", "r3"));

  // Room again: the file as an append that failed half-way left it, a partial last line.
  std::remove(path.c_str());
  std::ofstream(path) << "r1\nr";
  ASSERT_TRUE(*(*store)->RecordResult(id, 5, "r5", false));  // not appended: the file lags
  EXPECT_EQ(ReadFile(path), "r1\nr");
  ASSERT_TRUE((*store)->CatchUpOutputFiles().ok());
  EXPECT_FALSE((*store)->OutputFilesBehind());
  EXPECT_EQ(ReadFile(path), "r1\nr3\nr5\n");
}

TEST(BatchJobStoreFullDiskTest, OpenLeavesAnOutputFileItCannotRepairBehind) {
  const std::string dir = FreshDir("repair_later");
  std::string id, path;
  {
    auto store = BatchJobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    id = *(*store)->CreateJob("j", kInput, 0);
    ASSERT_TRUE(*(*store)->RecordResult(id, 5, "r5", false));
    ASSERT_TRUE(*(*store)->RecordResult(id, 1, "r1", false));
    path = (*store)->OutputPath(id);
  }
  if (!PointAtDevFull(path)) GTEST_SKIP() << "no writable /dev/full here";
  auto store = BatchJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_TRUE((*store)->OutputFilesBehind());
  EXPECT_THAT(*(*store)->ReadResults(id, 0, 0), ElementsAre("r5", "r1"));
  // A file with more lines than results is not a prefix of them: rewritten whole.
  std::remove(path.c_str());
  std::ofstream(path) << "x\ny\nz\n";
  ASSERT_TRUE((*store)->CatchUpOutputFiles().ok());
  EXPECT_EQ(ReadFile(path), "r5\nr1\n");
}

TEST(BatchJobStoreFullDiskTest, SecondStoreOnTheSameDirectoryIsRefused) {
  const std::string dir = FreshDir("two_stores");
  auto first = BatchJobStore::Open(dir);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = BatchJobStore::Open(dir);
  ASSERT_FALSE(second.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition(second.status())) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("one coordinator per state"));
}

}  // namespace
}  // namespace deepinfer
