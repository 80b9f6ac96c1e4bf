// GroupController without RPCs: heartbeat contents before and after a group, generation
// ordering, refusals (also of expert placements), and a replaced group that serves in turn.
#include "worker/engine/group_controller.h"

#include <cstdlib>

#include "common/eplb/placement_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope";
}

class Results {
 public:
  ResultSink Sink() {
    return [this](std::vector<RequestResult> r) {
      absl::MutexLock lock(&mu_);
      for (auto& x : r) got_.push_back(std::move(x));
    };
  }
  std::vector<RequestResult> Await(size_t n) {
    absl::MutexLock lock(&mu_);
    auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return got_.size() >= n; };
    mu_.Await(absl::Condition(&done));
    return got_;
  }

 private:
  absl::Mutex mu_;
  std::vector<RequestResult> got_ ABSL_GUARDED_BY(mu_);
};

ConfigureGroupRequest Layout(uint64_t generation, int world) {
  ConfigureGroupRequest r;
  r.set_generation(generation);
  r.set_group_incarnation(generation + 100);
  r.set_world_size(world);
  return r;
}

WorkItem Item(const std::string& id) {
  WorkItem item;
  item.set_request_id(id);
  for (int t : {441, 936, 298, 724, 726}) item.add_prompt_token_ids(t);
  item.mutable_params()->set_max_tokens(4);
  item.mutable_params()->set_logprobs(-1);
  return item;
}

TEST(GroupControllerTest, ConfigureSubmitAndReplace) {
  auto model = ModelFiles::Open(FixtureDir());
  ASSERT_TRUE(model.ok()) << model.status();
  GroupControllerOptions options;
  options.group.model = model->get();
  options.group.kv_cache_tokens = 1024;
  Results results;
  GroupController controller(options, results.Sink());

  HeartbeatRequest hb;
  controller.FillHeartbeat(&hb);
  EXPECT_EQ(hb.group_status(), GROUP_NONE);
  EXPECT_TRUE(absl::IsFailedPrecondition(controller.Submit(1, {Item("a")})));

  ASSERT_TRUE(controller.Configure(Layout(4, 1)).ok());
  ASSERT_TRUE(controller.Submit(4, {Item("a")}).ok());  // queued while forming
  EXPECT_TRUE(absl::IsFailedPrecondition(controller.Submit(3, {Item("b")})));
  EXPECT_TRUE(absl::IsFailedPrecondition(controller.Configure(Layout(3, 1))));
  EXPECT_TRUE(controller.Configure(Layout(4, 1)).ok());  // retried call
  EXPECT_TRUE(absl::IsInvalidArgument(controller.Configure(Layout(9, 3))));
  auto first = results.Await(1);
  EXPECT_EQ(first[0].request_id(), "a");
  EXPECT_EQ(first[0].group_generation(), 4u);
  EXPECT_EQ(first[0].token_ids_size(), 4);

  hb.Clear();
  controller.FillHeartbeat(&hb);
  EXPECT_EQ(hb.group_generation(), 4u);
  EXPECT_EQ(hb.group_status(), GROUP_SERVING);
  ASSERT_EQ(hb.rank_loads_size(), 1);

  ASSERT_TRUE(controller.Configure(Layout(5, 1)).ok());
  ASSERT_TRUE(controller.Submit(5, {Item("b")}).ok());
  auto second = results.Await(2);
  EXPECT_EQ(second[1].request_id(), "b");
  EXPECT_EQ(second[1].group_generation(), 5u);
  EXPECT_THAT(second[1].token_ids(), ::testing::ElementsAreArray(first[0].token_ids()));

  // Expert placements: heartbeats carry the running epoch and the expert counts; a placement
  // for another generation, a malformed one, and one for a group of one rank are refused.
  hb.Clear();
  controller.FillHeartbeat(&hb);
  EXPECT_EQ(hb.placement_epoch(), 0u);
  SetExpertPlacementRequest place;
  place.set_generation(4);
  auto p = ExpertPlacement::FromPhy2Log({{0, 1, 2, 3, 4, 5, 6, 7}, {0, 1, 2, 3, 4, 5, 6, 7}}, 8);
  ASSERT_TRUE(p.ok());
  *place.mutable_placement() = PlacementToProto(*p, 1);
  EXPECT_TRUE(absl::IsFailedPrecondition(controller.SetPlacement(place)));  // generation 5 runs
  place.set_generation(5);
  EXPECT_TRUE(absl::IsFailedPrecondition(controller.SetPlacement(place)));  // one rank
  place.mutable_placement()->mutable_layers(0)->clear_log2phy();
  EXPECT_TRUE(absl::IsInvalidArgument(controller.SetPlacement(place)));
  ConfigureGroupRequest bad = Layout(6, 1);
  bad.mutable_placement()->add_layers();
  EXPECT_TRUE(absl::IsInvalidArgument(controller.Configure(bad)));

  auto address = controller.Prepare(6);
  ASSERT_TRUE(address.ok()) << address.status();
  EXPECT_THAT(*address, ::testing::StartsWith("127.0.0.1:"));
}

}  // namespace
}  // namespace deepinfer
