// V4RouteF32 against CpuV4Ops::Route. Three kinds of input:
//  * continuous random logits and biases (V4-Flash's 256 experts top-6, sqrtsoftplus, at decode
//    and prefill token counts; sigmoid; no bias; expert counts that are not a multiple of 32):
//    the ids must match wherever the k-th and (k+1)-th biased scores are not within float noise
//    of each other (the GPU's expf / log1pf may differ from glibc's by an ulp, which can only
//    flip such a near-tie; those tokens are counted and must be rare), the weights within a
//    tolerance;
//  * logits from a few discrete values and no bias, so exact ties are everywhere and the tie
//    rule (the lower expert id first) decides on every token: ids exactly the CPU's;
//  * hash routing from a token-id table with repeated experts in a row: exactly the CPU's ids.
// V4RouteFromHiddenF32 (logits and routing in one launch) against V4RouteF32 on the logits it
// leaves (ids and weights bit for bit: the routing code is shared) and its logits against a
// double-precision dot of the hidden rows with the router weight, at 1 to 256 tokens, twice in a
// row (the tile counters must be left at zero for the second call).
#include "kernels/v4/v4_router.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_v4_ops.h"
#include "worker/backend/cpu/thread_pool.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;
using testing::RandomFloats;

struct Routed {
  std::vector<int32_t> ids;
  std::vector<float> weights;
};

struct Case {
  int64_t rows, experts, top_k;
  bool sqrtsoftplus, bias;
};

Routed OnCpu(const V4RouteArgs& args) {
  ThreadPool pool(2);
  CpuV4Ops cpu(&pool);
  Routed r;
  r.ids.resize(args.rows * args.top_k);
  r.weights.resize(args.rows * args.top_k);
  V4RouteArgs a = args;
  a.topk_ids = r.ids.data();
  a.topk_weights = r.weights.data();
  cpu.Route(a);
  return r;
}

// The same routing on the GPU: args' host arrays uploaded (hash_table of `vocab` rows).
Routed OnGpu(const V4RouteArgs& args, int64_t vocab) {
  const int64_t K = args.top_k;
  DeviceArray<float> dl(std::vector<float>(args.logits, args.logits + args.rows * args.experts));
  DeviceArray<float> db(args.bias != nullptr
                            ? std::vector<float>(args.bias, args.bias + args.experts)
                            : std::vector<float>());
  DeviceArray<int32_t> dt(args.hash_table != nullptr
                              ? std::vector<int32_t>(args.hash_table, args.hash_table + vocab * K)
                              : std::vector<int32_t>());
  DeviceArray<int32_t> dtok(args.token_ids != nullptr
                                ? std::vector<int32_t>(args.token_ids, args.token_ids + args.rows)
                                : std::vector<int32_t>());
  DeviceArray<int32_t> dids(args.rows * K);
  DeviceArray<float> dw(args.rows * K);
  dids.Poison();
  dw.Poison();
  V4RouteArgs d = args;
  d.logits = dl.get();
  d.bias = args.bias != nullptr ? db.get() : nullptr;
  d.hash_table = args.hash_table != nullptr ? dt.get() : nullptr;
  d.token_ids = args.token_ids != nullptr ? dtok.get() : nullptr;
  d.topk_ids = dids.get();
  d.topk_weights = dw.get();
  Routed r;
  EXPECT_EQ(kernels::V4RouteF32(d, nullptr), cudaSuccess);
  EXPECT_EQ(dids.Download(&r.ids), cudaSuccess);
  EXPECT_EQ(dw.Download(&r.weights), cudaSuccess);
  return r;
}

// The gap between the k-th and the (k+1)-th biased score of one token, in double.
double DecisionMargin(const float* logits, const float* bias, int64_t experts, int64_t top_k,
                      bool sqrtsoftplus) {
  std::vector<double> v(experts);
  for (int64_t x = 0; x < experts; ++x) {
    const double l = logits[x];
    const double s = sqrtsoftplus ? std::sqrt(std::log1p(std::exp(l))) : 1.0 / (1.0 + std::exp(-l));
    v[x] = s + (bias != nullptr ? bias[x] : 0.0);
  }
  std::sort(v.rbegin(), v.rend());
  return top_k < experts ? v[top_k - 1] - v[top_k] : 1e9;
}

