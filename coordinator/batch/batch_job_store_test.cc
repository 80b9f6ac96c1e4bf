#include "coordinator/batch/batch_job_store.h"

#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

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

bool Exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// Request lines 1, 3 and 5.
constexpr char kInput[] = "{\"a\":1}\n\n{\"b\":2}\n   \n{\"c\":3}\n";

StagedInput Stage(BatchJobStore& store, const std::string& input) {
  auto upload = JobInputUpload::Create(store.NewStagingPath(), -1);
  EXPECT_TRUE(upload.ok()) << upload.status();
  EXPECT_TRUE((*upload)->Append(input).ok());
  auto staged = (*upload)->Finish("");
  EXPECT_TRUE(staged.ok()) << staged.status();
  return *staged;
}

ValidatedLine Request(int64_t line, const std::string& request, int64_t reserved = 0) {
  ValidatedLine v;
  v.line_number = line;
  v.request = request;
  v.reserved_tokens = reserved;
  return v;
}

ValidatedLine Error(int64_t line, const std::string& error_line) {
  ValidatedLine v;
  v.line_number = line;
  v.error_line = error_line;
  return v;
}

// A job of kInput whose three lines are validated requests "req-1", "req-3", "req-5".
std::string ValidatedJob(BatchJobStore& store) {
  auto id = store.CreateJob("j", kInput, 0);
  EXPECT_TRUE(id.ok()) << id.status();
  EXPECT_TRUE(store
                  .CommitValidated(
                      *id,
                      {Request(1, "req-1", 10), Request(3, "req-3", 20), Request(5, "req-5", 30)},
                      {static_cast<int64_t>(sizeof(kInput) - 1), 6, 3})
                  .ok());
  EXPECT_TRUE(store.FinishValidation(*id).ok());
  return *id;
}

TEST(BatchJobStoreTest, CreateJobStoresTheInputAndCountsRequestLines) {
  auto store = BatchJobStore::Open(FreshDir("s1"));
  ASSERT_TRUE(store.ok()) << store.status();
  const StagedInput staged = Stage(**store, kInput);
  auto created = (*store)->CreateJob("my job", "", staged, 1000);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_FALSE(created->existing);
  auto job = (*store)->GetJob(created->job_id);
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->name(), "my job");
  EXPECT_EQ(job->state(), Job::VALIDATING);
  EXPECT_EQ(job->total_requests(), 3);
  EXPECT_EQ(job->validated_requests(), 0);
  EXPECT_EQ(job->created_unix_ms(), 1000);
  EXPECT_EQ(ReadFile((*store)->InputPath(created->job_id)), kInput);
  EXPECT_FALSE(Exists(staged.path));  // moved into the job's directory
  auto cursor = (*store)->GetValidationCursor(created->job_id);
  ASSERT_TRUE(cursor.ok());
  EXPECT_EQ(cursor->offset, 0);
  EXPECT_EQ(cursor->next_line, 1);
  EXPECT_EQ(cursor->validated, 0);
  // Nothing is pending before validation.
  EXPECT_TRUE((*store)->ReadPendingRequests(created->job_id, 0, 10)->empty());
}

