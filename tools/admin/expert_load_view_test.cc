// expert-load views: loads unpacked from the response, per-GPU tokens of the contiguous layout
// and of a running placement (hand-computed), the table, and a PNG whose pixels encode them.
#include "tools/admin/expert_load_view.h"

#include "coordinator/eplb/placement_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// 1 layer, 4 experts, 2 GPUs: expert 0 takes 60 tokens, the others 10 each.
GetExpertLoadResponse Response() {
  GetExpertLoadResponse r;
  r.set_window_steps(1000);
  r.set_num_steps(12);
  r.set_num_layers(1);
  r.set_num_experts(4);
  for (double v : {60.0, 10.0, 10.0, 10.0}) r.add_loads(v);
  r.set_num_gpus(2);
  return r;
}

TEST(ExpertLoadViewTest, ContiguousLayoutWithoutAPlacement) {
  GetExpertLoadResponse r = Response();
  auto loads = LoadsFromResponse(r);
  ASSERT_TRUE(loads.ok()) << loads.status();
  EXPECT_THAT((*loads)[0], ElementsAre(60, 10, 10, 10));
  auto gpus = GpuLoads(r);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_THAT(gpus->layers()[0].gpu_tokens, ElementsAre(70, 20));  // experts {0,1} and {2,3}
  auto table = FormatExpertLoadTable(r);
  ASSERT_TRUE(table.ok());
  EXPECT_THAT(*table, HasSubstr("experts in order, no placement"));
  EXPECT_THAT(*table, HasSubstr("70.0"));
  EXPECT_THAT(*table, HasSubstr("1.556"));  // 70 / 45
}

TEST(ExpertLoadViewTest, RunningPlacementSplitsReplicas) {
  GetExpertLoadResponse r = Response();
  // 6 slots: GPU 0 = {0, 1, 2}, GPU 1 = {0, 3, 3}: expert 0 split 30/30, expert 3 5/5 on GPU 1.
  auto p = ExpertPlacement::FromPhy2Log({{0, 1, 2, 0, 3, 3}}, 4);
  ASSERT_TRUE(p.ok());
  *r.mutable_placement() = PlacementToProto(*p, 2);
  r.set_active_epoch(1);  // handed out, not running yet: still the contiguous layout
  EXPECT_THAT(GpuLoads(r)->layers()[0].gpu_tokens, ElementsAre(70, 20));
  EXPECT_THAT(*FormatExpertLoadTable(r), HasSubstr("not running on every worker yet"));
  r.set_active_epoch(2);
  EXPECT_THAT(GpuLoads(r)->layers()[0].gpu_tokens, ElementsAre(50, 40));
  EXPECT_THAT(*FormatExpertLoadTable(r), HasSubstr("placement epoch 2"));
}

TEST(ExpertLoadViewTest, PngCellsShowTheLoad) {
  GetExpertLoadResponse r = Response();
  auto png = RenderExpertLoadPng(r);
  ASSERT_TRUE(png.ok()) << png.status();
  // Stored blocks: the first pixel's bytes follow the 8-byte signature, IHDR (25 bytes), the
  // IDAT length and type (8), the zlib header (2), the block header (5) and the row filter (1).
  const size_t first = 8 + 25 + 8 + 2 + 5 + 1;
  ASSERT_GT(png->size(), first + 3);
  // GPU 0 is the busiest cell: white.
  EXPECT_EQ(static_cast<uint8_t>((*png)[first]), 255);
  EXPECT_EQ(static_cast<uint8_t>((*png)[first + 1]), 255);
  EXPECT_EQ(static_cast<uint8_t>((*png)[first + 2]), 255);
  // GPU 1 (20 / 70 of the peak, under a third): red only. Its first pixel is cell_w = 256 in.
  const size_t second = first + 256 * 3;
  EXPECT_GT(static_cast<uint8_t>((*png)[second]), 200);
  EXPECT_EQ(static_cast<uint8_t>((*png)[second + 1]), 0);
  EXPECT_EQ(static_cast<uint8_t>((*png)[second + 2]), 0);
}

TEST(ExpertLoadViewTest, EmptyWindowOrNoGroupAreClearErrors) {
  GetExpertLoadResponse empty;
  EXPECT_TRUE(absl::IsFailedPrecondition(LoadsFromResponse(empty).status()));
  GetExpertLoadResponse r = Response();
  r.set_num_gpus(0);
  EXPECT_THAT(std::string(GpuLoads(r).status().message()), HasSubstr("no serving"));
  r = Response();
  r.add_loads(1);
  EXPECT_TRUE(absl::IsInvalidArgument(LoadsFromResponse(r).status()));
}

}  // namespace
}  // namespace deepinfer
