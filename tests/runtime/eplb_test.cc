// EPLB end to end, through real processes (a coordinator and two one-rank CPU workers on the
// HF-made fixture tests/fixtures/dsv3_qlora_rope, 8 routed experts in 2 MoE layers, expert
// parallel over 2 ranks):
//  * a live `rebalance` in the middle of a job (the ranks load the experts of the new
//    placement and switch between two steps) gives the same tokens as a run without it, and
//    every request completes exactly once;
//  * a placement with replicas given at start (coordinator --expert-placement) gives the same
//    tokens as no placement, and so does one given to the workers (worker --expert-placement);
//  * `deepinfer-admin expert-load --save/--plot` writes the window as loads JSON and a PNG.
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
using ::deepinfer::testing::ReadFile;
using ::deepinfer::testing::RunCommand;
using ::deepinfer::testing::Runfile;
using ::deepinfer::testing::Subprocess;
using ::deepinfer::testing::TempPath;
using ::deepinfer::testing::WaitForPortFile;
using ::deepinfer::testing::WaitUntil;
using ::testing::HasSubstr;
using json = nlohmann::json;

const char kModel[] = "tests/fixtures/dsv3_qlora_rope";

// 10 slots per MoE layer (8 experts + 2 replicas), 5 per rank; rank 0 hosts experts
// {0, 1, 2, 3, 7} of layer 0 and rank 1 {4, 5, 6, 7, 0}: experts 0 and 7 have one replica on
// each rank. Layer 1 doubles experts 2 and 5 on the same rank as their first copy.
const char kReplicaPlacement[] = R"({
  "phy2log": [[0,1,2,3,7,4,5,6,7,0],[2,2,0,1,3,4,5,5,6,7]],
  "log2phy": [[[0,9],[1,-1],[2,-1],[3,-1],[5,-1],[6,-1],[7,-1],[4,8]],
              [[2,-1],[3,-1],[0,1],[4,-1],[5,-1],[6,7],[8,-1],[9,-1]]],
  "logcnt": [[2,1,1,1,1,1,1,2],[1,1,2,1,1,2,1,1]]
})";

// custom_id -> token ids; fails the test on duplicates or error lines.
std::map<std::string, std::vector<int>> TokensById(const std::string& output) {
  std::map<std::string, std::vector<int>> out;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    json j = json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    if (j.is_discarded()) continue;
    EXPECT_TRUE(j["error"].is_null()) << line;
    if (!j["error"].is_null()) continue;
    const std::string id = j["custom_id"].get<std::string>();
    EXPECT_TRUE(
        out.emplace(id, j["response"]["body"]["choices"][0]["token_ids"].get<std::vector<int>>())
            .second)
        << "custom_id " << id << " appears twice";
  }
  return out;
}

// A coordinator and two workers of one test.
class Cluster {
 public:
  // A coordinator and two workers; `coordinator_flags` / `worker_flags` are added.
  void StartCluster(const std::string& run, std::vector<std::string> coordinator_flags,
                    std::vector<std::string> worker_flags) {
    run_ = run;
    const std::string port_file = TempPath(run + ".port");
    std::vector<std::string> argv = {Runfile("coordinator/deepinfer-coordinator"),
                                     "--listen=127.0.0.1:0",
                                     "--port-file=" + port_file,
                                     std::string("--model=") + kModel,
                                     "--state-dir=" + TempPath(run + ".state"),
                                     "--min-workers=2",
                                     "--num-redundant-experts=2",
                                     "--heartbeat-interval-ms=200",
                                     "--heartbeat-timeout-ms=4000"};
    argv.insert(argv.end(), coordinator_flags.begin(), coordinator_flags.end());
    auto p = Subprocess::Start(argv, TempPath(run + ".coordinator"));
    ASSERT_TRUE(p.ok()) << p.status();
    coordinator_.emplace(std::move(*p));
    const int port = WaitForPortFile(port_file, absl::Seconds(60));
    ASSERT_GT(port, 0) << coordinator_->ReadStderr();
    address_ = absl::StrCat("127.0.0.1:", port);
    client_.emplace(CoordinatorClientOptions{address_, "", "test", absl::Seconds(30)});
    for (int i = 0; i < 2; ++i) {
      std::vector<std::string> w = {Runfile("worker/deepinfer-worker"), "--coordinator=" + address_,
                                    std::string("--model=") + kModel,
                                    absl::StrCat("--worker-id=w", i), "--threads=1",
                                    // Few sequences per step: a longer job, so that the
                                    // rebalance test switches well before its end.
                                    "--max-running=4"};
      w.insert(w.end(), worker_flags.begin(), worker_flags.end());
      auto wp = Subprocess::Start(w, TempPath(absl::StrCat(run, ".worker", i)));
      ASSERT_TRUE(wp.ok()) << wp.status();
      workers_[i].emplace(std::move(*wp));
    }
  }