TEST(BatchJobStoreTest, EmptyInputIsRejected) {
  auto store = BatchJobStore::Open(FreshDir("s2"));
  ASSERT_TRUE(store.ok());
  EXPECT_EQ((*store)->CreateJob("x", "\n  \n", 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  const StagedInput staged = Stage(**store, " \n");
  EXPECT_EQ((*store)->CreateJob("x", "key", staged, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(Exists(staged.path));
  EXPECT_TRUE((*store)->ListJobs(10, "")->empty());
}

TEST(BatchJobStoreTest, AnIdempotencyKeyMakesOneJob) {
  auto store = BatchJobStore::Open(FreshDir("keys"));
  ASSERT_TRUE(store.ok());
  auto first = (*store)->CreateJob("j", "key-1", Stage(**store, kInput), 0);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->existing);
  // The same upload again (a retry): the same job, and the second copy is gone.
  const StagedInput again = Stage(**store, kInput);
  auto second = (*store)->CreateJob("j", "key-1", again, 5);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->existing);
  EXPECT_EQ(second->job_id, first->job_id);
  EXPECT_FALSE(Exists(again.path));
  // Another input under the same key is refused.
  auto other = (*store)->CreateJob("j", "key-1", Stage(**store, "{\"z\":1}\n"), 0);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr("belongs to job " + first->job_id + ", whose input was different"));
  // No key: a new job every time.
  auto keyless = (*store)->CreateJob("j", "", Stage(**store, kInput), 0);
  ASSERT_TRUE(keyless.ok());
  EXPECT_NE(keyless->job_id, first->job_id);
  EXPECT_EQ((*store)->ListJobs(10, "")->size(), 2u);

  auto found = (*store)->FindJobByIdempotencyKey("key-1");
  ASSERT_TRUE(found.ok() && found->has_value());
  EXPECT_EQ((*found)->job_id, first->job_id);
  EXPECT_EQ((*found)->input_sha256.size(), 32u);
  EXPECT_FALSE((*store)->FindJobByIdempotencyKey("key-2")->has_value());
}

TEST(BatchJobStoreTest, ValidationCommitsChunksThatSurviveAReopen) {
  const std::string dir = FreshDir("validation");
  std::string id;
  {
    auto store = BatchJobStore::Open(dir);
    ASSERT_TRUE(store.ok());
    id = *(*store)->CreateJob("j", kInput, 0);
    // Lines 1 and 3: a request and an error line.
    ASSERT_TRUE((*store)
                    ->CommitValidated(id, {Request(1, "req-1", 10), Error(3, "err-3")}, {16, 4, 2})
                    .ok());
    Job job = *(*store)->GetJob(id);
    EXPECT_EQ(job.state(), Job::VALIDATING);
    EXPECT_EQ(job.validated_requests(), 2);
    EXPECT_EQ(job.failed_requests(), 1);
    EXPECT_EQ(ReadFile((*store)->OutputPath(id)), "err-3\n");
  }
  auto store = BatchJobStore::Open(dir);
  ASSERT_TRUE(store.ok());
  auto cursor = *(*store)->GetValidationCursor(id);
  EXPECT_EQ(cursor.offset, 16);
  EXPECT_EQ(cursor.next_line, 4);
  EXPECT_EQ(cursor.validated, 2);
  // The same chunk committed again (a coordinator that died before it knew the commit
  // happened validates it again): nothing doubles.
  ASSERT_TRUE(
      (*store)->CommitValidated(id, {Request(1, "req-1", 10), Error(3, "err-3")}, {16, 4, 2}).ok());
  EXPECT_EQ((*store)->GetJob(id)->failed_requests(), 1);
  EXPECT_EQ(ReadFile((*store)->OutputPath(id)), "err-3\n");
  ASSERT_TRUE((*store)->CommitValidated(id, {Request(5, "req-5", 30)}, {29, 6, 3}).ok());
  ASSERT_TRUE((*store)->FinishValidation(id).ok());
  Job job = *(*store)->GetJob(id);
  EXPECT_EQ(job.state(), Job::QUEUED);
  EXPECT_EQ(job.validated_requests(), 3);

  auto pending = *(*store)->ReadPendingRequests(id, 0, 10);
  ASSERT_EQ(pending.size(), 2u);
  EXPECT_EQ(pending[0].line_number, 1);
  EXPECT_EQ(pending[0].request, "req-1");
  EXPECT_EQ(pending[1].line_number, 5);
  EXPECT_EQ((*store)->ReadPendingRequests(id, 1, 10)->size(), 1u);
  EXPECT_EQ((*store)->ReadPendingRequests(id, 0, 1)->size(), 1u);
  EXPECT_EQ(*(*store)->ReservedTokensLeft(id), 40);
  ASSERT_TRUE(*(*store)->RecordResult(id, 1, "out-1", false));
  EXPECT_EQ(*(*store)->ReservedTokensLeft(id), 30);
  EXPECT_FALSE((*store)->ReadPendingRequest(id, 1)->has_value());  // it has its result
  EXPECT_FALSE((*store)->ReadPendingRequest(id, 3)->has_value());  // an error line
  EXPECT_EQ(**(*store)->ReadPendingRequest(id, 5), "req-5");
  pending = *(*store)->ReadPendingRequests(id, 0, 10);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].line_number, 5);
}

