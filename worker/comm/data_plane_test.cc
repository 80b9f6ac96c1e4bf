// The host side of the data plane: the --communicator choice and the unique-id hand-out over a
// TCP group (FormNcclCommunicator's bootstrap); NCCL itself is nccl_communicator_test (GPU).
#include "worker/comm/data_plane.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/tcp_test_group.h"

namespace deepinfer::comm {
namespace {

using ::testing::HasSubstr;
using testing::MakeTcpGroup;
using testing::OnAllRanks;
using testing::TcpGroup;

TEST(DataPlaneTest, ParsesTheFlag) {
  EXPECT_EQ(*ParseDataPlaneChoice("auto"), DataPlaneChoice::kAuto);
  EXPECT_EQ(*ParseDataPlaneChoice("tcp"), DataPlaneChoice::kTcp);
  EXPECT_EQ(*ParseDataPlaneChoice("nccl"), DataPlaneChoice::kNccl);
  absl::StatusOr<DataPlaneChoice> bad = ParseDataPlaneChoice("mpi");
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status()));
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("'mpi'"));
}

TEST(DataPlaneTest, AutoIsNcclOnlyForSeveralCudaRanks) {
  EXPECT_EQ(*ResolveDataPlane(DataPlaneChoice::kAuto, "cpu", 4), DataPlane::kTcp);
  EXPECT_EQ(*ResolveDataPlane(DataPlaneChoice::kAuto, "cuda", 1), DataPlane::kTcp);
  EXPECT_EQ(*ResolveDataPlane(DataPlaneChoice::kAuto, "cuda", 2),
            NcclAvailable() ? DataPlane::kNccl : DataPlane::kTcp);
  EXPECT_EQ(*ResolveDataPlane(DataPlaneChoice::kTcp, "cuda", 2), DataPlane::kTcp);
}

TEST(DataPlaneTest, NcclWithoutCudaIsAClearError) {
  absl::Status s = CheckDataPlaneChoice(DataPlaneChoice::kNccl, "cpu");
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("needs the cuda backend"));
  EXPECT_FALSE(ResolveDataPlane(DataPlaneChoice::kNccl, "cpu", 2).ok());
  absl::Status cuda = CheckDataPlaneChoice(DataPlaneChoice::kNccl, "cuda");
  if (NcclAvailable()) {
    EXPECT_TRUE(cuda.ok()) << cuda;
    EXPECT_EQ(*ResolveDataPlane(DataPlaneChoice::kNccl, "cuda", 1), DataPlane::kNccl);
  } else {
    EXPECT_TRUE(absl::IsUnimplemented(cuda)) << cuda;
  }
}

TEST(DataPlaneTest, ShareFromRankZeroGivesEveryRankRankZerosBytes) {
  constexpr int kWorld = 3;
  TcpGroup group = MakeTcpGroup(kWorld);
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  std::string id(128, '\0');
  for (size_t i = 0; i < id.size(); ++i) id[i] = static_cast<char>(i * 37 + 11);
  std::vector<absl::StatusOr<std::string>> got(kWorld, std::string());
  OnAllRanks(kWorld, [&](int r) {
    // The other ranks pass junk of the wrong size: it must be ignored.
    got[r] = ShareFromRankZero(group[r].get(), r == 0 ? id : std::string("junk"), id.size());
  });
  for (int r = 0; r < kWorld; ++r) {
    ASSERT_TRUE(got[r].ok()) << "rank " << r << ": " << got[r].status();
    EXPECT_EQ(*got[r], id) << "rank " << r;
  }
}

TEST(DataPlaneTest, ShareFromRankZeroWithTheWrongSizeFailsEveryRank) {
  constexpr int kWorld = 2;
  TcpGroup group = MakeTcpGroup(kWorld, absl::Seconds(20));
  ASSERT_EQ(group.size(), static_cast<size_t>(kWorld));
  std::vector<absl::Status> status(kWorld);
  OnAllRanks(kWorld,
             [&](int r) { status[r] = ShareFromRankZero(group[r].get(), "short", 128).status(); });
  EXPECT_TRUE(absl::IsInvalidArgument(status[0])) << status[0];
  EXPECT_THAT(std::string(status[0].message()), HasSubstr("5 bytes"));
  EXPECT_FALSE(status[1].ok());  // told by rank 0's abort instead of waiting out the timeout
}

TEST(DataPlaneTest, FormNcclWithoutNcclIsUnimplemented) {
  if (NcclAvailable()) GTEST_SKIP() << "NCCL build: nccl_communicator_test covers forming";
  TcpGroup group = MakeTcpGroup(1);
  ASSERT_EQ(group.size(), 1u);
  auto c = FormNcclCommunicator(group[0].get(), 0, nullptr, absl::Seconds(5));
  EXPECT_TRUE(absl::IsUnimplemented(c.status())) << c.status();
}

}  // namespace
}  // namespace deepinfer::comm
