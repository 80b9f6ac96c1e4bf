// The control plane end to end, as separate processes: a coordinator and two
// workers on loopback, with the auth token on. Both workers become READY; a
// SIGKILLed worker is LOST within the heartbeat deadline; a restarted worker and a
// restarted coordinator lead to fresh registrations; deepinfer-admin shows it all
// and is refused without the token; SIGTERM stops every daemon cleanly.
#include <signal.h>

#include <algorithm>
#include <fstream>
#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "coordinator/client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::RunCommand;
using ::deepinfer::testing::Runfile;
using ::deepinfer::testing::Subprocess;
using ::deepinfer::testing::TempPath;
using ::deepinfer::testing::WaitUntil;
using ::testing::HasSubstr;
using ::testing::MatchesRegex;

constexpr int kHeartbeatIntervalMs = 200;
constexpr int kHeartbeatTimeoutMs = 2000;
// How late a LOST mark may come after the deadline: the monitor checks every
// interval (200 ms here) and the test polls every 20 ms; the rest is scheduling
// slack for a loaded 2-core CI machine.
constexpr absl::Duration kLostSlack = absl::Milliseconds(1500);
// Start-up and registration waits; generous because nothing else depends on them.
constexpr absl::Duration kStartup = absl::Seconds(30);

class ControlPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override {
    token_file_ = TempPath("token");
    std::ofstream(token_file_) << "integration-secret\n";
  }

  void StartCoordinator(int port) {
    const std::string port_file = TempPath(absl::StrCat("coordinator.port.", ++starts_));
    auto p = Subprocess::Start(
        {Runfile("coordinator/deepinfer-coordinator"), absl::StrCat("--listen=127.0.0.1:", port),
         "--port-file=" + port_file, "--auth-token-file=" + token_file_,
         absl::StrCat("--heartbeat-interval-ms=", kHeartbeatIntervalMs),
         absl::StrCat("--heartbeat-timeout-ms=", kHeartbeatTimeoutMs)},
        TempPath(absl::StrCat("coordinator.", starts_)));
    ASSERT_TRUE(p.ok()) << p.status();
    coordinator_.emplace(std::move(*p));
    int bound = 0;
    ASSERT_TRUE(WaitUntil(
        [&] {
          std::ifstream in(port_file);
          std::string text;
          return std::getline(in, text) && absl::SimpleAtoi(text, &bound) && bound > 0;
        },
        kStartup))
        << "coordinator did not write its port; stderr:\n"
        << coordinator_->ReadStderr();
    if (port != 0) {
      ASSERT_EQ(bound, port);
    }
    address_ = absl::StrCat("127.0.0.1:", bound);
    port_ = bound;
  }

  Subprocess StartWorker(const std::string& id) {
    auto p = Subprocess::Start(
        {Runfile("worker/deepinfer-worker"), "--coordinator=" + address_, "--worker-id=" + id,
         "--devices=cpu", "--model=" + Runfile("tests/fixtures/dsv3_qlora_rope"),
         "--auth-token-file=" + token_file_},
        TempPath(absl::StrCat(id, ".", ++starts_)));
    EXPECT_TRUE(p.ok()) << p.status();
    return std::move(*p);
  }

  // The coordinator's view; empty if it cannot be read.
  std::optional<ClusterStatusResponse> Status() {
    CoordinatorClient client({address_, "integration-secret", "test", absl::Seconds(2)});
    auto status = client.ClusterStatus();
    if (!status.ok()) return std::nullopt;
    return *status;
  }

  WorkerState StateOf(const std::string& id) {
    auto status = Status();
    if (!status) return WORKER_STATE_UNSPECIFIED;
    for (const auto& w : status->workers()) {
      if (w.worker_id() == id) return w.state();
    }
    return WORKER_STATE_UNSPECIFIED;
  }

  bool BothReady() { return StateOf("w1") == READY && StateOf("w2") == READY; }

  testing::CommandResult Admin(std::vector<std::string> args) {
    args.insert(args.begin(), Runfile("tools/admin/deepinfer-admin"));
    auto result = RunCommand(args, TempPath(absl::StrCat("admin.", ++starts_)));
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : testing::CommandResult{};
  }

  std::string token_file_;
  std::string address_;
  int port_ = 0;
  int starts_ = 0;
  std::optional<Subprocess> coordinator_;
};

TEST_F(ControlPlaneTest, ReadyLostAndReregistration) {
  StartCoordinator(0);
  Subprocess w1 = StartWorker("w1");
  std::optional<Subprocess> w2 = StartWorker("w2");
  ASSERT_TRUE(WaitUntil([&] { return BothReady(); }, kStartup))
      << "w1 stderr:\n" << w1.ReadStderr() << "\nw2 stderr:\n" << w2->ReadStderr();

  // The operator's view, through the real admin binary.
  auto table = Admin({"status", "--coordinator=" + address_, "--auth-token-file=" + token_file_});
  EXPECT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("2 worker(s)"));
  EXPECT_THAT(table.out, MatchesRegex("(.|\n)*w1 +READY(.|\n)*"));
  EXPECT_THAT(table.out, MatchesRegex("(.|\n)*w2 +READY(.|\n)*"));
  auto refused = Admin({"status", "--coordinator=" + address_});
  EXPECT_EQ(refused.exit_code, 1);
  EXPECT_THAT(refused.err, HasSubstr("requires an auth token"));
  std::ofstream(TempPath("bad_token")) << "guess\n";
  auto wrong = Admin({"status", "--coordinator=" + address_,
                      "--auth-token-file=" + TempPath("bad_token")});
  EXPECT_EQ(wrong.exit_code, 1);
  EXPECT_THAT(wrong.err, HasSubstr("wrong auth token"));

  // SIGKILL w2: no goodbye, only the missing heartbeats tell.
  w2->Signal(SIGKILL);
  ASSERT_TRUE(w2->Wait(absl::Seconds(10)).ok());
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(WaitUntil([&] { return StateOf("w2") == LOST; },
                        absl::Milliseconds(kHeartbeatTimeoutMs) + kLostSlack))
      << "w2 not LOST within the heartbeat deadline plus slack";
  const absl::Duration to_lost = absl::Now() - killed;
  // Its last heartbeat was at most one interval before the kill.
  EXPECT_GE(to_lost, absl::Milliseconds(kHeartbeatTimeoutMs - kHeartbeatIntervalMs));
  EXPECT_EQ(StateOf("w1"), READY);
  std::cerr << "w2 LOST " << to_lost << " after SIGKILL (timeout " << kHeartbeatTimeoutMs
            << " ms)\n";

  // A new w2 process re-registers under the same id: a restart.
  w2.emplace(StartWorker("w2"));
  ASSERT_TRUE(WaitUntil([&] { return StateOf("w2") == READY; }, kStartup));
  auto status = Status();
  ASSERT_TRUE(status);
  const uint64_t first_incarnation = status->coordinator_incarnation();
  EXPECT_EQ(status->workers(1).worker_id(), "w2");
  EXPECT_EQ(status->workers(1).restarts(), 1);

  // Restart the coordinator on the same port: both workers must find it again.
  coordinator_->Signal(SIGTERM);
  auto coordinator_exit = coordinator_->Wait(absl::Seconds(20));
  ASSERT_TRUE(coordinator_exit.ok());
  EXPECT_EQ(*coordinator_exit, 0) << coordinator_->ReadStderr();
  StartCoordinator(port_);
  ASSERT_TRUE(WaitUntil([&] { return BothReady(); }, kStartup))
      << "w1 stderr:\n" << w1.ReadStderr() << "\nw2 stderr:\n" << w2->ReadStderr();
  status = Status();
  ASSERT_TRUE(status);
  EXPECT_NE(status->coordinator_incarnation(), first_incarnation);
  EXPECT_THAT(w1.ReadStderr(), HasSubstr("coordinator restarted"));

  // SIGTERM: every daemon exits 0.
  for (Subprocess* p : {&w1, &*w2, &*coordinator_}) {
    p->Signal(SIGTERM);
    auto code = p->Wait(absl::Seconds(20));
    ASSERT_TRUE(code.ok()) << "did not exit on SIGTERM";
    EXPECT_EQ(*code, 0);
  }
}

TEST_F(ControlPlaneTest, DaemonsExplainBadCommandLines) {
  auto no_coordinator = RunCommand({Runfile("worker/deepinfer-worker")}, TempPath("bad1"));
  ASSERT_TRUE(no_coordinator.ok());
  EXPECT_EQ(no_coordinator->exit_code, 2);
  EXPECT_THAT(no_coordinator->err, HasSubstr("missing required flags --coordinator, --model"));
  auto bad_model = RunCommand({Runfile("worker/deepinfer-worker"), "--coordinator=127.0.0.1:1",
                               "--devices=cpu", "--model=/nonexistent/model"},
                              TempPath("bad_model"));
  ASSERT_TRUE(bad_model.ok());
  EXPECT_EQ(bad_model->exit_code, 1);
  EXPECT_THAT(bad_model->err, HasSubstr("/nonexistent/model"));
  auto cuda = RunCommand({Runfile("worker/deepinfer-worker"), "--coordinator=127.0.0.1:1",
                          "--devices=cpu", "--model=/x", "--backend=cuda"},
                         TempPath("cuda"));
  ASSERT_TRUE(cuda.ok());
  // No GPU here: a CUDA build says there is no GPU, a CPU-only build that it has no CUDA.
  EXPECT_NE(cuda->exit_code, 0);
  EXPECT_THAT(cuda->err, HasSubstr("--backend cuda: "));
  // The Ascend backend is a design only: one line that says so, before anything starts.
  auto ascend = RunCommand({Runfile("worker/deepinfer-worker"), "--coordinator=127.0.0.1:1",
                            "--devices=cpu", "--model=/x", "--backend=ascend"},
                           TempPath("ascend"));
  ASSERT_TRUE(ascend.ok());
  EXPECT_EQ(ascend->exit_code, 2);
  EXPECT_THAT(ascend->err, HasSubstr("deepinfer-worker: backend 'ascend' is not built into this "
                                     "binary: "));
  EXPECT_THAT(ascend->err, HasSubstr("see ascend/README.md\n"));
  EXPECT_EQ(std::count(ascend->err.begin(), ascend->err.end(), '\n'), 1) << ascend->err;
  auto bad_token = RunCommand({Runfile("coordinator/deepinfer-coordinator"), "--listen=127.0.0.1:0",
                               "--auth-token-file=/nonexistent"},
                              TempPath("bad2"));
  ASSERT_TRUE(bad_token.ok());
  EXPECT_EQ(bad_token->exit_code, 2);
  EXPECT_THAT(bad_token->err, HasSubstr("/nonexistent"));
  auto help = RunCommand({Runfile("coordinator/deepinfer-coordinator"), "--help"},
                         TempPath("help"));
  ASSERT_TRUE(help.ok());
  EXPECT_EQ(help->exit_code, 0);
  EXPECT_THAT(help->out, HasSubstr("--auth-token-file"));
}

}  // namespace
}  // namespace deepinfer