TEST(BatchJobStoreTest, TheFirstLineWithACustomIdOwnsIt) {
  auto store = BatchJobStore::Open(FreshDir("claims"));
  ASSERT_TRUE(store.ok());
  const std::string id = *(*store)->CreateJob("j", kInput, 0);
  EXPECT_THAT(*(*store)->ClaimCustomIds(id, {{1, "a"}, {3, "b"}, {5, "a"}}), ElementsAre(1, 3, 1));
  // Claimed again by the same lines (validation repeated after a restart): still theirs.
  EXPECT_THAT(*(*store)->ClaimCustomIds(id, {{3, "b"}, {7, "c"}}), ElementsAre(3, 7));
  // Ids are per job.
  const std::string other = *(*store)->CreateJob("k", kInput, 0);
  EXPECT_THAT(*(*store)->ClaimCustomIds(other, {{2, "a"}}), ElementsAre(2));
}

TEST(BatchJobStoreTest, ResultsAreRecordedOnceAndAppended) {
  auto store = BatchJobStore::Open(FreshDir("s3"));
  ASSERT_TRUE(store.ok());
  const std::string id = ValidatedJob(**store);
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
  auto pending = *(*store)->ReadPendingRequests(id, 0, 10);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].line_number, 5);
}

TEST(BatchJobStoreTest, RecordResultsIsAllOrNothing) {
  auto store = BatchJobStore::Open(FreshDir("s6"));
  ASSERT_TRUE(store.ok());
  const std::string id = ValidatedJob(**store);
  auto recorded = (*store)->RecordResults(
      {{id, 1, "a", false, 7}, {id, 3, "b", true, 0}, {id, 1, "a-again", false, 7}});
  ASSERT_TRUE(recorded.ok()) << recorded.status();
  EXPECT_THAT(*recorded, ElementsAre(true, true, false));
  EXPECT_EQ((*store)->GetJob(id)->generated_tokens(), 7);
  auto bad = (*store)->RecordResults({{id, 5, "c", false}, {id, 4, "blank line", false}});
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*store)->ReadPendingRequests(id, 0, 10)->size(), 1u);  // line 5 was not recorded
  EXPECT_EQ(ReadFile((*store)->OutputPath(id)), "a\nb\n");
}

TEST(BatchJobStoreTest, ReopenResumesAndRepairsTheOutputFile) {
  const std::string dir = FreshDir("s4");
  std::string id;
  std::string output_path;
  {
    auto store = BatchJobStore::Open(dir);
    ASSERT_TRUE(store.ok());
    id = ValidatedJob(**store);
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
  auto pending = *(*store)->ReadPendingRequests(id, 0, 10);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].line_number, 3);
  ASSERT_TRUE(*(*store)->RecordResult(id, 3, "r3", false));
  ASSERT_TRUE((*store)->SetJobState(id, Job::COMPLETED, "", 99).ok());
  EXPECT_TRUE((*store)->UnfinishedJobs()->empty());
  EXPECT_EQ((*store)->GetJob(id)->finished_unix_ms(), 99);
  EXPECT_EQ(ReadFile(output_path), "r1\nr5\nr3\n");
}

