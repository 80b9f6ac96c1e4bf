// RouteTokensF32 against two references:
//  * its own logits routed by NoauxTcRouteF32: ids and weights bit for bit (the routing code is
//    shared, only the logits' summation order is the kernel's own);
//  * the CPU backend's Gemm + NoauxTcRoute + AccumulateExpertCounts (the ops the model ran
//    before): logits within fp32 summation noise of a double-precision dot, ids equal wherever
//    the decision is not within float noise of a tie (counted; must be rare), weights close.
// Outputs are poisoned before every call; counts accumulate over repeated calls and a graph
// replay, honour count_limit, and the tile counters are left at zero.
#include "kernels/moe/noaux_tc_router_fused.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe/noaux_tc_router.h"
#include "kernels/moe/noaux_tc_router_testing.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

struct Shape {
  int32_t experts, groups, topk_groups, top_k, hidden;
};

struct Case {
  Shape s;
  int32_t tokens;
  bool normalize;
};

double DecisionMargin(const float* logits, const float* bias, const Shape& s) {
  return testing::NoauxTcDecisionMargin(logits, bias, s.experts, s.groups, s.topk_groups, s.top_k);
}

// The reference routing of T tokens: CpuBackend's Gemm (the logits) then NoauxTcRoute.
struct CpuRouting {
  std::vector<float> logits;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
CpuRouting RouteOnCpu(CpuBackend& cpu, const Shape& s, int32_t T, const std::vector<float>& hidden,
                      const std::vector<float>& weight, const std::vector<float>& bias,
                      bool normalize) {
  const int32_t E = s.experts, H = s.hidden, K = s.top_k;
  CpuRouting r;
  r.logits.resize(static_cast<size_t>(T) * E);
  r.ids.resize(static_cast<size_t>(T) * K);
  r.weights.resize(static_cast<size_t>(T) * K);
  cpu.Gemm(T, E, H, hidden.data(), H, weight.data(), H, r.logits.data(), E, false);
  NoauxTcRouteArgs a;
  a.num_tokens = T;
  a.num_experts = E;
  a.router_logits = r.logits.data();
  a.correction_bias = bias.data();
  a.num_groups = s.groups;
  a.topk_groups = s.topk_groups;
  a.top_k = K;
  a.normalize = normalize;
  a.scaling_factor = 2.446f;
  a.topk_ids = r.ids.data();
  a.topk_weights = r.weights.data();
  cpu.NoauxTcRoute(a);
  return r;
}

// The device buffers of one RouteTokensF32 call.
struct Buffers {
  Buffers(const Shape& s, int32_t tokens, const std::vector<float>& hidden,
          const std::vector<float>& weight, const std::vector<float>& bias)
      : hidden(hidden),
        weight(weight),
        bias(bias),
        logits(std::max(1, tokens * s.experts)),
        ids(std::max(1, tokens * s.top_k)),
        weights(std::max(1, tokens * s.top_k)),
        counts(std::vector<int64_t>(s.experts, 0)),
        limit(std::vector<int32_t>{0}),
        tile_counters(std::vector<uint32_t>(kernels::kFusedRouterTileCounters, 0)) {}
  DeviceArray<float> hidden, weight, bias, logits;
  DeviceArray<int32_t> ids;
  DeviceArray<float> weights;
  DeviceArray<int64_t> counts;
  DeviceArray<int32_t> limit;
  DeviceArray<uint32_t> tile_counters;
};

kernels::RouteTokensParams Params(const Shape& s, int32_t tokens, bool normalize, Buffers* b) {
  kernels::RouteTokensParams p;
  p.num_tokens = tokens;
  p.hidden_size = s.hidden;
  p.hidden = b->hidden.get();
  p.router_weight = b->weight.get();
  p.router_logits = b->logits.get();
  p.tile_counters = b->tile_counters.get();
  p.num_experts = s.experts;
  p.correction_bias = b->bias.get();
  p.num_groups = s.groups;
  p.topk_groups = s.topk_groups;
  p.top_k = s.top_k;
  p.normalize = normalize;
  p.scaling_factor = 2.446f;
  p.topk_ids = b->ids.get();
  p.topk_weights = b->weights.get();
  p.expert_counts = b->counts.get();
  return p;
}

// NoauxTcRouteF32 on the logits RouteTokensF32 left in b->logits.
void RouteOwnLogits(const Shape& s, int32_t tokens, bool normalize, Buffers* b,
                    std::vector<int32_t>* ids, std::vector<float>* weights) {
  DeviceArray<int32_t> dids(std::max(1, tokens * s.top_k));
  DeviceArray<float> dw(std::max(1, tokens * s.top_k));
  dids.Poison();
  dw.Poison();
  kernels::NoauxTcRouteParams r;
  r.num_tokens = tokens;
  r.num_experts = s.experts;
  r.router_logits = b->logits.get();
  r.correction_bias = b->bias.get();
  r.num_groups = s.groups;
  r.topk_groups = s.topk_groups;
  r.top_k = s.top_k;
  r.normalize = normalize;
  r.scaling_factor = 2.446f;
  r.topk_ids = dids.get();
  r.topk_weights = dw.get();
  ASSERT_EQ(kernels::NoauxTcRouteF32(r, nullptr), cudaSuccess);
  ASSERT_EQ(dids.Download(ids), cudaSuccess);
  ASSERT_EQ(dw.Download(weights), cudaSuccess);
}

std::vector<int64_t> Histogram(const std::vector<int32_t>& ids, int64_t pairs, int32_t experts) {
  std::vector<int64_t> h(experts, 0);
  for (int64_t i = 0; i < pairs; ++i) {
    if (ids[i] >= 0 && ids[i] < experts) ++h[ids[i]];
  }
  return h;
}

// One case: the CPU reference, then RouteTokensF32 (auto tile and every forced tile).
void CheckCase(const Case& c, uint32_t seed) {
  const Shape& s = c.s;
  const int32_t T = c.tokens, E = s.experts, K = s.top_k, H = s.hidden;
  SCOPED_TRACE(::testing::Message()
               << "experts " << E << " groups " << s.groups << "/" << s.topk_groups << " top-" << K
               << " hidden " << H << " tokens " << T << " normalize " << c.normalize << " seed "
               << seed);
  const std::vector<float> hidden = testing::RandomFloats(T * H, seed, 1.0f);
  const std::vector<float> weight = testing::RandomFloats(E * H, seed + 1, 0.03f);
  const std::vector<float> bias = testing::RandomFloats(E, seed + 2, 0.05f);

  // Reference: the CPU backend's ops, and a double-precision dot for the logits' noise bound.
  CpuBackend cpu(2);
  const CpuRouting want = RouteOnCpu(cpu, s, T, hidden, weight, bias, c.normalize);
  const std::vector<float>& want_logits = want.logits;
  const std::vector<int32_t>& want_ids = want.ids;
  const std::vector<float>& want_w = want.weights;
  std::vector<double> exact(T * E, 0.0), abs_sum(T * E, 0.0);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) {
      for (int k = 0; k < H; ++k) {
        const double product = static_cast<double>(hidden[t * H + k]) * weight[e * H + k];
        exact[t * E + e] += product;
        abs_sum[t * E + e] += std::abs(product);
      }
    }
  }

  int32_t auto_tm = 0, auto_te = 0;
  kernels::RouteTokensTile(T, &auto_tm, &auto_te);
  const std::vector<std::pair<int32_t, int32_t>> tiles = {
      {0, 0}, {1, 1}, {1, 2}, {2, 1}, {2, 2}, {4, 1}, {4, 2}, {8, 1}, {8, 2}, {8, 4}, {8, 8}};
  for (const auto& [tm, te] : tiles) {
    SCOPED_TRACE(::testing::Message()
                 << "tile " << tm << "x" << te << " (auto " << auto_tm << "x" << auto_te << ")");
    Buffers b(s, T, hidden, weight, bias);
    std::vector<int64_t> initial(E);
    for (int e = 0; e < E; ++e) initial[e] = 1000 + 7 * e;
    b.counts.Upload(initial);
    // Pairs of the last token are padding: not counted.
    const int32_t limit = (T - 1) * K;
    b.limit.Upload({limit});
    kernels::RouteTokensParams p = Params(s, T, c.normalize, &b);
    p.count_limit = b.limit.get();
    p.tile_tokens = tm;
    p.tile_experts = te;
    constexpr int kCalls = 3;
    std::vector<int32_t> got_ids;
    std::vector<float> got_w, got_logits;
    for (int call = 0; call < kCalls; ++call) {
      b.ids.Poison();
      b.weights.Poison();
      b.logits.Poison();
      ASSERT_EQ(kernels::RouteTokensF32(p, nullptr), cudaSuccess);
      ASSERT_EQ(b.ids.Download(&got_ids), cudaSuccess);
      ASSERT_EQ(b.weights.Download(&got_w), cudaSuccess);
      ASSERT_EQ(b.logits.Download(&got_logits), cudaSuccess);
    }

    // Logits: fp32 sums of the same products in another order.
    int bad_logits = 0;
    for (int i = 0; i < T * E; ++i) {
      if (!(std::abs(got_logits[i] - exact[i]) <= 1e-6 * abs_sum[i] + 1e-7)) ++bad_logits;
    }
    EXPECT_EQ(bad_logits, 0) << "logits beyond fp32 summation noise";

    // The routing of those logits is NoauxTcRouteF32's, bit for bit.
    std::vector<int32_t> own_ids;
    std::vector<float> own_w;
    RouteOwnLogits(s, T, c.normalize, &b, &own_ids, &own_w);
    EXPECT_EQ(got_ids, own_ids);
    for (size_t i = 0; i < got_w.size(); ++i) {
      ASSERT_EQ(got_w[i], own_w[i]) << "weight " << i << " differs from NoauxTcRouteF32's";
    }

    // Against the CPU ops: the same choices except within float noise of a tie.
    int ambiguous = 0;
    for (int t = 0; t < T; ++t) {
      const std::vector<int32_t> gi(got_ids.begin() + t * K, got_ids.begin() + (t + 1) * K);
      const std::vector<int32_t> wi(want_ids.begin() + t * K, want_ids.begin() + (t + 1) * K);
      if (gi != wi && DecisionMargin(want_logits.data() + t * E, bias.data(), s) < 1e-5) {
        ++ambiguous;
        continue;
      }
      EXPECT_EQ(gi, wi) << "token " << t;
      const std::vector<float> gw(got_w.begin() + t * K, got_w.begin() + (t + 1) * K);
      const std::vector<float> ww(want_w.begin() + t * K, want_w.begin() + (t + 1) * K);
      EXPECT_TRUE(AllClose(gw, ww, 1e-6, 1e-5)) << "token " << t;
    }
    EXPECT_LE(ambiguous, std::max(1, T / 50)) << "too many near-tie tokens to be float noise";

    // Counts: initial + kCalls x the choices of all but the last token.
    std::vector<int64_t> counts;
    ASSERT_EQ(b.counts.Download(&counts), cudaSuccess);
    const std::vector<int64_t> h = Histogram(got_ids, limit, E);
    for (int e = 0; e < E; ++e) {
      ASSERT_EQ(counts[e], initial[e] + kCalls * h[e]) << "expert " << e;
    }
    std::vector<uint32_t> tile_counters;
    ASSERT_EQ(b.tile_counters.Download(&tile_counters), cudaSuccess);
    EXPECT_EQ(tile_counters, std::vector<uint32_t>(kernels::kFusedRouterTileCounters, 0));
  }
}

