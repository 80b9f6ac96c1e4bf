// Jobs from submission to their queue, through real processes: a coordinator (and, where
// requests run, a worker) on the HF-made fixture tests/fixtures/dsv3_qlora_rope, CPU backend.
//   * `deepinfer submit` run twice with the same file gets the same job (the default
//     idempotency key), and the job shows VALIDATING, then QUEUED;
//   * a coordinator SIGKILLed while it validates a job goes on from the last committed chunk
//     after its restart (every line answered exactly once); a job whose input file is gone by
//     then is FAILED with the reason, and a job behind them runs;
//   * the coordinator's memory does not grow with the input: after a 60 MB job, a 120 MB one
//     raises its peak resident memory by far less than its size.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/batch_jobs.h"
#include "tests/testing/subprocess.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::MakeCompletionJob;
using ::deepinfer::testing::RunCommand;
using ::deepinfer::testing::Runfile;
using ::deepinfer::testing::Subprocess;
using ::deepinfer::testing::TempPath;
using ::deepinfer::testing::WaitForPortFile;
using ::testing::HasSubstr;
using json = nlohmann::json;

const char kModel[] = "tests/fixtures/dsv3_qlora_rope";  // vocabulary of 1000

bool IsFinal(const Job& job) {
  return job.state() == Job::COMPLETED || job.state() == Job::FAILED ||
         job.state() == Job::CANCELLED;
}

// `lines` completion lines "b0"...; every `every`-th runs (2 tokens), the others name a token
// outside the vocabulary and get error lines, so that a long input runs quickly.
std::string BigJob(int lines, int every) {
  std::string out;
  for (int i = 0; i < lines; ++i) {
    absl::StrAppend(&out, R"({"custom_id": "b)", i, R"(", "method": "POST", )",
                    R"("url": "/v1/completions", "body": {"prompt": [)",
                    i % every == 0 ? 2 + i % 900 : 1000 + i, R"(, 7, 9], "max_tokens": 2}})", "\n");
  }
  return out;
}

// A field of /proc/PID/status, in kB (VmRSS, VmHWM).
int64_t ProcStatusKb(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, field + ":")) continue;
    std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
    int64_t kb = 0;
    if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) return kb;
  }
  return -1;
}

class JobIntakeTest : public ::testing::Test {
 protected:
  void StartCoordinator(int port = 0) {
    const std::string port_file = TempPath(absl::StrCat(name_, ".port.", ++starts_));
    auto p = Subprocess::Start(
        {Runfile("coordinator/deepinfer-coordinator"), absl::StrCat("--listen=127.0.0.1:", port),
         "--port-file=" + port_file, std::string("--model=") + kModel,
         "--state-dir=" + TempPath(name_ + ".state"), "--heartbeat-interval-ms=200",
         "--heartbeat-timeout-ms=2000"},
        TempPath(absl::StrCat(name_, ".coordinator.", starts_)));
    ASSERT_TRUE(p.ok()) << p.status();
    coordinator_.emplace(std::move(*p));
    port_ = WaitForPortFile(port_file, absl::Seconds(60));
    ASSERT_GT(port_, 0) << coordinator_->ReadStderr();
    client_.emplace(
        CoordinatorClientOptions{absl::StrCat("127.0.0.1:", port_), "", "test", absl::Seconds(60)});
  }

  void StartWorker() {
    auto p = Subprocess::Start(
        {Runfile("worker/deepinfer-worker"), absl::StrCat("--coordinator=127.0.0.1:", port_),
         std::string("--model=") + kModel, "--worker-id=w0", "--threads=1"},
        TempPath(absl::StrCat(name_, ".worker.", ++starts_)));
    ASSERT_TRUE(p.ok()) << p.status();
    worker_.emplace(std::move(*p));
  }

  Job WaitForJob(const std::string& id, const std::function<bool(const Job&)>& done) {
    return testing::WaitForJob(*client_, id, done, [&] {
      return "coordinator:\n" + coordinator_->ReadStderr().substr(0, 20000);
    });
  }

  const std::string name_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  int starts_ = 0;
  int port_ = 0;
  std::optional<Subprocess> coordinator_;
  std::optional<Subprocess> worker_;
  std::optional<CoordinatorClient> client_;
};

TEST_F(JobIntakeTest, SubmittingTheSameFileAgainGetsTheSameJob) {
  StartCoordinator();
  const std::string input = TempPath(name_ + ".in.jsonl");
  std::ofstream(input) << MakeCompletionJob(50, 4, 3);
  auto submit = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {Runfile("coordinator/cli/deepinfer"), "submit",
                                     "--input=" + input, "--name=twice",
                                     absl::StrCat("--coordinator=127.0.0.1:", port_)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto result = RunCommand(argv, TempPath(absl::StrCat(name_, ".submit.", ++starts_)));
    EXPECT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->exit_code, 0) << result->err;
    return *result;
  };
  const testing::CommandResult first = submit({});
  const testing::CommandResult second = submit({});
  const std::string id(absl::StripAsciiWhitespace(first.out));
  ASSERT_FALSE(id.empty());
  EXPECT_EQ(absl::StripAsciiWhitespace(second.out), id);
  EXPECT_EQ(first.err, "");
  EXPECT_THAT(second.err, HasSubstr("job " + id + " was made by an earlier submit"));
  EXPECT_THAT(second.err, HasSubstr("no new job was made"));
  // Another key: another job.
  const testing::CommandResult third = submit({"--idempotency-key=second run"});
  EXPECT_NE(absl::StripAsciiWhitespace(third.out), id);
  EXPECT_EQ(client_->ListJobs(10, "")->jobs_size(), 2);

  Job job = WaitForJob(id, [](const Job& j) { return j.state() != Job::VALIDATING; });
  EXPECT_EQ(job.state(), Job::QUEUED);
  EXPECT_EQ(job.validated_requests(), 50);
  auto status = RunCommand({Runfile("coordinator/cli/deepinfer"), "status", id,
                            absl::StrCat("--coordinator=127.0.0.1:", port_)},
                           TempPath(name_ + ".status"));
  ASSERT_TRUE(status.ok());
  EXPECT_THAT(status->out, HasSubstr(id + "  QUEUED"));
}

