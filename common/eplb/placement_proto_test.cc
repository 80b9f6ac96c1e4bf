// Placement proto round trip (replica order kept) and malformed specs.
#include "common/eplb/placement_proto.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

TEST(PlacementProtoTest, RoundTripKeepsReplicaOrder) {
  // Expert 1 has replicas in slots 3 and 0, in that order.
  auto p = ExpertPlacement::FromTables({{1, 0, 2, 1}}, {{{1, -1}, {3, 0}, {2, -1}}}, {{1, 2, 1}});
  ASSERT_TRUE(p.ok()) << p.status();
  ExpertPlacementSpec spec = PlacementToProto(*p, 7);
  EXPECT_EQ(spec.epoch(), 7u);
  auto back = PlacementFromProto(spec);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, *p);
  EXPECT_EQ(back->log2phy()[0][1], (std::vector<int>{3, 0}));
}

TEST(PlacementProtoTest, MalformedSpecsAreRefused) {
  ExpertPlacementSpec empty;
  EXPECT_THAT(std::string(PlacementFromProto(empty).status().message()), HasSubstr("no layers"));
  auto p = ExpertPlacement::FromPhy2Log({{0, 1, 1, 2}}, 3);
  ASSERT_TRUE(p.ok());
  ExpertPlacementSpec spec = PlacementToProto(*p, 1);
  spec.mutable_layers(0)->mutable_log2phy()->RemoveLast();
  EXPECT_THAT(std::string(PlacementFromProto(spec).status().message()),
              HasSubstr("layer 0: log2phy has 5 entries"));
  spec = PlacementToProto(*p, 1);
  spec.mutable_layers(0)->set_phy2log(0, 2);  // slot 0 now claims expert 2, log2phy says 0
  EXPECT_FALSE(PlacementFromProto(spec).ok());
}

}  // namespace
}  // namespace deepinfer
