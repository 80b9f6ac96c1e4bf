// JobService.UploadJob through a real coordinator on loopback (CoordinatorServer with a
// dummy model, no workers) and the CoordinatorClient: an input in many chunks makes the same
// job as in one message, a retry after a lost answer gets the job the first attempt made, and
// uploads that are cut short, lie about their size or checksum, or have no header make none.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/synchronization/notification.h"
#include "common/hash/sha256.h"
#include "common/rpc/auth.h"
#include "coordinator/client/coordinator_client.h"
#include "coordinator/coordinator_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/job.grpc.pb.h"
#include "proto/validated_request.pb.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream b;
  b << in.rdbuf();
  return b.str();
}

// Good lines, lines that cannot run, blank lines and a duplicate custom id.
std::string MixedInput() {
  std::vector<std::string> lines;
  for (int i = 0; i < 40; ++i) {
    if (i % 9 == 4) {
      lines.push_back(absl::StrCat("{\"custom_id\": \"r", i, "\", \"oops"));
    } else if (i % 9 == 7) {
      lines.push_back("   ");
    } else {
      lines.push_back(absl::StrCat(R"({"custom_id": "r)", i % 31,
                                   R"(", "url": "/v1/completions", "body": {"prompt": [)", i + 1,
                                   ", 2, 3], \"max_tokens\": ", 1 + i % 5, "}}"));
    }
  }
  return absl::StrJoin(lines, "\n") + "\n";
}

class JobUploadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/state-",
                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::system(absl::StrCat("rm -rf '", state_dir_, "'").c_str());
  }

  void Start(std::function<void(const std::string&)> after_stored = nullptr) {
    CoordinatorConfig config;
    config.model = "dummy:tests/fixtures/dsv3_qlora_rope/config.json";
    config.state_dir = state_dir_;
    config.after_job_stored = std::move(after_stored);
    auto server = CoordinatorServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    address_ = absl::StrCat("127.0.0.1:", server_->port());
    client_ = std::make_unique<CoordinatorClient>(
        CoordinatorClientOptions{address_, "", "test", absl::Seconds(30)});
  }

  Job WaitValidated(const std::string& id) {
    Job job;
    for (int i = 0; i < 3000; ++i) {
      job = *client_->GetJob(id);
      if (job.state() != Job::VALIDATING) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_NE(job.state(), Job::VALIDATING);
    return job;
  }

  // The job's output lines with its id taken out, so two jobs' lines compare.
  std::vector<std::string> OutputWithoutId(const std::string& id) {
    std::vector<std::string> lines;
    EXPECT_TRUE(client_
                    ->ReadResults(id,
                                  [&](const std::string& line) {
                                    lines.push_back(absl::StrReplaceAll(line, {{id, "JOB"}}));
                                  })
                    .ok());
    return lines;
  }

  std::unique_ptr<JobService::Stub> Stub() {
    return JobService::NewStub(grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  std::string state_dir_;
  std::unique_ptr<CoordinatorServer> server_;
  std::string address_;
  std::unique_ptr<CoordinatorClient> client_;
};

TEST_F(JobUploadTest, AnInputInManyChunksMakesTheJobOfOneMessage) {
  Start();
  const std::string input = MixedInput();
  // One message (the unary SubmitJob).
  auto channel = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  SubmitJobRequest request;
  request.set_name("whole");
  request.set_input_jsonl(input);
  SubmitJobResponse whole;
  grpc::ClientContext context;
  ASSERT_TRUE(JobService::NewStub(channel)->SubmitJob(&context, request, &whole).ok());
  // Chunks of 7 bytes: lines split across chunks everywhere.
  UploadOptions options;
  options.chunk_bytes = 7;
  options.input_sha256 = [&] {
    Sha256 h;
    h.Update(input);
    return h.Finish();
  }();
  auto chunked = client_->UploadJob("chunked", input, options);
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  EXPECT_FALSE(chunked->existing);
  ASSERT_NE(chunked->job_id, whole.job_id());

  const Job a = WaitValidated(whole.job_id());
  const Job b = WaitValidated(chunked->job_id);
  EXPECT_EQ(a.state(), Job::QUEUED);
  EXPECT_EQ(b.state(), Job::QUEUED);
  EXPECT_EQ(a.total_requests(), 36);  // 40 lines, 4 blank
  EXPECT_EQ(b.total_requests(), a.total_requests());
  EXPECT_EQ(b.validated_requests(), a.validated_requests());
  EXPECT_EQ(a.failed_requests(), 4 + 5);  // the broken lines, and r0..r8 again
  EXPECT_EQ(b.failed_requests(), a.failed_requests());
  EXPECT_EQ(OutputWithoutId(chunked->job_id), OutputWithoutId(whole.job_id()));
  const std::string jobs = state_dir_ + "/jobs/";
  EXPECT_EQ(ReadFile(jobs + chunked->job_id + "/input.jsonl"), input);
  EXPECT_EQ(ReadFile(jobs + whole.job_id() + "/input.jsonl"), input);

  // The requests waiting in the store are the same, but for the seeds derived from the job id.
  server_.reset();
  auto store = BatchJobStore::Open(state_dir_);
  ASSERT_TRUE(store.ok());
  auto requests_of = [&](const std::string& id) {
    std::vector<std::string> out;
    const std::vector<PendingRequest> pending = *(*store)->ReadPendingRequests(id, 0, 1000);
    for (const PendingRequest& p : pending) {
      ValidatedRequest r;
      EXPECT_TRUE(r.ParseFromString(p.request));
      r.mutable_sampling()->clear_seed();
      out.push_back(absl::StrCat(p.line_number, " ", r.ShortDebugString()));
    }
    return out;
  };
  EXPECT_EQ(requests_of(chunked->job_id).size(), 36u - 9u);
  EXPECT_EQ(requests_of(chunked->job_id), requests_of(whole.job_id()));
}

TEST_F(JobUploadTest, ARetryAfterADeadlineGetsTheJobOfTheFirstAttempt) {
  // The first answer is held back until its client gave up.
  absl::Notification client_gave_up;
  bool first = true;
  Start([&](const std::string&) {
    if (first) {
      first = false;
      client_gave_up.WaitForNotification();
    }
  });
  const std::string input = MixedInput();
  UploadOptions options;
  options.idempotency_key = "job-of-tuesday";
  options.chunk_bytes = 100;
  CoordinatorClient impatient({address_, "", "test", absl::Milliseconds(300)});
  auto lost = impatient.UploadJob("retry", input, options);
  ASSERT_EQ(lost.status().code(), absl::StatusCode::kDeadlineExceeded) << lost.status();
  client_gave_up.Notify();

  auto retry = client_->UploadJob("retry", input, options);
  ASSERT_TRUE(retry.ok()) << retry.status();
  EXPECT_TRUE(retry->existing);
  auto list = client_->ListJobs(10, "");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->jobs_size(), 1);  // one job, never a second
  EXPECT_EQ(list->jobs(0).job_id(), retry->job_id);
  EXPECT_EQ(WaitValidated(retry->job_id).total_requests(), 36);

  // With a checksum, the same key for another input is refused.
  options.input_sha256 = [] {
    Sha256 h;
    h.Update("{}\n");
    return h.Finish();
  }();
  auto other = client_->UploadJob("retry", "{}\n", options);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(other.status().message()),
              HasSubstr("idempotency key 'job-of-tuesday' belongs to job " + retry->job_id));
  // Without a key, every upload is a job of its own.
  auto again = client_->UploadJob("retry", input, UploadOptions());
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->job_id, retry->job_id);
  EXPECT_EQ(client_->ListJobs(10, "")->jobs_size(), 2);
}

