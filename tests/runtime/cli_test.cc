// What a newcomer sees from the `deepinfer` CLI, through real processes on the HF-made
// fixture tests/fixtures/dsv3_qlora_rope (8 routed experts, CPU backend):
//   * `deepinfer run` refuses at once a layout whose ranks do not split the experts, naming
//     the rank counts that do, and leaves the output file alone;
//   * a worker the coordinator leaves out of the expert-parallel group is named, with the
//     reason, in the output of `deepinfer wait`;
//   * the tokens of running requests reach the job status while the job runs, before any
//     request finished.
#include <sys/stat.h>

#include <fstream>
#include <iostream>
#include <optional>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/batch_jobs.h"
#include "tests/testing/subprocess.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::MakeCompletionJob;
using ::deepinfer::testing::ReadFile;
using ::deepinfer::testing::RunCommand;
using ::deepinfer::testing::Runfile;
using ::deepinfer::testing::Subprocess;
using ::deepinfer::testing::TempPath;
using ::deepinfer::testing::WaitForPortFile;
using ::testing::HasSubstr;

const char kModel[] = "tests/fixtures/dsv3_qlora_rope";

TEST(DeepinferRunTest, RefusesRanksThatDoNotSplitTheExpertsAtOnce) {
  const std::string in = TempPath("refused.in.jsonl");
  const std::string out = TempPath("refused.out.jsonl");
  const std::string state = TempPath("refused.state");
  std::ofstream(in) << MakeCompletionJob(2, 4, 1);
  std::ofstream(out) << "an earlier run's output\n";
  auto result = RunCommand(
      {Runfile("coordinator/cli/deepinfer"), "run", std::string("--model=") + kModel,
       "--input=" + in, "--output=" + out, "--ranks-per-worker=3", "--state-dir=" + state},
      TempPath("refused.run"), absl::Seconds(120));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 2) << result->err;
  EXPECT_THAT(result->err, HasSubstr("8 routed experts cannot be split over 3 ranks; rank counts "
                                     "that divide 8: 1, 2, 4, 8"));
  EXPECT_EQ(ReadFile(out), "an earlier run's output\n");
  // Refused before anything started: no state directory, so no coordinator or worker.
  struct stat info;
  EXPECT_NE(stat(state.c_str(), &info), 0);
}

// A coordinator and `n` one-rank workers w0, w1, ... started by hand.
class CliClusterTest : public ::testing::Test {
 protected:
  void Start(int workers, int min_workers) {
    const std::string port_file = TempPath(name_ + ".port");
    auto p = Subprocess::Start(
        {Runfile("coordinator/deepinfer-coordinator"), "--listen=127.0.0.1:0",
         "--port-file=" + port_file, std::string("--model=") + kModel,
         "--state-dir=" + TempPath(name_ + ".state"), absl::StrCat("--min-workers=", min_workers),
         "--heartbeat-interval-ms=200", "--heartbeat-timeout-ms=5000"},
        TempPath(name_ + ".coordinator"));
    ASSERT_TRUE(p.ok()) << p.status();
    coordinator_.emplace(std::move(*p));
    const int port = WaitForPortFile(port_file, absl::Seconds(60));
    ASSERT_GT(port, 0) << coordinator_->ReadStderr();
    address_ = absl::StrCat("127.0.0.1:", port);
    client_.emplace(CoordinatorClientOptions{address_, "", "test", absl::Seconds(10)});
    for (int i = 0; i < workers; ++i) {
      auto w = Subprocess::Start(
          {Runfile("worker/deepinfer-worker"), "--coordinator=" + address_,
           std::string("--model=") + kModel, absl::StrCat("--worker-id=w", i), "--threads=1"},
          TempPath(absl::StrCat(name_, ".worker", i)));
      ASSERT_TRUE(w.ok()) << w.status();
      workers_.push_back(std::move(*w));
    }
  }

  std::string Diagnostics() {
    return "coordinator:\n" + coordinator_->ReadStderr().substr(0, 20000);
  }

  const std::string name_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::optional<Subprocess> coordinator_;
  std::vector<Subprocess> workers_;
  std::string address_;
  std::optional<CoordinatorClient> client_;
};

TEST_F(CliClusterTest, WaitNamesTheWorkerLeftOutOfTheGroup) {
  // Three one-rank workers: 3 ranks do not split 8 experts, so the group takes w0 and w1.
  Start(/*workers=*/3, /*min_workers=*/3);
  auto id = client_->SubmitJob("left-out", MakeCompletionJob(24, 16, 5));
  ASSERT_TRUE(id.ok()) << id.status();
  auto wait =
      RunCommand({Runfile("coordinator/cli/deepinfer"), "wait", "--coordinator=" + address_, *id},
                 TempPath(name_ + ".wait"), absl::Seconds(600));
  ASSERT_TRUE(wait.ok()) << wait.status() << "\n" << Diagnostics();
  EXPECT_EQ(wait->exit_code, 0) << wait->err;
  EXPECT_THAT(wait->err,
              HasSubstr("deepinfer wait: worker(s) w2 left out of the expert-parallel group, "
                        "which uses 2 of the 3 READY ranks: 8 routed experts cannot be split "
                        "over 3 ranks; rank counts that divide 8: 1, 2, 4, 8"))
      << Diagnostics();
  EXPECT_THAT(wait->out, HasSubstr("COMPLETED"));
}

TEST_F(CliClusterTest, RunningRequestsTokensReachTheJobStatusBeforeAnyFinishes) {
  Start(/*workers=*/1, /*min_workers=*/1);
  // Every request makes the same 480 tokens, so none finishes long before the others.
  const int n = 16;
  auto id = client_->SubmitJob("progress", MakeCompletionJob(n, 480, 6));
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<int64_t> seen;  // running tokens seen while no request had finished
  Job last = testing::WaitForJob(
      *client_, *id,
      [&](const Job& job) {
        if (job.completed_requests() == 0 && job.running_generated_tokens() > 0 &&
            (seen.empty() || seen.back() != job.running_generated_tokens())) {
          seen.push_back(job.running_generated_tokens());
        }
        return job.state() == Job::COMPLETED;
      },
      [&] { return Diagnostics(); });
  EXPECT_EQ(last.completed_requests(), n);
  EXPECT_EQ(last.generated_tokens(), n * 480);
  EXPECT_EQ(last.running_generated_tokens(), 0);
  std::cerr << "running tokens seen before the first result: " << absl::StrJoin(seen, ", ") << "\n";
  // The count moved at least twice before the first request finished, and only upwards.
  ASSERT_GE(seen.size(), 2u) << Diagnostics();
  for (size_t i = 1; i < seen.size(); ++i) EXPECT_GT(seen[i], seen[i - 1]);
  EXPECT_LE(seen.back(), n * 480);
}

}  // namespace
}  // namespace deepinfer