TEST_F(JobIntakeTest, AKilledCoordinatorGoesOnValidatingAfterItsRestart) {
  constexpr int kLines = 60000;
  constexpr int kEvery = 2000;  // 30 lines run
  StartCoordinator();
  const std::string big = BigJob(kLines, kEvery);
  auto resumed = client_->SubmitJob("resumed", big);
  auto gone = client_->SubmitJob("gone", big);
  auto small = client_->SubmitJob("small", MakeCompletionJob(5, 3, 9));
  ASSERT_TRUE(resumed.ok() && gone.ok() && small.ok());
  // Killed once some of the first job's chunks are committed, before the end.
  Job seen;
  for (;;) {
    seen = *client_->GetJob(*resumed);
    if (seen.state() != Job::VALIDATING || seen.validated_requests() > 0) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  coordinator_->Signal(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  ASSERT_EQ(seen.state(), Job::VALIDATING)
      << "validation ended before the coordinator could be killed: make the job larger";
  ASSERT_LT(seen.validated_requests(), kLines);
  const std::string state = TempPath(name_ + ".state");
  ASSERT_EQ(std::remove(absl::StrCat(state, "/jobs/", *gone, "/input.jsonl").c_str()), 0);

  StartCoordinator(port_);
  StartWorker();
  Job job = WaitForJob(*resumed, IsFinal);
  EXPECT_EQ(job.state(), Job::COMPLETED);
  EXPECT_EQ(job.completed_requests(), kLines / kEvery);
  EXPECT_EQ(job.failed_requests(), kLines - kLines / kEvery);
  EXPECT_THAT(coordinator_->ReadStderr(),
              HasSubstr("job " + *resumed + ": validation goes on at line "));
  std::map<int64_t, int> answered;
  ASSERT_TRUE(client_
                  ->ReadResults(*resumed,
                                [&](const std::string& line) {
                                  const std::string id = json::parse(line)["id"];
                                  answered[std::stoll(id.substr(id.rfind(':') + 1))]++;
                                })
                  .ok());
  EXPECT_EQ(answered.size(), static_cast<size_t>(kLines));
  for (const auto& [line, count] : answered) ASSERT_EQ(count, 1) << "line " << line;

  job = WaitForJob(*gone, IsFinal);
  EXPECT_EQ(job.state(), Job::FAILED);
  EXPECT_EQ(job.error(), absl::StrCat("cannot validate the job's input: input file of job ", *gone,
                                      " is missing"));
  job = WaitForJob(*small, IsFinal);
  EXPECT_EQ(job.state(), Job::COMPLETED);
  EXPECT_EQ(job.completed_requests(), 5);
}

TEST_F(JobIntakeTest, MemoryDoesNotGrowWithTheInput) {
  StartCoordinator();
  // Lines of ~2 KB, none of which run (no worker).
  auto input_of = [](int lines) {
    std::string input;
    const std::string padding(1900, 'x');
    for (int i = 0; i < lines; ++i) {
      absl::StrAppend(&input, R"({"custom_id": "m)", i, R"(", "url": "/v1/completions", )",
                      R"("body": {"prompt": [)", 2 + i % 900, R"(, 5, 6], "max_tokens": 3, )",
                      R"("user": ")", padding, "\"}}\n");
    }
    return input;
  };
  // The peak resident memory after a job of `lines` is uploaded and validated.
  auto peak_after = [&](int lines) -> int64_t {
    auto id = client_->SubmitJob("memory", input_of(lines));
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return -1;
    Job job = WaitForJob(*id, [](const Job& j) { return j.state() != Job::VALIDATING; });
    EXPECT_EQ(job.state(), Job::QUEUED);
    EXPECT_EQ(job.validated_requests(), lines);
    return ProcStatusKb(coordinator_->pid(), "VmHWM");
  };
  // A first job (60 MB) brings the buffers of receiving and validating to their size (gRPC's
  // flow-control window grows with the upload); a job twice as large then adds far less than
  // its size, which holding it in memory would.
  const int64_t first_kb = peak_after(30000);
  const int64_t second_kb = peak_after(60000);
  ASSERT_GT(first_kb, 0);
  EXPECT_LT(second_kb - first_kb, 30 * 1024) << "peak after the 60 MB job " << first_kb
                                             << " kB, after the 120 MB job " << second_kb << " kB";
  std::cerr << "coordinator peak resident memory: " << first_kb << " kB after the 60 MB job, "
            << second_kb << " kB after the 120 MB job\n";
}

}  // namespace
}  // namespace deepinfer