TEST(V4RouterKernelTest, LearnedRoutingMatchesCpuAwayFromNearTies) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  for (const Case& c :
       {Case{1, 256, 6, true, true}, Case{64, 256, 6, true, true}, Case{128, 256, 6, true, true},
        Case{4096, 256, 6, true, true}, Case{333, 256, 6, false, true},
        Case{50, 256, 6, true, false}, Case{77, 72, 8, true, true}, Case{9, 8, 2, true, true},
        Case{5, 1000, 32, false, true}, Case{3, 5, 5, true, true}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "rows " << c.rows << " experts " << c.experts << " top_k " << c.top_k
                 << " sqrtsoftplus " << c.sqrtsoftplus << " bias " << c.bias << " seed " << seed);
    const auto logits = RandomFloats(c.rows * c.experts, seed, 2.0f);
    const auto bias = RandomFloats(c.experts, seed + 1, 0.3f);
    V4RouteArgs a;
    a.rows = c.rows;
    a.experts = c.experts;
    a.top_k = c.top_k;
    a.logits = logits.data();
    a.bias = c.bias ? bias.data() : nullptr;
    a.sqrtsoftplus = c.sqrtsoftplus;
    a.scaling = 2.5f;
    const Routed want = OnCpu(a), got = OnGpu(a, 0);
    int64_t near_ties = 0;
    std::vector<float> got_w, want_w;  // tokens whose ids agree
    for (int64_t t = 0; t < c.rows; ++t) {
      const auto row = [&](const std::vector<int32_t>& v) {
        return std::vector<int32_t>(v.begin() + t * c.top_k, v.begin() + (t + 1) * c.top_k);
      };
      if (row(got.ids) != row(want.ids)) {
        const double margin = DecisionMargin(logits.data() + t * c.experts, a.bias, c.experts,
                                             c.top_k, c.sqrtsoftplus);
        EXPECT_LT(margin, 1e-5) << "token " << t << " chose other experts away from a near-tie";
        ++near_ties;
        continue;
      }
      got_w.insert(got_w.end(), got.weights.begin() + t * c.top_k,
                   got.weights.begin() + (t + 1) * c.top_k);
      want_w.insert(want_w.end(), want.weights.begin() + t * c.top_k,
                    want.weights.begin() + (t + 1) * c.top_k);
    }
    EXPECT_LE(near_ties, std::max<int64_t>(1, c.rows / 100));
    EXPECT_TRUE(AllClose(got_w, want_w, 1e-6, 1e-5));
  }
}

TEST(V4RouterKernelTest, ExactTiesGoToTheLowerExpertId) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const int64_t rows = 500, experts = 256, top_k = 6;
  std::vector<float> logits(rows * experts);
  for (float& l : logits) l = static_cast<float>(static_cast<int>(gen() % 3)) - 1.0f;
  for (bool sqrtsoftplus : {true, false}) {
    V4RouteArgs a;
    a.rows = rows;
    a.experts = experts;
    a.top_k = top_k;
    a.logits = logits.data();
    a.sqrtsoftplus = sqrtsoftplus;
    const Routed want = OnCpu(a), got = OnGpu(a, 0);
    EXPECT_EQ(got.ids, want.ids) << "sqrtsoftplus " << sqrtsoftplus;
    EXPECT_TRUE(AllClose(got.weights, want.weights, 1e-6, 1e-5));
  }
}

TEST(V4RouterKernelTest, HashRoutingTakesTheTokensRowSortedById) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  for (const Case& c : {Case{1, 256, 6, true, false}, Case{200, 256, 6, true, false},
                        Case{31, 8, 2, false, false}}) {
    const int64_t vocab = 1000;
    std::vector<int32_t> table(vocab * c.top_k), tokens(c.rows);
    for (int32_t& e : table) e = static_cast<int32_t>(gen() % c.experts);
    table[0] = table[1] = 3;  // a repeated expert in token 0's row
    for (int32_t& t : tokens) t = static_cast<int32_t>(gen() % vocab);
    tokens[0] = 0;
    const auto logits = RandomFloats(c.rows * c.experts, seed + 1, 2.0f);
    const auto bias = RandomFloats(c.experts, seed + 2, 0.3f);
    V4RouteArgs a;
    a.rows = c.rows;
    a.experts = c.experts;
    a.top_k = c.top_k;
    a.logits = logits.data();
    a.bias = bias.data();  // not read by hash routing's choice
    a.hash_table = table.data();
    a.token_ids = tokens.data();
    a.sqrtsoftplus = c.sqrtsoftplus;
    a.scaling = 1.5f;
    const Routed want = OnCpu(a), got = OnGpu(a, vocab);
    EXPECT_EQ(got.ids, want.ids) << "experts " << c.experts;
    EXPECT_TRUE(AllClose(got.weights, want.weights, 1e-6, 1e-5)) << "experts " << c.experts;
  }
}

struct FromHiddenCase {
  int64_t rows, experts, top_k, hidden;
  bool sqrtsoftplus, bias, hash;
};

TEST(V4RouterKernelTest, RouteFromHiddenIsV4RouteOfItsOwnLogits) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  for (const FromHiddenCase& c :
       {FromHiddenCase{1, 256, 6, 4096, true, true, false},
        FromHiddenCase{2, 256, 6, 4096, true, true, false},
        FromHiddenCase{3, 256, 6, 4096, true, true, true},
        FromHiddenCase{7, 256, 6, 4096, true, true, false},
        FromHiddenCase{64, 256, 6, 4096, true, true, false},
        FromHiddenCase{128, 256, 6, 4096, true, true, true},
        FromHiddenCase{256, 256, 6, 512, false, true, false},
        FromHiddenCase{5, 72, 8, 2052, true, false, false},
        FromHiddenCase{1, 8, 2, 4, true, true, false}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "rows " << c.rows << " experts " << c.experts << " top_k " << c.top_k
                 << " hidden " << c.hidden << " sqrtsoftplus " << c.sqrtsoftplus << " bias "
                 << c.bias << " hash " << c.hash << " seed " << seed);
    const int64_t T = c.rows, E = c.experts, K = c.top_k, H = c.hidden, vocab = 1000;
    const auto hidden = RandomFloats(T * H, seed, 1.0f);
    const auto weight = RandomFloats(E * H, seed + 1, 0.05f);
    const auto bias = RandomFloats(E, seed + 2, 0.3f);
    std::mt19937 gen(seed + 3);
    std::vector<int32_t> table(vocab * K), tokens(T);
    for (int32_t& e : table) e = static_cast<int32_t>(gen() % E);
    for (int32_t& t : tokens) t = static_cast<int32_t>(gen() % vocab);
    DeviceArray<float> dh(hidden), dw(weight), db(bias), dlogits(T * E);
    DeviceArray<int32_t> dtable(table), dtok(tokens), dids(T * K);
    DeviceArray<float> dweights(T * K);
    DeviceArray<uint32_t> counters(std::vector<uint32_t>(T, 0));
    kernels::V4RouteFromHiddenParams p;
    V4RouteArgs& r = p.args.route;
    r.rows = T;
    r.experts = E;
    r.top_k = K;
    r.bias = c.bias ? db.get() : nullptr;
    r.hash_table = c.hash ? dtable.get() : nullptr;
    r.token_ids = c.hash ? dtok.get() : nullptr;
    r.sqrtsoftplus = c.sqrtsoftplus;
    r.scaling = 2.5f;
    r.topk_ids = dids.get();
    r.topk_weights = dweights.get();
    p.args.hidden = dh.get();
    p.args.hidden_size = H;
    p.args.router_weight = dw.get();
    p.logits = dlogits.get();
    p.tile_counters = counters.get();
    ASSERT_TRUE(kernels::V4RouteFromHiddenSupported(p.args));
    for (int call = 0; call < 2; ++call) {
      SCOPED_TRACE(::testing::Message() << "call " << call);
      dids.Poison();
      dweights.Poison();
      dlogits.Poison();
      ASSERT_EQ(kernels::V4RouteFromHiddenF32(p, nullptr), cudaSuccess);
      std::vector<float> logits, got_w;
      std::vector<int32_t> got_ids;
      std::vector<uint32_t> left;
      ASSERT_EQ(dlogits.Download(&logits), cudaSuccess);
      ASSERT_EQ(dids.Download(&got_ids), cudaSuccess);
      ASSERT_EQ(dweights.Download(&got_w), cudaSuccess);
      ASSERT_EQ(counters.Download(&left), cudaSuccess);
      EXPECT_EQ(left, std::vector<uint32_t>(T, 0)) << "tile counters not left at zero";
      // The logits against a double-precision dot: fp32 summation noise only.
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t e = 0; e < E; ++e) {
          double dot = 0.0, mag = 0.0;
          for (int64_t i = 0; i < H; ++i) {
            dot += double{hidden[t * H + i]} * weight[e * H + i];
            mag += std::fabs(double{hidden[t * H + i]} * weight[e * H + i]);
          }
          ASSERT_NEAR(logits[t * E + e], dot, 1e-5 * mag + 1e-30)
              << "token " << t << " expert " << e;
        }
      }
      // V4RouteF32 on those logits: the same ids and weights, bit for bit.
      V4RouteArgs again = r;
      again.bias = c.bias ? bias.data() : nullptr;
      again.hash_table = c.hash ? table.data() : nullptr;
      again.token_ids = c.hash ? tokens.data() : nullptr;
      again.logits = logits.data();
      const Routed want = OnGpu(again, vocab);
      EXPECT_EQ(got_ids, want.ids);
      ASSERT_EQ(got_w.size(), want.weights.size());
      EXPECT_EQ(0, std::memcmp(got_w.data(), want.weights.data(), got_w.size() * sizeof(float)))
          << "weights differ from V4RouteF32's bits";
    }
  }
}

TEST(V4RouterKernelTest, RouteFromHiddenRefusesWhatItDoesNotTake) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<float> dh(8 * 64), dw(300 * 64), dlogits(8 * 300), dweights(8 * 6);
  DeviceArray<int32_t> dids(8 * 6);
  DeviceArray<uint32_t> counters(std::vector<uint32_t>(8, 0));
  kernels::V4RouteFromHiddenParams p;
  p.args.route.rows = 8;
  p.args.route.experts = 256;
  p.args.route.top_k = 6;
  p.args.route.topk_ids = dids.get();
  p.args.route.topk_weights = dweights.get();
  p.args.hidden = dh.get();
  p.args.hidden_size = 64;
  p.args.router_weight = dw.get();
  p.logits = dlogits.get();
  p.tile_counters = counters.get();
  EXPECT_TRUE(kernels::V4RouteFromHiddenSupported(p.args));
  p.args.route.experts = kernels::kMaxV4RouteFromHiddenExperts + 1;  // more than a block keeps
  EXPECT_FALSE(kernels::V4RouteFromHiddenSupported(p.args));
  EXPECT_EQ(kernels::V4RouteFromHiddenF32(p, nullptr), cudaErrorInvalidValue);
  p.args.route.experts = 256;
  p.args.hidden_size = 62;  // not a multiple of 4
  EXPECT_FALSE(kernels::V4RouteFromHiddenSupported(p.args));
  p.args.hidden_size = 64;
  p.args.route.rows = kernels::kMaxV4RouteFromHiddenTokens + 1;
  EXPECT_FALSE(kernels::V4RouteFromHiddenSupported(p.args));
  p.args.route.rows = 8;
  p.args.hidden = dh.get() + 1;  // not 16-byte aligned
  EXPECT_FALSE(kernels::V4RouteFromHiddenSupported(p.args));
  p.args.hidden = dh.get();
  p.tile_counters = nullptr;
  EXPECT_EQ(kernels::V4RouteFromHiddenF32(p, nullptr), cudaErrorInvalidValue);
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
}

TEST(V4RouterKernelTest, BadShapesAreRefused) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  V4RouteArgs a;
  a.rows = 1;
  a.experts = 8;
  a.top_k = 9;
  EXPECT_EQ(kernels::V4RouteF32(a, nullptr), cudaErrorInvalidValue);
  a.top_k = kernels::kMaxV4RouteTopK + 1;
  a.experts = 1000;
  EXPECT_EQ(kernels::V4RouteF32(a, nullptr), cudaErrorInvalidValue);
  a.top_k = 2;
  int32_t table[2] = {0, 1};
  a.hash_table = table;  // without token ids
  EXPECT_EQ(kernels::V4RouteF32(a, nullptr), cudaErrorInvalidValue);
  a.hash_table = nullptr;
  a.rows = 0;
  EXPECT_EQ(kernels::V4RouteF32(a, nullptr), cudaSuccess);
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace deepinfer