class RouteTokensTest : public ::testing::TestWithParam<Case> {};

TEST_P(RouteTokensTest, MatchesCpuOpsAndNoauxTcRouteOnItsOwnLogits) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CheckCase(GetParam(), testing::FreshSeed());
}

constexpr Shape kMoonlight{64, 1, 1, 6, 2048};
constexpr Shape kGrouped{256, 8, 4, 8, 1024};  // DeepSeek-V3's router, a shorter hidden size
constexpr Shape kSmallGroups{16, 4, 2, 4, 256};

INSTANTIATE_TEST_SUITE_P(Sizes, RouteTokensTest,
                         ::testing::Values(Case{kMoonlight, 1, true}, Case{kMoonlight, 2, true},
                                           Case{kMoonlight, 7, false}, Case{kMoonlight, 64, true},
                                           Case{kMoonlight, 128, true},
                                           Case{kMoonlight, 256, false}, Case{kGrouped, 1, true},
                                           Case{kGrouped, 7, false}, Case{kGrouped, 128, true},
                                           Case{kSmallGroups, 2, true},
                                           Case{kSmallGroups, 64, false}));

// One-hot hidden rows make each logit one exact product, so equal weights give exactly equal
// logits: the tie rules (lower group, then lower expert index) against the CPU, bit for bit.
TEST(RouteTokensTieTest, ExactTiesGoToLowerIndices) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  for (const Shape& s : {Shape{64, 1, 1, 6, 64}, Shape{256, 8, 4, 8, 64}}) {
    const int32_t T = 40, E = s.experts, H = s.hidden;
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int> pick(0, 3), column(0, H - 1);
    const float values[4] = {-2.0f, -0.5f, 0.3f, 1.1f};
    std::vector<float> hidden(T * H, 0.0f), weight(E * H), bias(E, 0.0f);
    for (int t = 0; t < T; ++t) hidden[t * H + column(gen)] = 1.0f;
    for (float& w : weight) w = values[pick(gen)];
    CpuBackend cpu(2);
    const CpuRouting want = RouteOnCpu(cpu, s, T, hidden, weight, bias, /*normalize=*/true);
    const std::vector<int32_t>& want_ids = want.ids;
    const std::vector<float>& want_w = want.weights;

    Buffers b(s, T, hidden, weight, bias);
    b.ids.Poison();
    b.weights.Poison();
    kernels::RouteTokensParams p = Params(s, T, true, &b);
    p.expert_counts = nullptr;
    ASSERT_EQ(kernels::RouteTokensF32(p, nullptr), cudaSuccess);
    std::vector<int32_t> got_ids;
    std::vector<float> got_w;
    ASSERT_EQ(b.ids.Download(&got_ids), cudaSuccess);
    ASSERT_EQ(b.weights.Download(&got_w), cudaSuccess);
    EXPECT_EQ(got_ids, want_ids) << "experts " << E;
    EXPECT_TRUE(AllClose(got_w, want_w, 1e-6, 1e-6)) << "experts " << E;
  }
}