  Job WaitForJob(const std::string& id, const std::function<bool(const Job&)>& done) {
    return testing::WaitForJob(*client_, id, done, [&] {
      return "coordinator:\n" + coordinator_->ReadStderr().substr(0, 20000);
    });
  }

  // Submits `input`, waits for it, checks nothing was lost; returns tokens by custom_id.
  std::map<std::string, std::vector<int>> RunToEnd(const std::string& input, int n) {
    auto id = client_->SubmitJob(run_, input);
    EXPECT_TRUE(id.ok()) << id.status();
    if (!id.ok()) return {};
    return Finish(*id, n);
  }

  std::map<std::string, std::vector<int>> Finish(const std::string& id, int n) {
    Job job = WaitForJob(id, [](const Job& j) { return j.state() == Job::COMPLETED; });
    EXPECT_EQ(job.completed_requests(), n);
    EXPECT_EQ(job.failed_requests(), 0);
    std::string out;
    EXPECT_TRUE(client_->ReadResults(id, [&](const std::string& l) { out += l + "\n"; }).ok());
    auto tokens = TokensById(out);
    EXPECT_EQ(tokens.size(), static_cast<size_t>(n));
    return tokens;
  }

  std::string WorkerLogs() {
    return workers_[0]->ReadStderr() + "\n---- w1 ----\n" + workers_[1]->ReadStderr();
  }

  std::string run_;
  std::string address_;
  std::optional<Subprocess> coordinator_;
  std::optional<Subprocess> workers_[2];
  std::optional<CoordinatorClient> client_;
};

void ExpectSameTokens(const std::map<std::string, std::vector<int>>& want,
                      const std::map<std::string, std::vector<int>>& got, const char* what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (const auto& [id, tokens] : want) {
    auto it = got.find(id);
    ASSERT_NE(it, got.end()) << id << " missing " << what;
    EXPECT_EQ(it->second, tokens) << id << " differs " << what;
  }
}

constexpr int kRequests = 160;
constexpr int kMaxTokens = 48;

std::map<std::string, std::vector<int>>& Reference() {
  static auto* reference = new std::map<std::string, std::vector<int>>();
  return *reference;
}

class EplbTest : public ::testing::Test, public Cluster {
 protected:
  void SetUp() override {
    if (!Reference().empty()) return;
    // Tokens without any placement: contiguous experts, no rebalance.
    Cluster reference;
    reference.StartCluster("reference", {}, {});
    Reference() = reference.RunToEnd(MakeCompletionJob(kRequests, kMaxTokens, 5), kRequests);
    ASSERT_EQ(Reference().size(), static_cast<size_t>(kRequests));
  }
};

TEST_F(EplbTest, LiveRebalanceMidJobKeepsTokensAndLosesNothing) {
  StartCluster("rebalance", {}, {});
  auto id = client_->SubmitJob("rebalance", MakeCompletionJob(kRequests, kMaxTokens, 5));
  ASSERT_TRUE(id.ok()) << id.status();
  // Some results and a load window first.
  WaitForJob(*id, [](const Job& j) { return j.completed_requests() >= 2; });
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto load = client_->GetExpertLoad();
        return load.ok() && load->num_steps() > 0 && load->num_gpus() == 2;
      },
      absl::Seconds(60)));
  auto before = RunCommand(
      {Runfile("tools/admin/deepinfer-admin"), "expert-load", "--coordinator=" + address_,
       "--save=" + TempPath("loads.json"), "--plot=" + TempPath("loads.png")},
      TempPath("expert-load"), absl::Seconds(60));
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(before->exit_code, 0) << before->err;
  EXPECT_THAT(before->out, HasSubstr("experts in order, no placement"));
  EXPECT_EQ(ReadFile(TempPath("loads.png")).substr(0, 8), "\x89PNG\r\n\x1a\n");
  json loads = json::parse(ReadFile(TempPath("loads.json")));
  ASSERT_EQ(loads.size(), 2u);  // 2 MoE layers
  EXPECT_EQ(loads[0].size(), 8u);

  auto rebalance = RunCommand({Runfile("tools/admin/deepinfer-admin"), "rebalance",
                               "--coordinator=" + address_, "--policy=global"},
                              TempPath("rebalance"), absl::Seconds(60));
  ASSERT_TRUE(rebalance.ok()) << rebalance.status();
  ASSERT_EQ(rebalance->exit_code, 0) << rebalance->err;
  EXPECT_THAT(rebalance->out, HasSubstr("before max"));
  EXPECT_THAT(rebalance->out, HasSubstr("applied: expert placement epoch 1"));
  // Both workers switch (the agreement makes it the same step on both ranks).
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto load = client_->GetExpertLoad();
        return load.ok() && load->active_epoch() == 1;
      },
      absl::Seconds(120)))
      << WorkerLogs();
  auto job = client_->GetJob(*id);
  ASSERT_TRUE(job.ok());
  EXPECT_LT(job->completed_requests(), kRequests) << "the job ended before the switch";
  auto tokens = Finish(*id, kRequests);
  ExpectSameTokens(Reference(), tokens, "after a live rebalance");
  const std::string logs = WorkerLogs();
  EXPECT_THAT(logs, HasSubstr("rank 0: switched to expert placement epoch 1"));
  EXPECT_THAT(logs, HasSubstr("rank 1: switched to expert placement epoch 1"));
  EXPECT_THAT(logs, ::testing::Not(HasSubstr("dropped")));
  auto after = RunCommand(
      {Runfile("tools/admin/deepinfer-admin"), "expert-load", "--coordinator=" + address_},
      TempPath("expert-load-after"), absl::Seconds(60));
  ASSERT_TRUE(after.ok());
  EXPECT_THAT(after->out, HasSubstr("layout: placement epoch 1"));
}

