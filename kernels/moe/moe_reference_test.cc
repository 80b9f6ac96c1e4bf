// The host reference against what the model runs today: LocalExpertDispatcher (host plan,
// GatherRows / ScatterAddRows) on the CPU backend for the permutation and the combine, and
// CpuBackend::GroupedGemm (fp32 weights widened from the same bf16) for the grouped GEMM.
// Router-style routing (ids ascending within a token) over all local experts, where the two
// combine orders coincide, must match bit for bit.
#include "kernels/moe/moe_reference.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/local_expert_dispatcher.h"

namespace deepinfer {
namespace {

std::vector<float> RandomFloats(size_t n, std::mt19937& gen, float stddev) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

TEST(MoeReferenceTest, PermuteAndCombineMatchLocalExpertDispatcher) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const int32_t tokens = 53, top_k = 6, experts = 64, hidden = 40;
  std::vector<int32_t> ids;
  std::vector<int32_t> perm(experts);
  std::iota(perm.begin(), perm.end(), 0);
  for (int32_t t = 0; t < tokens; ++t) {
    std::shuffle(perm.begin(), perm.end(), gen);
    std::vector<int32_t> pick(perm.begin(), perm.begin() + top_k);
    std::sort(pick.begin(), pick.end());  // as the noaux_tc router emits them
    ids.insert(ids.end(), pick.begin(), pick.end());
  }
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  std::vector<float> weights(ids.size());
  for (float& w : weights) w = u(gen);
  const auto h = RandomFloats(size_t(tokens) * hidden, gen, 1.0f);
  std::vector<int32_t> slot_of_expert(experts);
  std::iota(slot_of_expert.begin(), slot_of_expert.end(), 0);

  const kernels::MoePermutation ref = kernels::MoePermuteReference(
      tokens, top_k, experts, experts, ids.data(), slot_of_expert.data(), hidden, h.data());

  CpuBackend cpu(2);
  std::vector<int64_t> local(experts);
  std::iota(local.begin(), local.end(), 0);
  LocalExpertDispatcher dispatcher(&cpu, experts, hidden, local);
  DispatchedTokens d;
  ASSERT_TRUE(dispatcher.Dispatch(0, tokens, top_k, h.data(), ids.data(), weights.data(), &d).ok());
  ASSERT_EQ(d.num_rows, ref.slot_offsets.back());
  ASSERT_EQ(d.group_offsets.size(), ref.slot_offsets.size());
  for (size_t i = 0; i < d.group_offsets.size(); ++i) {
    EXPECT_EQ(d.group_offsets[i], ref.slot_offsets[i]) << "slot " << i;
  }
  for (int32_t s = 0; s < experts; ++s) {
    EXPECT_EQ(ref.slot_counts[s], ref.slot_offsets[s + 1] - ref.slot_offsets[s]);
  }
  ASSERT_EQ(0, std::memcmp(d.hidden->data(), ref.permuted_hidden.data(),
                           ref.permuted_hidden.size() * sizeof(float)));
  ASSERT_EQ(0, std::memcmp(d.row_token->data(), ref.row_token.data(),
                           ref.row_token.size() * sizeof(int32_t)));
  // Each choice's row holds that choice's token.
  for (int32_t i = 0; i < tokens * top_k; ++i)
    EXPECT_EQ(ref.row_token[ref.choice_row[i]], i / top_k);

