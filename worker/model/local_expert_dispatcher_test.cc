// Tests for LocalExpertDispatcher: grouping by expert, weighted combine, unhosted experts.
#include "worker/model/local_expert_dispatcher.h"

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

TEST(LocalExpertDispatcherTest, GroupsRowsByExpertAndCombinesWeighted) {
  CpuBackend be(1);
  LocalExpertDispatcher d(&be, 4, 2, {0, 1, 2, 3});
  std::vector<float> hidden = {1, 2, 3, 4, 5, 6};  // 3 tokens
  std::vector<int32_t> ids = {2, 0, 0, 3, 2, 1};   // top-2 each
  std::vector<float> w = {0.5f, 1.0f, 2.0f, 1.0f, 1.0f, 3.0f};
  DispatchedTokens out;
  ASSERT_TRUE(d.Dispatch(0, 3, 2, hidden.data(), ids.data(), w.data(), &out).ok());
  EXPECT_EQ(out.group_offsets, (std::vector<int64_t>{0, 2, 3, 5, 6}));
  const float* rows = out.hidden->as<float>();
  // Expert 0: tokens 0, 1; expert 1: token 2; expert 2: tokens 0, 2; expert 3: token 1.
  std::vector<float> expect = {1, 2, 3, 4, 5, 6, 1, 2, 5, 6, 3, 4};
  EXPECT_EQ(std::vector<float>(rows, rows + 12), expect);
  // Identity "experts": combine gives sum_k w_k * x.
  std::vector<float> combined(6, 0.0f);
  ASSERT_TRUE(d.Combine(out, rows, combined.data()).ok());
  EXPECT_EQ(combined, (std::vector<float>{1.5f, 3.0f, 9.0f, 12.0f, 20.0f, 24.0f}));
}

TEST(LocalExpertDispatcherTest, UnhostedExpertIsAnError) {
  CpuBackend be(1);
  LocalExpertDispatcher d(&be, 4, 1, {0, 1});
  std::vector<float> hidden = {1};
  std::vector<int32_t> ids = {3};
  std::vector<float> w = {1};
  DispatchedTokens out;
  auto st = d.Dispatch(0, 1, 1, hidden.data(), ids.data(), w.data(), &out);
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace deepinfer