TEST_F(EplbTest, ReplicaPlacementFromTheCoordinatorKeepsTokens) {
  const std::string file = TempPath("replicas.json");
  std::ofstream(file) << kReplicaPlacement;
  StartCluster("coordinator_placement", {"--expert-placement=" + file}, {});
  auto tokens = RunToEnd(MakeCompletionJob(kRequests, kMaxTokens, 5), kRequests);
  ExpectSameTokens(Reference(), tokens, "with a replica placement from the coordinator");
  const std::string logs = WorkerLogs();
  EXPECT_THAT(logs, HasSubstr("expert parallel with an EPLB placement, 5 expert slots"));
}

TEST_F(EplbTest, ReplicaPlacementGivenToTheWorkersKeepsTokens) {
  const std::string file = TempPath("replicas-worker.json");
  std::ofstream(file) << kReplicaPlacement;
  StartCluster("worker_placement", {}, {"--expert-placement=" + file});
  auto tokens = RunToEnd(MakeCompletionJob(kRequests, kMaxTokens, 5), kRequests);
  ExpectSameTokens(Reference(), tokens, "with a replica placement from the workers");
  EXPECT_THAT(WorkerLogs(), HasSubstr("expert parallel with an EPLB placement, 5 expert slots"));
}

TEST(EplbFlagsTest, PlacementsForAnotherModelAreRefusedAtStart) {
  const std::string file = TempPath("one-layer.json");
  std::ofstream(file) << R"({"phy2log": [[0,1,2,3,4,5,6,7]], "log2phy": [[[0],[1],[2],[3],[4],[5],[6],[7]]], "logcnt": [[1,1,1,1,1,1,1,1]]})";
  auto worker = RunCommand({Runfile("worker/deepinfer-worker"), "--coordinator=127.0.0.1:1",
                            std::string("--model=") + kModel, "--expert-placement=" + file},
                           TempPath("bad-worker"), absl::Seconds(60));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_NE(worker->exit_code, 0);
  EXPECT_THAT(worker->err, HasSubstr("--expert-placement has 1 layers of 8 logical experts; the "
                                     "model has 2 MoE layers of 8"));
  auto coordinator = RunCommand(
      {Runfile("coordinator/deepinfer-coordinator"), "--listen=127.0.0.1:0",
       std::string("--model=") + kModel, "--state-dir=" + TempPath("bad-coordinator.state"),
       "--expert-placement=" + file},
      TempPath("bad-coordinator"), absl::Seconds(60));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  EXPECT_NE(coordinator->exit_code, 0);
  EXPECT_THAT(coordinator->err, HasSubstr("--expert-placement has 1 layers"));
  auto missing = RunCommand({Runfile("worker/deepinfer-worker"), "--coordinator=127.0.0.1:1",
                             std::string("--model=") + kModel,
                             "--expert-placement=" + TempPath("nope.json")},
                            TempPath("missing-placement"), absl::Seconds(60));
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->exit_code, 2);
  EXPECT_THAT(missing->err, HasSubstr("--expert-placement"));
}

}  // namespace
}  // namespace deepinfer