  const auto expert_out = RandomFloats(size_t(d.num_rows) * hidden, gen, 1.0f);
  std::vector<float> want(size_t(tokens) * hidden, 0.0f), got = want;
  ASSERT_TRUE(dispatcher.Combine(d, expert_out.data(), want.data()).ok());
  kernels::MoeCombineReference(tokens, top_k, hidden, ref.choice_row.data(), weights.data(),
                               expert_out.data(), got.data());
  EXPECT_EQ(0, std::memcmp(got.data(), want.data(), got.size() * sizeof(float)))
      << "combine not bit-identical to LocalExpertDispatcher::Combine";
}

TEST(MoeReferenceTest, NonLocalAndInvalidChoicesGetNoRow) {
  // Experts 0..3; slot map {1, -1, 0, -1}: expert 2 -> slot 0, expert 0 -> slot 1.
  const std::vector<int32_t> ids = {0, 2, 1, 3, 2, 7, -1, 0};  // 4 tokens, top-2
  const std::vector<int32_t> map = {1, -1, 0, -1};
  const std::vector<float> h = {10, 11, 12, 13};  // hidden 1
  const auto p = kernels::MoePermuteReference(4, 2, 4, 2, ids.data(), map.data(), 1, h.data());
  EXPECT_EQ(p.slot_counts, (std::vector<int32_t>{2, 2}));
  EXPECT_EQ(p.slot_offsets, (std::vector<int32_t>{0, 2, 4}));
  // Slot 0 (expert 2): choices (0,1), (2,0); slot 1 (expert 0): (0,0), (3,1).
  EXPECT_EQ(p.choice_row, (std::vector<int32_t>{2, 0, -1, -1, 1, -1, -1, 3}));
  EXPECT_EQ(p.row_token, (std::vector<int32_t>{0, 2, 0, 3}));
  EXPECT_EQ(p.permuted_hidden, (std::vector<float>{10, 12, 10, 13}));
  const std::vector<float> w = {0.5f, 0.25f, 1, 1, 2, 1, 1, 4};
  const std::vector<float> y = {1, 2, 3, 4};
  std::vector<float> out = {100, 0, 0, 0};
  kernels::MoeCombineReference(4, 2, 1, p.choice_row.data(), w.data(), y.data(), out.data());
  EXPECT_EQ(out, (std::vector<float>{100 + 0.5f * 3 + 0.25f * 1, 0, 2 * 2, 4 * 4}));
}

TEST(MoeReferenceTest, GroupedGemmMatchesCpuBackendOnWidenedWeights) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const int32_t n = 24, k = 72;
  const std::vector<int32_t> offsets = {0, 3, 3, 4, 11};
  const int32_t slots = 4, rows = offsets.back();
  const auto x = RandomFloats(size_t(rows) * k, gen, 1.0f);
  const auto wf = RandomFloats(size_t(slots) * n * k, gen, 0.1f);
  std::vector<uint16_t> w(wf.size());
  std::vector<float> widened(wf.size());
  for (size_t i = 0; i < w.size(); ++i) {
    w[i] = kernels::FloatToBf16(wf[i]);
    widened[i] = kernels::Bf16ToFloat(w[i]);
    ASSERT_LE(std::abs(widened[i] - wf[i]), std::abs(wf[i]) * std::ldexp(1.0f, -8));
  }
  std::vector<const uint16_t*> wp;
  std::vector<WeightView> fp;
  for (int32_t s = 0; s < slots; ++s) {
    wp.push_back(w.data() + size_t(s) * n * k);
    fp.push_back(widened.data() + size_t(s) * n * k);
  }
  std::vector<float> got(size_t(rows) * n), want(got.size());
  kernels::GroupedGemmBf16Reference(slots, offsets.data(), n, k, x.data(), wp, got.data());
  CpuBackend cpu(2);
  cpu.GroupedGemm(std::vector<int64_t>(offsets.begin(), offsets.end()), fp, n, k, x.data(),
                  want.data());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-4f) << i;
}

TEST(MoeReferenceTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(kernels::FloatToBf16(1.0f), 0x3f80);
  EXPECT_EQ(kernels::Bf16ToFloat(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(kernels::FloatToBf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  EXPECT_EQ(kernels::FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_TRUE(std::isnan(kernels::Bf16ToFloat(kernels::FloatToBf16(std::nanf("")))));
}

}  // namespace
}  // namespace deepinfer