// Recorded once in a CUDA graph and replayed: the tile counters are back at zero after every
// call, so each replay routes again, and the counts add up.
TEST(RouteTokensGraphTest, ReplaysRouteAgainAndCount) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Shape s = kMoonlight;
  const int32_t T = 8;
  Buffers b(s, T, testing::RandomFloats(T * s.hidden, seed, 1.0f),
            testing::RandomFloats(s.experts * s.hidden, seed + 1, 0.03f),
            testing::RandomFloats(s.experts, seed + 2, 0.05f));
  kernels::RouteTokensParams p = Params(s, T, true, &b);
  cudaStream_t stream;
  DEEPINFER_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  DEEPINFER_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  ASSERT_EQ(kernels::RouteTokensF32(p, stream), cudaSuccess);
  DEEPINFER_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  cudaGraphExec_t exec;
  DEEPINFER_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  std::vector<int32_t> first;
  constexpr int kReplays = 4;
  for (int r = 0; r < kReplays; ++r) {
    b.ids.Poison();
    DEEPINFER_CUDA_OK(cudaDeviceSynchronize());  // the poison (default stream) first
    DEEPINFER_CUDA_OK(cudaGraphLaunch(exec, stream));
    DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<int32_t> ids;
    ASSERT_EQ(b.ids.Download(&ids), cudaSuccess);
    if (r == 0) first = ids;
    EXPECT_EQ(ids, first) << "replay " << r;
  }
  std::vector<int64_t> counts;
  ASSERT_EQ(b.counts.Download(&counts), cudaSuccess);
  const std::vector<int64_t> h = Histogram(first, T * s.top_k, s.experts);
  for (int e = 0; e < s.experts; ++e) EXPECT_EQ(counts[e], kReplays * h[e]) << "expert " << e;
  DEEPINFER_CUDA_OK(cudaGraphExecDestroy(exec));
  DEEPINFER_CUDA_OK(cudaGraphDestroy(graph));
  DEEPINFER_CUDA_OK(cudaStreamDestroy(stream));
}

