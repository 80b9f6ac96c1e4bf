// NoauxTcRouteF32 against CpuBackend::NoauxTcRoute. Two kinds of input:
//  * continuous random logits and biases: ids must match wherever the decision is not within
//    float noise of a tie (the GPU's expf may differ from glibc's by an ulp, which can only
//    flip a choice whose margin is that small; such tokens are counted and must be rare);
//  * logits from a few discrete values (zero bias), so exact ties are everywhere and the
//    tie rules (lower group / expert index first) are checked on every token.
#include "kernels/moe/noaux_tc_router.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe/noaux_tc_router_testing.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

struct RouterShape {
  int32_t experts, groups, topk_groups, top_k;
};

double DecisionMargin(const float* logits, const float* bias, const RouterShape& s) {
  return testing::NoauxTcDecisionMargin(logits, bias, s.experts, s.groups, s.topk_groups, s.top_k);
}

void RunAndCompare(const RouterShape& s, int32_t tokens, const std::vector<float>& logits,
                   const std::vector<float>& bias, bool check_margin) {
  CpuBackend cpu(2);
  std::vector<int32_t> want_ids(tokens * s.top_k);
  std::vector<float> want_w(tokens * s.top_k);
  NoauxTcRouteArgs a;
  a.num_tokens = tokens;
  a.num_experts = s.experts;
  a.router_logits = logits.data();
  a.correction_bias = bias.data();
  a.num_groups = s.groups;
  a.topk_groups = s.topk_groups;
  a.top_k = s.top_k;
  a.normalize = true;
  a.scaling_factor = 2.5f;
  a.topk_ids = want_ids.data();
  a.topk_weights = want_w.data();
  cpu.NoauxTcRoute(a);

  DeviceArray<float> dl(logits), db(bias), dw(want_w.size());
  DeviceArray<int32_t> dids(want_ids.size());
  dw.Poison();
  dids.Poison();
  kernels::NoauxTcRouteParams p;
  p.num_tokens = tokens;
  p.num_experts = s.experts;
  p.router_logits = dl.get();
  p.correction_bias = db.get();
  p.num_groups = s.groups;
  p.topk_groups = s.topk_groups;
  p.top_k = s.top_k;
  p.normalize = true;
  p.scaling_factor = 2.5f;
  p.topk_ids = dids.get();
  p.topk_weights = dw.get();
  DEEPINFER_CUDA_OK(kernels::NoauxTcRouteF32(p, nullptr));
  std::vector<int32_t> got_ids;
  std::vector<float> got_w;
  DEEPINFER_CUDA_OK(dids.Download(&got_ids));
  DEEPINFER_CUDA_OK(dw.Download(&got_w));
  int ambiguous = 0;
  for (int32_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> gi(got_ids.begin() + t * s.top_k, got_ids.begin() + (t + 1) * s.top_k);
    std::vector<int32_t> wi(want_ids.begin() + t * s.top_k, want_ids.begin() + (t + 1) * s.top_k);
    std::vector<float> gw(got_w.begin() + t * s.top_k, got_w.begin() + (t + 1) * s.top_k);
    std::vector<float> ww(want_w.begin() + t * s.top_k, want_w.begin() + (t + 1) * s.top_k);
    if (gi != wi && check_margin &&
        DecisionMargin(logits.data() + t * s.experts, bias.data(), s) < 1e-5) {
      ++ambiguous;
      continue;
    }
    EXPECT_EQ(gi, wi) << "token " << t;
    EXPECT_TRUE(AllClose(gw, ww, 1e-6, 1e-5)) << "token " << t;
  }
  EXPECT_LE(ambiguous, tokens / 100) << "too many near-tie tokens to be float noise";
}

class NoauxTcRouterKernelTest : public ::testing::TestWithParam<RouterShape> {};

TEST_P(NoauxTcRouterKernelTest, RandomInputsMatchCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const RouterShape s = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "experts " << s.experts << " seed " << seed);
  const int32_t tokens = 333;
  auto logits = testing::RandomFloats(tokens * s.experts, seed, 2.0f);
  auto bias = testing::RandomFloats(s.experts, seed + 1, 0.05f);
  RunAndCompare(s, tokens, logits, bias, /*check_margin=*/true);
}

TEST_P(NoauxTcRouterKernelTest, ExactTiesGoToLowerIndices) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const RouterShape s = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "experts " << s.experts << " seed " << seed);
  const int32_t tokens = 200;
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> pick(0, 3);
  // Four logit values whose sigmoids, and sums of two sigmoids, are >= 0.02 apart: equal
  // choices tie exactly, distinct ones are far from float noise. The bias is zero here because
  // an additive bias makes {s(x), s(y)+b} and {s(x)+b, s(y)} tie mathematically but not in fp32.
  const float logit_values[4] = {-2.0f, -0.5f, 0.3f, 1.1f};
  std::vector<float> logits(tokens * s.experts), bias(s.experts, 0.0f);
  for (float& v : logits) v = logit_values[pick(gen)];
  RunAndCompare(s, tokens, logits, bias, /*check_margin=*/false);
}

INSTANTIATE_TEST_SUITE_P(Shapes, NoauxTcRouterKernelTest,
                         ::testing::Values(RouterShape{256, 8, 4, 8}, RouterShape{16, 4, 2, 4},
                                           RouterShape{8, 2, 1, 2}, RouterShape{64, 1, 1, 6},
                                           RouterShape{384, 1, 1, 8}));

TEST(NoauxTcRouterKernelLimitsTest, RejectsUnsupportedShapes) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  kernels::NoauxTcRouteParams p;
  p.num_tokens = 1;
  p.num_experts = kernels::kMaxRouterExperts + 8;
  p.num_groups = 8;
  EXPECT_EQ(kernels::NoauxTcRouteF32(p, nullptr), cudaErrorInvalidValue);
  p.num_experts = 10;
  p.num_groups = 4;  // 10 experts do not split into 4 equal groups
  EXPECT_EQ(kernels::NoauxTcRouteF32(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepinfer
