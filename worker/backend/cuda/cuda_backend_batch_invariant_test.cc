// CudaBackend's batch-invariant mode (CudaTuning::batch_invariant) op by op: a row's output does
// not depend on how many rows the call has or where the row sits among them (bit for bit), and
// the results match CpuBackend (the fp32 and bf16 references) within the bounds of
// cuda_backend_gemm_test: Gemm (fp32 and bf16 weights, fp32 and bf16 activations, with
// accumulation and strides, the pipelined tensor-core and the warp kernels; the pipelined
// kernel's row tiles of 16 to 128 rows, column tiles of 64 and 128 and k splits of 1 to 8, calls
// of up to 4353 rows) and BatchedGemm (the absorbed-MLA layouts), RoutedExperts (the grouped
// expert GEMMs) and RouteTokens (the one-launch router in calls of at most 256 tokens). Skips
// without a GPU.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_backend_test_fixture.h"

namespace deepinfer {
namespace {

using testing::AllClose;

// Rows [first, first + rows) of `all` (row stride ld) equal `part` (rows x ld) bit for bit.
::testing::AssertionResult SameRows(const std::vector<float>& all, const std::vector<float>& part,
                                    int64_t first, int64_t rows, int64_t cols, int64_t ld) {
  for (int64_t r = 0; r < rows; ++r) {
    if (std::memcmp(&all[(first + r) * ld], &part[r * ld], cols * sizeof(float)) != 0) {
      for (int64_t j = 0; j < cols; ++j) {
        if (std::memcmp(&all[(first + r) * ld + j], &part[r * ld + j], sizeof(float)) != 0) {
          return ::testing::AssertionFailure()
                 << "row " << first + r << " column " << j << ": " << all[(first + r) * ld + j]
                 << " in the full batch, " << part[r * ld + j] << " in " << rows
                 << " rows from row " << first;
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

class BatchInvariantTest : public testing::CudaBackendTest {
 protected:
  void SetUp() override {
    CudaBackendTest::SetUp();
    if (IsSkipped()) return;
    CudaTuning tuning;
    tuning.batch_invariant = true;
    auto b = CudaBackend::Create(0, WeightDType::kBFloat16, tuning);
    ASSERT_TRUE(b.ok()) << b.status();
    gpu_ = std::move(*b);
  }

  struct GemmCase {
    int64_t n, k, lda, ldc;
    WeightDType w;
  };

  // Gemm over `rows` rows of random activations (fp32 and bf16 ones where the weights are bf16,
  // with and without accumulation): rows [checked_first, checked_first + 40) against the CPU
  // backend, and each (first, rows) of `parts` in a call of its own bit for bit equal to the same
  // rows of the full call.
  void ExpectGemmRowsInvariant(const GemmCase& c, int64_t rows, int64_t checked_first,
                               const std::vector<std::pair<int64_t, int64_t>>& parts) {
    const bool bf16 = c.w == WeightDType::kBFloat16;
    for (bool a_bf16 : {false, true}) {
      if (a_bf16 && !bf16) continue;
      for (bool accumulate : {false, true}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << WeightDTypeName(c.w) << " n " << c.n << " k " << c.k
                                          << " a " << (a_bf16 ? "bf16" : "fp32") << " accumulate "
                                          << accumulate << " seed " << seed);
        auto a = testing::RandomFloats(rows * c.lda, seed);
        if (a_bf16) {
          for (float& v : a) v = Bf16BitsToFloat(FloatToBf16Bits(v));  // the values sent as bf16
        }
        auto w = testing::RandomFloats(c.n * c.k, seed + 1);
        auto out = testing::RandomFloats(rows * c.ldc, seed + 2);
        std::vector<std::unique_ptr<DeviceBuffer>> keep;
        auto dw = Upload(w);
        const WeightView gw = bf16 ? GpuBf16(w, &keep) : WeightView(dw->as<float>());
        // The activations on the device, as fp32 or as bf16 bits.
        std::unique_ptr<DeviceBuffer> da;
        if (a_bf16) {
          std::vector<uint16_t> bits(a.size());
          for (size_t i = 0; i < a.size(); ++i) bits[i] = FloatToBf16Bits(a[i]);
          da = gpu_->Allocate(bits.size() * sizeof(uint16_t));
          gpu_->CopyToDevice(bits.data(), bits.size() * sizeof(uint16_t), da->data());
        } else {
          da = Upload(a);
        }
        auto view = [&](int64_t first) {
          return a_bf16 ? ActivationView::Bf16(da->as<uint16_t>() + first * c.lda)
                        : ActivationView(da->as<float>() + first * c.lda);
        };
        auto full = Upload(out);
        gpu_->Gemm(rows, c.n, c.k, view(0), c.lda, gw, c.k, full->as<float>(), c.ldc, accumulate);
        const std::vector<float> all = Download(*full);
        // Against the CPU backend on the first kCheckedRows rows (bf16: the same rounded weights;
        // the activations rounded as the GPU rounds them).
        const int64_t kCheckedRows = 40;  // a block of 32 rows and one of 8
        const int64_t f0 = checked_first;
        std::vector<float> want(out.begin() + f0 * c.ldc,
                                out.begin() + (f0 + kCheckedRows) * c.ldc);
        std::vector<float> a_cpu(a.begin() + f0 * c.lda, a.begin() + (f0 + kCheckedRows) * c.lda);
        if (bf16) {
          for (float& v : a_cpu) v = Bf16BitsToFloat(FloatToBf16Bits(v));
        }
        (bf16 ? cpu16_ : cpu_)
            .Gemm(kCheckedRows, c.n, c.k, a_cpu.data(), c.lda,
                  bf16 ? CpuBf16(w, &keep) : WeightView(w.data()), c.k, want.data(), c.ldc,
                  accumulate);
        // Another fp32 summation order over k exact products: the difference grows about as
        // sqrt(k) times the partial sums (~sqrt(k)), so the absolute bound scales with k / 1024
        // from cuda_backend_gemm_test's bounds at k <= 1024 (widened for bf16's coarser
        // tensor-core accumulation).
        const double scale = std::max(1.0, static_cast<double>(c.k) / 1024.0);
        EXPECT_TRUE(AllClose(
            std::vector<float>(all.begin() + f0 * c.ldc, all.begin() + (f0 + kCheckedRows) * c.ldc),
            want, (bf16 ? 2e-3 : 4e-4) * scale, bf16 ? 1e-4 : 1e-5));
        // The same rows in calls of other sizes, at other places.
        for (const auto& [first, part_rows] : parts) {
          std::vector<float> init(out.begin() + first * c.ldc,
                                  out.begin() + (first + part_rows) * c.ldc);
          auto part = Upload(init);
          gpu_->Gemm(part_rows, c.n, c.k, view(first), c.lda, gw, c.k, part->as<float>(), c.ldc,
                     accumulate);
          EXPECT_TRUE(SameRows(all, Download(*part), first, part_rows, c.n, c.ldc));
        }
      }
    }
  }
};

// Shapes of the Moonlight decode GEMMs (q, kv_a, o_proj, the shared experts' gate_up and down, the
// dense gate_up and down, the router with fp32 weights), a wide one as the LM head, and odd ones
// that only the warp kernel takes. The pipelined kernel's row tile follows the call's rows (16
// to 128), its column tile the block count (64 or 128 columns), its k split the shape (8 for
// kv_a, 4 for q, o_proj and the down projections, 2 for the shared gate_up, 1 for the rest); fp32
// activations are rounded to bf16 in a pass of their own; the warp kernel takes 2 x 4 tiles for
// many outputs (the router at 256 and 201 rows), one output a warp for few.
TEST_F(BatchInvariantTest, GemmRowsAreTheSameAtEveryBatchSizeAndMatchCpu) {
  const std::vector<GemmCase> cases = {
      {3072, 2048, 2048, 3072, WeightDType::kBFloat16},
      {576, 2048, 2048, 576, WeightDType::kBFloat16},
      {2048, 2048, 2056, 2050, WeightDType::kBFloat16},
      {5632, 2048, 2048, 5632, WeightDType::kBFloat16},
      {2048, 2816, 2816, 2048, WeightDType::kBFloat16},
      {22528, 2048, 2048, 22528, WeightDType::kBFloat16},
      {2048, 11264, 11264, 2048, WeightDType::kBFloat16},
      {65536, 512, 512, 65536, WeightDType::kBFloat16},
      {29, 45, 50, 31, WeightDType::kBFloat16},
      {64, 2048, 2048, 64, WeightDType::kFloat32},
      {37, 45, 45, 37, WeightDType::kFloat32},
  };
  for (const GemmCase& c : cases) {
    ExpectGemmRowsInvariant(
        c, 256, 0,
        {{0, 1}, {255, 1}, {77, 1}, {3, 2}, {100, 5}, {8, 33}, {200, 56}, {1, 130}, {3, 201}});
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// Prefill-sized calls (up to 4353 rows) across the pipelined kernel's row and column tiles (the
// 128-row tile of many row tiles, 128 columns from 264 blocks): a row summed by any tile, at any
// place in it, is the same bit for bit. The shapes: Moonlight's q (4 k splits) and kv_a (8), n not
// a multiple of the tile, k whose 64-wide steps split unevenly over the 4 splits and end in a
// partial step (k = 1416: 23 steps, the last of 8 values), and k of too few steps to split
// (k = 136: 3 steps, one split).
TEST_F(BatchInvariantTest, GemmRowsAreTheSameAcrossTileSizesAtPrefillRowCounts) {
  const std::vector<GemmCase> cases = {
      {3072, 2048, 2048, 3072, WeightDType::kBFloat16},
      {576, 2048, 2048, 576, WeightDType::kBFloat16},
      {1000, 1416, 1416, 1003, WeightDType::kBFloat16},
      {1000, 136, 144, 1000, WeightDType::kBFloat16},
  };
  const int64_t kRows = 4353;
  for (const GemmCase& c : cases) {
    // CPU-checked rows in the last, partial 128-row tile of the full call; parts that take the
    // 16- to 128-row tiles, one row tile or many, 64 or 128 columns by the shape.
    ExpectGemmRowsInvariant(c, kRows, 4300,
                            {{0, 1},
                             {4352, 1},
                             {100, 5},
                             {8, 33},
                             {1, 130},
                             {300, 700},
                             {17, 2100},
                             {129, 3800},
                             {255, 4098}});
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// W_uk and W_uv of Moonlight's 16 heads (BatchedGemm), fp32 and bf16 weights.
TEST_F(BatchInvariantTest, BatchedGemmRowsAreTheSameAtEveryBatchSizeAndMatchCpu) {
  const int64_t nh = 16, nope = 128, rope = 64, vd = 128, kvl = 512, qk = nope + rope;
  struct Case {
    const char* name;
    int64_t n, k, lda, stride_a, ldw, stride_w, ldc, stride_c, a_row, w_size, c_row;
  };
  // bf16 weights at 64 tokens: one row tile of 64 rows; at 1100 many 128-row tiles (w_uk: no k
  // split, w_uv: 2), 128 columns where they give 264 blocks.
  for (const int64_t T : {int64_t{64}, int64_t{1100}}) {
    for (Case c : {Case{"w_uk", kvl, nope, nh * qk, qk, nope, kvl * nope, nh * kvl, kvl, nh * qk,
                        nh * kvl * nope, nh * kvl},
                   Case{"w_uv", vd, kvl, nh * kvl, kvl, kvl, (nope + vd) * kvl, nh * vd, vd,
                        nh * kvl, nh * (nope + vd) * kvl, nh * vd}}) {
      for (WeightDType dt : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << c.name << " " << WeightDTypeName(dt) << " tokens " << T
                                          << " seed " << seed);
        auto a = testing::RandomFloats(T * c.a_row, seed);
        auto w = testing::RandomFloats(c.w_size, seed + 1);
        std::vector<std::unique_ptr<DeviceBuffer>> keep;
        auto dw = Upload(w), da = Upload(a);
        const WeightView cw =
            dt == WeightDType::kFloat32 ? WeightView(w.data()) : CpuBf16(w, &keep);
        const WeightView gw =
            dt == WeightDType::kFloat32 ? WeightView(dw->as<float>()) : GpuBf16(w, &keep);
        std::vector<float> a_cpu = a;
        if (dt == WeightDType::kBFloat16) {
          for (float& v : a_cpu) v = Bf16BitsToFloat(FloatToBf16Bits(v));
        }
        std::vector<float> want(T * c.c_row);
        (dt == WeightDType::kFloat32 ? cpu_ : cpu16_)
            .BatchedGemm(nh, T, c.n, c.k, a_cpu.data(), c.lda, c.stride_a, cw, c.ldw, c.stride_w,
                         want.data(), c.ldc, c.stride_c);
        auto full = Poisoned(T * c.c_row);
        gpu_->BatchedGemm(nh, T, c.n, c.k, da->as<float>(), c.lda, c.stride_a, gw, c.ldw,
                          c.stride_w, full->as<float>(), c.ldc, c.stride_c);
        const std::vector<float> all = Download(*full);
        EXPECT_TRUE(AllClose(all, want, dt == WeightDType::kFloat32 ? 2e-4 : 1e-3,
                             dt == WeightDType::kFloat32 ? 1e-5 : 1e-4));
        std::vector<std::pair<int64_t, int64_t>> parts = {{0, 1}, {63, 1}, {5, 3}, {10, 40}};
        if (T > 1000) parts.push_back({T - 1000, 1000});
        for (const auto& [first, rows] : parts) {
          auto part = Poisoned(rows * c.c_row);
          gpu_->BatchedGemm(nh, rows, c.n, c.k, da->as<float>() + first * c.a_row, c.lda,
                            c.stride_a, gw, c.ldw, c.stride_w, part->as<float>(), c.ldc,
                            c.stride_c);
          EXPECT_TRUE(SameRows(all, Download(*part), first, rows, c.c_row, c.c_row));
        }
      }
    }
  }
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// RoutedExperts (bf16 experts: kernels::Bf16MmaGroupedGemm with the fixed k split, the
// activations in bf16): 1400 tokens with random top-6 routing over 64 experts (8400 rows, about
// 130 an expert: passes of 32 rows), and the same tokens in calls of 1 to 128 tokens (about 12
// rows an expert at 128: other row tiles), which give each expert other row counts and row
// places: every token's output bit for bit the same, with the plain SiLU-mul and with V4's
// clamped SwiGLU (rounded to bf16 in a pass of its own). The first 128 tokens of the plain form
// against the bf16 CPU backend (activations rounded to bf16 as the mode rounds them) token by
// token: up to summation order and an activation rounded the other way now and then, far below
// the O(0.1) of a wrong or missing expert.
TEST_F(BatchInvariantTest, RoutedExpertsRowsAreTheSameAtEveryBatchSizeAndMatchCpu) {
  constexpr int64_t E = 64, K = 6, H = 256, I = 128, T = 1400, kChecked = 128;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  const auto x = testing::RandomFloats(T * H, seed);
  const auto w = testing::RandomFloats(T * K, seed + 1, 0.5f);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), gen);
    std::sort(all.begin(), all.begin() + K);
    ids.insert(ids.end(), all.begin(), all.begin() + K);
  }
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  std::vector<const void*> gu_ptr(E), dn_ptr(E);
  std::vector<WeightView> ref_gu(E), ref_dn(E);
  for (int64_t e = 0; e < E; ++e) {
    const auto gu = testing::RandomFloats(2 * I * H, seed + 10 + e, 0.125f);
    const auto dn = testing::RandomFloats(H * I, seed + 1000 + e, 0.125f);
    gu_ptr[e] = GpuBf16(gu, &keep).data;
    dn_ptr[e] = GpuBf16(dn, &keep).data;
    ref_gu[e] = CpuBf16(gu, &keep);
    ref_dn[e] = CpuBf16(dn, &keep);
  }
  std::vector<int32_t> slots(E);
  std::iota(slots.begin(), slots.end(), 0);
  auto upload_bytes = [&](const void* data, size_t bytes) {
    keep.push_back(gpu_->Allocate(bytes));
    gpu_->CopyToDevice(data, bytes, keep.back()->data());
    return keep.back()->data();
  };
  const void* d_slots = upload_bytes(slots.data(), E * sizeof(int32_t));
  const void* d_gu = upload_bytes(gu_ptr.data(), E * sizeof(void*));
  const void* d_dn = upload_bytes(dn_ptr.data(), E * sizeof(void*));
  // RoutedExperts on tokens [first, first + n); the output rows.
  auto run = [&](int64_t first, int64_t n, float swiglu_limit = 0.0f) {
    std::vector<float> xs(x.begin() + first * H, x.begin() + (first + n) * H);
    std::vector<float> ws(w.begin() + first * K, w.begin() + (first + n) * K);
    std::vector<int32_t> is(ids.begin() + first * K, ids.begin() + (first + n) * K);
    auto dx = Upload(xs), dw = Upload(ws);
    auto out = Poisoned(n * H);
    RoutedExpertsArgs a;
    a.num_tokens = static_cast<int32_t>(n);
    a.top_k = static_cast<int32_t>(K);
    a.num_experts = static_cast<int32_t>(E);
    a.hidden_size = H;
    a.inter = I;
    a.hidden = dx->as<float>();
    a.topk_ids = static_cast<const int32_t*>(upload_bytes(is.data(), is.size() * sizeof(int32_t)));
    a.topk_weights = dw->as<float>();
    a.slot_of_expert = static_cast<const int32_t*>(d_slots);
    a.gate_up = static_cast<const void* const*>(d_gu);
    a.down = static_cast<const void* const*>(d_dn);
    a.dtype = WeightDType::kBFloat16;
    a.swiglu_limit = swiglu_limit;
    a.out = out->as<float>();
    EXPECT_TRUE(gpu_->RoutedExperts(a));
    return Download(*out);
  };
  const std::vector<float> all = run(0, T);
  const std::vector<std::pair<int64_t, int64_t>> calls = {
      {0, 1}, {1399, 1}, {40, 3}, {100, 17}, {5, 60}, {0, kChecked}, {1272, 128}};
  for (const auto& [first, n] : calls) {
    EXPECT_TRUE(SameRows(all, run(first, n), first, n, H, H));
  }
  {
    SCOPED_TRACE("clamped SwiGLU");
    constexpr float kLimit = 1.5f;
    const std::vector<float> clamped = run(0, T, kLimit);
    for (const auto& [first, n] : calls) {
      EXPECT_TRUE(SameRows(clamped, run(first, n, kLimit), first, n, H, H));
    }
  }
  // The CPU reference, token by token.
  std::vector<float> want(kChecked * H, 0.0f), gu(2 * I), act(I), y(H);
  for (int64_t t = 0; t < kChecked; ++t) {
    for (int64_t k = 0; k < K; ++k) {
      const int32_t e = ids[t * K + k];
      cpu16_.Gemm(1, 2 * I, H, x.data() + t * H, H, ref_gu[e], H, gu.data(), 2 * I, false);
      cpu16_.SiluMul(1, I, gu.data(), act.data());
      cpu16_.Gemm(1, H, I, act.data(), I, ref_dn[e], I, y.data(), H, false);
      for (int64_t j = 0; j < H; ++j) want[t * H + j] += w[t * K + k] * y[j];
    }
  }
  EXPECT_TRUE(
      AllClose(std::vector<float>(all.begin(), all.begin() + kChecked * H), want, 1e-2, 1e-2));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// RouteTokens (the one-launch router at every token count, in calls of at most
// kernels::kMaxFusedRouterTokens): 600 tokens (three calls, the counts in a pass after them) and
// the same tokens in calls of 1 to 300 tokens at other places give every token the same expert
// ids and weights bit for bit; the counts are those of the choices made (count_limit leaves the
// last token out); against the CPU backend's Gemm + NoauxTcRoute the same choices except within
// float noise of a tie, and close weights.
TEST_F(BatchInvariantTest, RouteTokensRowsAreTheSameAtEveryBatchSizeAndMatchCpu) {
  constexpr int32_t E = 64, K = 6, H = 512, T = 600;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<float> hidden = testing::RandomFloats(T * H, seed, 1.0f);
  const std::vector<float> weight = testing::RandomFloats(E * H, seed + 1, 0.05f);
  const std::vector<float> bias = testing::RandomFloats(E, seed + 2, 0.05f);
  struct Routed {
    std::vector<int32_t> ids;
    std::vector<float> weights;
    std::vector<int64_t> counts;
  };
  // be's RouteTokens on tokens [first, first + n).
  auto run = [&](Backend* be, int32_t first, int32_t n) {
    std::vector<std::unique_ptr<DeviceBuffer>> keep;
    auto up = [&](const void* host, size_t bytes) {
      keep.push_back(be->Allocate(bytes));
      be->CopyToDevice(host, bytes, keep.back()->data());
      return keep.back()->data();
    };
    const int32_t limit = (n - 1) * K;
    const std::vector<int64_t> initial(E, 5);
    const std::vector<int32_t> poison_ids(n * K, -7);
    const std::vector<float> poison_w(n * K, std::numeric_limits<float>::quiet_NaN());
    RouteTokensArgs a;
    a.hidden_size = H;
    a.hidden = static_cast<const float*>(
        up(hidden.data() + static_cast<size_t>(first) * H, static_cast<size_t>(n) * H * 4));
    a.router_weight = static_cast<const float*>(up(weight.data(), weight.size() * 4));
    a.route.num_tokens = n;
    a.route.num_experts = E;
    a.route.correction_bias = static_cast<const float*>(up(bias.data(), bias.size() * 4));
    a.route.top_k = K;
    a.route.scaling_factor = 2.446f;
    a.route.topk_ids = static_cast<int32_t*>(up(poison_ids.data(), n * K * sizeof(int32_t)));
    a.route.topk_weights = static_cast<float*>(up(poison_w.data(), n * K * sizeof(float)));
    a.expert_counts = static_cast<int64_t*>(up(initial.data(), E * sizeof(int64_t)));
    a.count_limit = static_cast<const int32_t*>(up(&limit, sizeof(limit)));
    be->RouteTokens(a);
    Routed r;
    r.ids.resize(n * K);
    r.weights.resize(n * K);
    r.counts.resize(E);
    be->CopyToHost(a.route.topk_ids, n * K * sizeof(int32_t), r.ids.data());
    be->CopyToHost(a.route.topk_weights, n * K * sizeof(float), r.weights.data());
    be->CopyToHost(a.expert_counts, E * sizeof(int64_t), r.counts.data());
    return r;
  };
  gpu_->SetOpTiming(true);
  const Routed all = run(gpu_.get(), 0, T);
  gpu_->SetOpTiming(false);
  const std::string report = gpu_->TakeOpTimingReport();
  EXPECT_EQ(testing::CallsOf(report, "RouteTokens"), 1) << report;
  EXPECT_EQ(testing::CallsOf(report, "NoauxTcRoute"), -1) << report;
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  std::vector<int64_t> from_ids(E, 5);
  for (int32_t i = 0; i < (T - 1) * K; ++i) {
    ASSERT_GE(all.ids[i], 0);
    ASSERT_LT(all.ids[i], E);
    ++from_ids[all.ids[i]];
  }
  EXPECT_EQ(all.counts, from_ids);
  for (const auto& [first, n] : std::vector<std::pair<int32_t, int32_t>>{
           {0, 1}, {599, 1}, {40, 3}, {100, 17}, {5, 129}, {0, 256}, {250, 300}}) {
    SCOPED_TRACE(::testing::Message() << n << " tokens from " << first);
    const Routed part = run(gpu_.get(), first, n);
    EXPECT_EQ(std::memcmp(part.ids.data(), all.ids.data() + first * K, n * K * sizeof(int32_t)), 0);
    EXPECT_EQ(
        std::memcmp(part.weights.data(), all.weights.data() + first * K, n * K * sizeof(float)), 0);
  }
  const Routed want = run(&cpu_, 0, T);
  int differing = 0;
  for (int32_t t = 0; t < T; ++t) {
    const std::vector<int32_t> g(all.ids.begin() + t * K, all.ids.begin() + (t + 1) * K);
    const std::vector<int32_t> w(want.ids.begin() + t * K, want.ids.begin() + (t + 1) * K);
    if (g != w) {
      ++differing;
      continue;
    }
    const std::vector<float> gw(all.weights.begin() + t * K, all.weights.begin() + (t + 1) * K);
    const std::vector<float> ww(want.weights.begin() + t * K, want.weights.begin() + (t + 1) * K);
    EXPECT_TRUE(AllClose(gw, ww, 1e-6, 1e-5)) << "token " << t;
  }
  EXPECT_LE(differing, T / 50) << "more than float-noise ties";
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// The mode's switches: the row-count-specific fused ops decline, the one-token attention kernel
// is never asked for.
TEST_F(BatchInvariantTest, RowCountSpecificOpsDecline) {
  EXPECT_EQ(gpu_->MlaDecodeContextBreak(1), 0);
  DenseMlpArgs d;
  d.rows = 1;
  EXPECT_FALSE(gpu_->NormedDenseMlp(d));
  RoutedExpertsArgs r;
  r.num_tokens = 1;
  EXPECT_FALSE(gpu_->RoutedAndSharedExperts(r));
  EXPECT_FALSE(gpu_->GateUpSiluMulBf16(4096, 64, 64, ActivationView(static_cast<float*>(nullptr)),
                                       64, WeightView(nullptr, WeightDType::kBFloat16), 64,
                                       /*swiglu_limit=*/0.0f, nullptr));
  EXPECT_FALSE(gpu_->GemmToBf16(4096, 64, 64, ActivationView(static_cast<float*>(nullptr)), 64,
                                WeightView(nullptr, WeightDType::kBFloat16), 64, nullptr, 64));
  EXPECT_FALSE(gpu_->BatchedGemmToBf16(
      2, 4096, 64, 64, ActivationView(static_cast<float*>(nullptr)), 128, 64,
      WeightView(nullptr, WeightDType::kBFloat16), 64, 64 * 64, nullptr, 128, 64));
  MlaSequenceSpan s{0, 512, 512};
  EXPECT_FALSE(gpu_->UsesTensorCoreAttention(s));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

}  // namespace
}  // namespace deepinfer