TEST(RouteTokensLimitsTest, RejectsWhatItCannotRun) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Shape s = kMoonlight;
  Buffers b(s, 4, std::vector<float>(4 * s.hidden + 1, 0.5f),
            std::vector<float>(s.experts * s.hidden, 0.01f), std::vector<float>(s.experts, 0.0f));
  const kernels::RouteTokensParams good = Params(s, 4, true, &b);
  EXPECT_TRUE(kernels::RouteTokensSupported(good));
  kernels::RouteTokensParams p = good;
  p.num_tokens = kernels::kMaxFusedRouterTokens + 1;
  EXPECT_FALSE(kernels::RouteTokensSupported(p));
  EXPECT_EQ(kernels::RouteTokensF32(p, nullptr), cudaErrorInvalidValue);
  p = good;
  p.hidden_size = 2046;  // not a multiple of 4
  EXPECT_EQ(kernels::RouteTokensF32(p, nullptr), cudaErrorInvalidValue);
  p = good;
  p.hidden = b.hidden.get() + 1;  // not 16-byte aligned
  EXPECT_EQ(kernels::RouteTokensF32(p, nullptr), cudaErrorInvalidValue);
  p = good;
  p.num_experts = kernels::kMaxFusedRouterExperts + 128;
  EXPECT_EQ(kernels::RouteTokensF32(p, nullptr), cudaErrorInvalidValue);
  p = good;
  p.num_groups = 5;  // 64 experts do not split into 5 groups
  EXPECT_EQ(kernels::RouteTokensF32(p, nullptr), cudaErrorInvalidValue);
  p = good;
  p.tile_counters = nullptr;
  EXPECT_EQ(kernels::RouteTokensF32(p, nullptr), cudaErrorInvalidValue);
  p = good;
  p.tile_tokens = 4;
  p.tile_experts = 8;  // 8 experts per block only with 8 tokens
  EXPECT_EQ(kernels::RouteTokensF32(p, nullptr), cudaErrorInvalidValue);
  p = good;
  p.num_tokens = 0;
  EXPECT_EQ(kernels::RouteTokensF32(p, nullptr), cudaSuccess);
}

}  // namespace
}  // namespace deepinfer
