#include "coordinator/batch/batch_job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
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

constexpr char kInput[] = "{\"a\":1}\n\n{\"b\":2}\n   \n{\"c\":3}\n";

TEST(BatchJobStoreTest, CreateJobCountsNonBlankLines) {
  auto store = BatchJobStore::Open(FreshDir("s1"));
  ASSERT_TRUE(store.ok()) << store.status();
  auto id = (*store)->CreateJob("my job", kInput, 1000);
  ASSERT_TRUE(id.ok()) << id.status();
  auto job = (*store)->GetJob(*id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->name(), "my job");
  EXPECT_EQ(job->state(), Job::QUEUED);
  EXPECT_EQ(job->total_requests(), 3);
  EXPECT_EQ(job->created_unix_ms(), 1000);
  auto pending = (*store)->PendingRequests(*id);
  ASSERT_TRUE(pending.ok()) << pending.status();
  ASSERT_EQ(pending->size(), 3u);
  EXPECT_EQ((*pending)[0].line_number, 1);
  EXPECT_EQ((*pending)[1].line_number, 3);
  EXPECT_EQ((*pending)[1].line, "{\"b\":2}");
  EXPECT_EQ((*pending)[2].line_number, 5);
  EXPECT_EQ(ReadFile((*store)->InputPath(*id)), kInput);
}

TEST(BatchJobStoreTest, EmptyInputIsRejected) {
  auto store = BatchJobStore::Open(FreshDir("s2"));
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->CreateJob("x", "\n  \n", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BatchJobStoreTest, ResultsAreRecordedOnceAndAppended) {
  auto store = BatchJobStore::Open(FreshDir("s3"));
  ASSERT_TRUE(store.ok());
  auto id = *(*store)->CreateJob("j", kInput, 0);
  EXPECT_TRUE(*(*store)->RecordResult(id, 3, "out-b", false));
  EXPECT_TRUE(*(*store)->RecordResult(id, 1, "err-a", true));
  // A second result for line 3 (say, from a worker thought lost) changes nothing.
  EXPECT_FALSE(*(*store)->RecordResult(id, 3, "out-b-again", false));
  EXPECT_EQ((*store)->RecordResult(id, 2, "x", false).status().code(),
            absl::StatusCode::kNotFound);  // line 2 is blank: not a request
  EXPECT_EQ((*store)->RecordResult(id, 5, "a\nb", false).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto job = *(*store)->GetJob(id);
  EXPECT_EQ(job.completed_requests(), 1);
  EXPECT_EQ(job.failed_requests(), 1);
  EXPECT_EQ(ReadFile((*store)->OutputPath(id)), "out-b\nerr-a\n");
  EXPECT_THAT(*(*store)->ReadResults(id, 0, 10), ElementsAre("out-b", "err-a"));
  EXPECT_THAT(*(*store)->ReadResults(id, 1, 10), ElementsAre("err-a"));
  EXPECT_THAT(*(*store)->ReadResults(id, 0, 1), ElementsAre("out-b"));
  auto pending = *(*store)->PendingRequests(id);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].line_number, 5);
}

TEST(BatchJobStoreTest, RecordResultsIsAllOrNothing) {
  auto store = BatchJobStore::Open(FreshDir("s6"));
  ASSERT_TRUE(store.ok());
  auto id = *(*store)->CreateJob("j", kInput, 0);
  auto recorded = (*store)->RecordResults(
      {{id, 1, "a", false, 7}, {id, 3, "b", true, 0}, {id, 1, "a-again", false, 7}});
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_THAT(*recorded, ElementsAre(true, true, false));
  EXPECT_EQ((*store)->GetJob(id)->generated_tokens(), 7);
  auto bad = (*store)->RecordResults({{id, 5, "c", false}, {id, 4, "blank line", false}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->PendingRequests(id)->size(), 1u);  // line 5 was not recorded
  EXPECT_EQ(ReadFile((*store)->OutputPath(id)), "a\nb\n");
}

TEST(BatchJobStoreTest, ReopenResumesAndRepairsTheOutputFile) {
  const std::string dir = FreshDir("s4");
  std::string id;
  std::string output_path;
  {
    auto store = BatchJobStore::Open(dir);
    ASSERT_TRUE(store.ok());
    id = *(*store)->CreateJob("j", kInput, 0);
    ASSERT_TRUE((*store)->SetJobState(id, Job::RUNNING, "", 5).ok());
    ASSERT_TRUE(*(*store)->RecordResult(id, 1, "r1", false));
    ASSERT_TRUE(*(*store)->RecordResult(id, 5, "r5", false));
    output_path = (*store)->OutputPath(id);
  }
  // Simulate a crash after the database commit but before the file append.
  std::ofstream(output_path, std::ios::trunc) << "r1\n";
  auto store = BatchJobStore::Open(dir);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(ReadFile(output_path), "r1\nr5\n");
  auto unfinished = *(*store)->UnfinishedJobs();
  ASSERT_EQ(unfinished.size(), 1u);
  EXPECT_EQ(unfinished[0].job_id(), id);
  EXPECT_EQ(unfinished[0].state(), Job::RUNNING);
  auto pending = *(*store)->PendingRequests(id);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].line_number, 3);
  ASSERT_TRUE(*(*store)->RecordResult(id, 3, "r3", false));
  ASSERT_TRUE((*store)->SetJobState(id, Job::COMPLETED, "", 99).ok());
  EXPECT_TRUE((*store)->UnfinishedJobs()->empty());
  EXPECT_EQ((*store)->GetJob(id)->finished_unix_ms(), 99);
  EXPECT_EQ(ReadFile(output_path), "r1\nr5\nr3\n");
}

