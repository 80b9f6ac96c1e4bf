// Runs the real `deepinfer-admin plan` on small load files and checks what it prints.
#include <cstdlib>
#include <fstream>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/eplb/placement_json.h"
#include "coordinator/eplb/balance_report.h"
#include "coordinator/eplb/expert_loads.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::CommandResult;
using ::deepinfer::testing::Runfile;
using ::deepinfer::testing::TempPath;
using ::testing::HasSubstr;

// 2 layers of 8 experts in 4 groups; expert 3 (layer 0) and 6 (layer 1) are hot.
const ExpertLoads kSkewed = {{10, 20, 10, 900, 30, 10, 20, 40}, {5, 15, 25, 10, 20, 5, 700, 60}};

class PlanCommandTest : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS");
    load_file_ = TempPath("loads.json");
    ASSERT_TRUE(WriteExpertLoadsFile(load_file_, kSkewed).ok());
  }

  CommandResult Plan(std::vector<std::string> args) {
    args.insert(args.begin(), {Runfile("tools/admin/deepinfer-admin"), "plan"});
    auto result = ::deepinfer::testing::RunCommand(args, TempPath(absl::StrCat("plan.", ++runs_)));
    EXPECT_TRUE(result.ok()) << result.status();
    return result.ok() ? *result : CommandResult{};
  }

  std::string load_file_;
  int runs_ = 0;
};

TEST_F(PlanCommandTest, PrintsPlacementJsonAndBalance) {
  const CommandResult r = Plan({"--load", load_file_, "--num-replicas", "12", "--num-groups", "4",
                                "--num-nodes", "2", "--num-gpus", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json json = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_FALSE(json.is_discarded()) << r.out;
  ASSERT_TRUE(json.contains("phy2log") && json.contains("log2phy") && json.contains("logcnt"));
  const nlohmann::json& phy2log = json["phy2log"];
  ASSERT_EQ(phy2log.size(), 2u);
  for (size_t layer = 0; layer < 2; ++layer) {
    ASSERT_EQ(phy2log[layer].size(), 12u);
    std::vector<int> count(8, 0);
    for (const auto& e : phy2log[layer]) ++count[e.get<int>()];
    for (int e = 0; e < 8; ++e) {
      EXPECT_GE(count[e], 1) << "layer " << layer << " expert " << e;
      EXPECT_EQ(json["logcnt"][layer][e].get<int>(), count[e]);
    }
    // The hot expert got the most replicas: one per GPU of its node (two GPUs of three
    // slots; a third replica would put two on one GPU).
    const int hot = layer == 0 ? 3 : 6;
    EXPECT_EQ(*std::max_element(count.begin(), count.end()), count[hot]);
    EXPECT_EQ(count[hot], 2);
    // Hierarchical (4 groups over 2 nodes, auto): each group's replicas on one node
    // (slots 0-5 are node 0's two GPUs, 6-11 node 1's).
    std::vector<std::set<int>> nodes(4);
    for (int slot = 0; slot < 12; ++slot) {
      nodes[phy2log[layer][slot].get<int>() / 2].insert(slot / 6);
    }
    for (const auto& n : nodes) EXPECT_EQ(n.size(), 1u);
  }
  // The output is a placement our own reader accepts, and it balances better than the
  // default layout.
  absl::StatusOr<ExpertPlacement> placement = ParsePlacementJson(r.out);
  ASSERT_TRUE(placement.ok()) << placement.status();
  const double after = BalanceReport::ForPlacement(*placement, kSkewed, 4)->imbalance();
  const double before = BalanceReport::ForContiguous(kSkewed, 4)->imbalance();
  EXPECT_LT(after, before - 0.5) << r.err;
  EXPECT_THAT(r.err, HasSubstr("policy hierarchical (auto)"));
  EXPECT_THAT(r.err, HasSubstr("12 physical (4 redundant)"));
  EXPECT_THAT(r.err, HasSubstr("before max"));
  EXPECT_THAT(r.err, HasSubstr("overall"));
}

TEST_F(PlanCommandTest, GlobalPolicyAndRedundantCountFromEnvironment) {
  // Without --num-replicas: logical + the redundant count; the environment wins.
  setenv("DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS", "8", 1);
  CommandResult r = Plan({"--load", load_file_, "--num-redundant-experts", "4", "--num-gpus", "4",
                          "--policy", "global"});
  unsetenv("DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("policy global;"));
  EXPECT_THAT(r.err, HasSubstr("16 physical (8 redundant)"));
  absl::StatusOr<ExpertPlacement> placement = ParsePlacementJson(r.out);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->num_physical(), 16);

  r = Plan({"--load", load_file_, "--num-redundant-experts", "4", "--num-gpus", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("12 physical (4 redundant)"));
}

TEST_F(PlanCommandTest, RejectsBadInputWithClearMessages) {
  // 8 + 32 (the default) = 40 does not divide over 6 GPUs.
  CommandResult r = Plan({"--load", load_file_, "--num-gpus", "6"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("40 physical experts (8 logical + 32 redundant) do not divide "
                               "evenly over 6 ranks; nearest that work: 28 redundant"));
  EXPECT_TRUE(r.out.empty());

  r = Plan({"--load", load_file_, "--num-gpus", "4", "--num-groups", "3"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("8 logical experts do not split into 3 equal expert groups"));

  r = Plan({"--load", load_file_, "--num-gpus", "4", "--policy", "best"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("unknown placement policy \"best\""));

  r = Plan({"--load", TempPath("missing.json"), "--num-gpus", "4"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("missing.json: cannot open expert-load file"));

  const std::string bad = TempPath("bad.json");
  std::ofstream(bad) << "[[1, 2], [3]]";
  r = Plan({"--load", bad, "--num-gpus", "2"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("bad.json: expert loads: layer 1 has 1 experts, layer 0 has 2"));

  r = Plan({"--num-gpus", "4"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--load"));
}

TEST_F(PlanCommandTest, CurrentPlacementIsTheBaseline) {
  CommandResult first = Plan({"--load", load_file_, "--num-replicas", "12", "--num-gpus", "4"});
  ASSERT_EQ(first.exit_code, 0) << first.err;
  const std::string current = TempPath("current.json");
  std::ofstream(current) << first.out;
  // Planning again from the same loads: before and after are the same placement.
  CommandResult again =
      Plan({"--load", load_file_, "--num-replicas", "12", "--num-gpus", "4", "--current", current});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(again.out, first.out);
  EXPECT_THAT(again.err, HasSubstr("before (" + current + ")"));
}

}  // namespace
}  // namespace deepinfer