TEST(BatchJobStoreTest, UploadsWithoutAJobAreRemovedAtOpen) {
  const std::string dir = FreshDir("stale_uploads");
  std::string stale;
  {
    auto store = BatchJobStore::Open(dir);
    ASSERT_TRUE(store.ok());
    stale = (*store)->NewStagingPath();
    std::ofstream(stale) << "half an upload";
  }
  ASSERT_TRUE(Exists(stale));
  ASSERT_TRUE(BatchJobStore::Open(dir).ok());
  EXPECT_FALSE(Exists(stale));
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

TEST(BatchJobStoreTest, ValidationRunsWithoutProgressAreCountedAcrossReopens) {
  const std::string dir = FreshDir("loads");
  std::string id;
  {
    auto store = BatchJobStore::Open(dir);
    ASSERT_TRUE(store.ok());
    auto created = (*store)->CreateJob("", kInput, 0);
    ASSERT_TRUE(created.ok());
    id = *created;
    EXPECT_EQ(*(*store)->StartLoading(id), 1);
  }
  auto store = BatchJobStore::Open(dir);
  ASSERT_TRUE(store.ok());
  EXPECT_EQ(*(*store)->StartLoading(id), 2);
  // A committed chunk is progress: the runs before it did not die on what comes next.
  ASSERT_TRUE((*store)->CommitValidated(id, {Request(1, "req-1")}, {8, 2, 1}).ok());
  EXPECT_EQ(*(*store)->StartLoading(id), 2);
  ASSERT_TRUE((*store)->FinishValidation(id).ok());
  EXPECT_EQ(*(*store)->StartLoading(id), 1);
  EXPECT_EQ((*store)->StartLoading("job-none").status().code(), absl::StatusCode::kNotFound);
}

TEST(BatchJobStoreTest, UnfinishedJobsOfAnOldStateDirectoryAreValidatedAgain) {
  // The tables as they were before validated requests were stored: a QUEUED job whose line 1
  // has its result and line 3 waits, and a COMPLETED one.
  const std::string dir = FreshDir("old_schema");
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((dir + "/deepinfer.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db,
                         "CREATE TABLE jobs(job_id TEXT PRIMARY KEY, name TEXT, state INTEGER, "
                         "total INTEGER, completed INTEGER DEFAULT 0, failed INTEGER DEFAULT 0, "
                         "created_ms INTEGER, finished_ms INTEGER DEFAULT 0, error TEXT DEFAULT "
                         "'', generated_tokens INTEGER DEFAULT 0);"
                         "CREATE TABLE requests(job_id TEXT, line_number INTEGER, "
                         "result_seq INTEGER, failed INTEGER DEFAULT 0, output TEXT, "
                         "PRIMARY KEY(job_id, line_number));"
                         "INSERT INTO jobs(job_id, name, state, total, completed, created_ms) "
                         "VALUES('job-old', '', 1, 2, 1, 0);"
                         "INSERT INTO jobs(job_id, name, state, total, completed, created_ms) "
                         "VALUES('job-done', '', 3, 1, 1, 0);"
                         "INSERT INTO requests VALUES('job-old', 1, 1, 0, 'out-1');"
                         "INSERT INTO requests VALUES('job-old', 3, NULL, 0, NULL);",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  for (const char* job : {"job-old", "job-done"}) {
    const std::string job_dir = absl::StrCat(dir, "/jobs/", job);
    ASSERT_EQ(std::system(absl::StrCat("mkdir -p '", job_dir, "'").c_str()), 0);
    std::ofstream(job_dir + "/input.jsonl") << kInput;
    std::ofstream(job_dir + "/output.jsonl") << "out-1\n";
  }
  auto store = BatchJobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  Job old = *(*store)->GetJob("job-old");
  EXPECT_EQ(old.state(), Job::VALIDATING);
  EXPECT_EQ(old.completed_requests(), 1);
  EXPECT_EQ((*store)->GetJob("job-done")->state(), Job::COMPLETED);
  EXPECT_EQ((*store)->GetJob("job-done")->validated_requests(), 1);
  auto cursor = *(*store)->GetValidationCursor("job-old");
  EXPECT_EQ(cursor.offset, 0);
  EXPECT_EQ(cursor.next_line, 1);
  EXPECT_EQ(*(*store)->StartLoading("job-old"), 1);
  // Validated again: line 1 keeps its result, line 3 gets its request.
  ASSERT_TRUE(
      (*store)
          ->CommitValidated("job-old", {Request(1, "req-1"), Request(3, "req-3")}, {20, 4, 2})
          .ok());
  auto pending = *(*store)->ReadPendingRequests("job-old", 0, 10);
  ASSERT_EQ(pending.size(), 1u);
  EXPECT_EQ(pending[0].line_number, 3);
  EXPECT_TRUE((*store)->CreateJob("", kInput, 0).ok());
}

}  // namespace
}  // namespace deepinfer