TEST_F(JobUploadTest, BrokenUploadsMakeNoJob) {
  Start();
  auto upload = [&](const std::vector<JobUploadChunk>& chunks) {
    grpc::ClientContext context;
    SubmitJobResponse response;
    auto writer = Stub()->UploadJob(&context, &response);
    for (const JobUploadChunk& c : chunks) {
      if (!writer->Write(c)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  JobUploadChunk header;
  header.mutable_header()->set_input_bytes(100);
  header.set_data("{\"a\": 1}\n");
  // Cut short: fewer bytes than announced.
  grpc::Status s = upload({header});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("ended after 9 of the 100 bytes"));
  // More than announced.
  header.mutable_header()->set_input_bytes(3);
  s = upload({header});
  EXPECT_THAT(s.error_message(), HasSubstr("more input than the 3 bytes announced"));
  // A checksum that is not the bytes'.
  header.mutable_header()->set_input_bytes(9);
  header.mutable_header()->set_input_sha256(std::string(32, 'x'));
  s = upload({header});
  EXPECT_THAT(s.error_message(), HasSubstr("do not have the SHA-256"));
  // No header; a second header.
  JobUploadChunk data;
  data.set_data("{}\n");
  s = upload({data});
  EXPECT_THAT(s.error_message(), HasSubstr("must carry the header"));
  header.mutable_header()->clear_input_sha256();
  header.mutable_header()->set_input_bytes(12);
  s = upload({header, header});
  EXPECT_THAT(s.error_message(), HasSubstr("only the first message"));
  // Only blank lines.
  header.mutable_header()->set_input_bytes(3);
  header.set_data(" \n\n");
  s = upload({header});
  EXPECT_THAT(s.error_message(), HasSubstr("no request lines"));
  // More than the disk holds.
  header.mutable_header()->set_input_bytes(int64_t{1} << 50);
  s = upload({header});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("does not fit in the free space"));
  // Nothing was made, and nothing is left behind.
  EXPECT_EQ(client_->ListJobs(10, "")->jobs_size(), 0);
  EXPECT_EQ(std::system(absl::StrCat("test -z \"$(ls -A '", state_dir_, "/uploads')\"").c_str()),
            0);
}

TEST_F(JobUploadTest, AKnownKeyIsAnsweredBeforeTheInputIsSent) {
  Start();
  UploadOptions options;
  options.idempotency_key = "k";
  auto first = client_->UploadJob("", MixedInput(), options);
  ASSERT_TRUE(first.ok());
  // A header announcing far more than will ever come: the answer needs none of it.
  grpc::ClientContext context;
  SubmitJobResponse response;
  auto writer = Stub()->UploadJob(&context, &response);
  JobUploadChunk header;
  header.mutable_header()->set_idempotency_key("k");
  header.mutable_header()->set_input_bytes(int64_t{1} << 40);
  writer->Write(header);
  grpc::Status s = writer->Finish();
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.job_id(), first->job_id);
  EXPECT_TRUE(response.existing());
}

}  // namespace
}  // namespace deepinfer