TEST(BatchJobStoreTest, ListJobsNewestFirstWithPages) {
  auto store = BatchJobStore::Open(FreshDir("s5"));
  ASSERT_TRUE(store.ok());
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) ids.push_back(*(*store)->CreateJob(absl::StrCat("j", i), "x\n", i));
  auto first = *(*store)->ListJobs(2, "");
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(first[0].job_id(), ids[4]);
  EXPECT_EQ(first[1].job_id(), ids[3]);
  auto second = *(*store)->ListJobs(2, first[1].job_id());
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(second[0].job_id(), ids[2]);
  EXPECT_EQ((*store)->ListJobs(2, "job-nope").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*store)->GetJob("job-nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->SetJobState("job-nope", Job::FAILED, "x", 0).code(),
            absl::StatusCode::kNotFound);
}

TEST(BatchJobStoreTest, UnwritableStateDirIsAClearError) {
  auto store = BatchJobStore::Open("/proc/deepinfer-cannot-exist");
  ASSERT_FALSE(store.ok());
  EXPECT_THAT(std::string(store.status().message()), HasSubstr("/proc/deepinfer-cannot-exist"));
}

TEST(BatchJobStoreTest, LoadsThatDidNotFinishAreCountedAcrossReopens) {
  const std::string dir = FreshDir("loads");
  std::string id;
  {
    auto store = BatchJobStore::Open(dir);
    ASSERT_TRUE(store.ok());
    auto created = (*store)->CreateJob("", kInput, 0);
    ASSERT_TRUE(created.ok());
    id = *created;
    // CreateJob counts the load at submission: a coordinator that died there left 1.
    EXPECT_EQ(*(*store)->StartLoading(id), 2);
  }
  auto store = BatchJobStore::Open(dir);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(*(*store)->StartLoading(id), 3);
  ASSERT_TRUE((*store)->FinishedLoading(id).ok());
  EXPECT_EQ(*(*store)->StartLoading(id), 1);
  EXPECT_EQ((*store)->StartLoading("job-none").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->FinishedLoading("job-none").code(), absl::StatusCode::kNotFound);
}

TEST(BatchJobStoreTest, OpensAStateDirectoryWithoutLoadCounts) {
  // The jobs table as it was before loads were counted, with one job in it.
  const std::string dir = FreshDir("old_schema");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/deepinfer.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TABLE jobs(job_id TEXT PRIMARY KEY, name TEXT, state INTEGER, "
                         "total INTEGER, completed INTEGER DEFAULT 0, failed INTEGER DEFAULT 0, "
                         "created_ms INTEGER, finished_ms INTEGER DEFAULT 0, error TEXT DEFAULT "
                         "'', generated_tokens INTEGER DEFAULT 0);"
                         "INSERT INTO jobs(job_id, name, state, total, created_ms) "
                         "VALUES('job-old', '', 1, 1, 0);",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto store = BatchJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(*(*store)->StartLoading("job-old"), 1);
  EXPECT_TRUE((*store)->CreateJob("", kInput, 0).ok());
}

}  // namespace
}  // namespace deepinfer
