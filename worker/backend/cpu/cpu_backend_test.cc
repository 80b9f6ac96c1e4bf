// Tests for CpuBackend ops against straightforward host formulas.
#include "worker/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/bf16.h"
#include "worker/sampling/sampler.h"

namespace deepinfer {
namespace {

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

TEST(CpuBackendTest, GemmMatchesNaiveWithStridesAndAccumulate) {
  for (int threads : {1, 2}) {
    CpuBackend be(threads);
    const int m = 37, n = 29, k = 45, lda = 50, ldc = 31;
    auto a = Random(m * lda, 1), w = Random(n * k, 2), c = Random(m * ldc, 3);
    auto c0 = c;
    be.Gemm(m, n, k, a.data(), lda, w.data(), k, c.data(), ldc, /*accumulate=*/true);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < ldc; ++j) {
        double ref = c0[i * ldc + j];
        if (j < n) {
          for (int p = 0; p < k; ++p) ref += double(a[i * lda + p]) * w[j * k + p];
        }
        EXPECT_NEAR(c[i * ldc + j], ref, 1e-4) << i << "," << j;
      }
    }
  }
}

TEST(CpuBackendTest, Bf16RoundingIsNearestEven) {
  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(RoundToBf16(1.0f + 1.0f / 256), 1.0f);
  EXPECT_EQ(RoundToBf16(1.0f + 3.0f / 256), 1.0f + 4.0f / 256);
  EXPECT_EQ(RoundToBf16(-2.0f), -2.0f);
  EXPECT_TRUE(std::isnan(RoundToBf16(std::nanf(""))));
}

// A bf16 GEMM is the fp32 GEMM of the bf16-rounded operands: products of bf16 values are exact
// in fp32, so with the same summation order the results are identical, and both are within
// fp32 accumulation error of a double-precision sum of the rounded operands.
TEST(CpuBackendTest, Bf16GemmEqualsFp32GemmOfRoundedOperands) {
  for (int threads : {1, 2}) {
    CpuBackend be(threads, WeightDType::kBFloat16);
    EXPECT_EQ(be.weight_dtype(), WeightDType::kBFloat16);
    // k = 2048 makes the widened tiles 8 rows high: several tiles in both directions.
    for (auto [m, k] :
         {std::pair{1, 300}, std::pair{3, 300}, std::pair{37, 300}, std::pair{37, 2048}}) {
      const int n = 29, lda = k + 10, ldw = k + 5, ldc = 31;
      auto a = Random(m * lda, 11), w = Random(n * ldw, 12), c = Random(m * ldc, 13);
      std::vector<float> a_r(a.size()), w_r(w.size());
      for (size_t i = 0; i < a.size(); ++i) a_r[i] = RoundToBf16(a[i]);
      for (size_t i = 0; i < w.size(); ++i) w_r[i] = RoundToBf16(w[i]);
      const std::vector<uint16_t> w_bits = FloatsToBf16Bits(w);
      auto got = c, want = c;
      be.Gemm(m, n, k, a.data(), lda, WeightView(w_bits.data(), WeightDType::kBFloat16), ldw,
              got.data(), ldc, /*accumulate=*/true);
      be.Gemm(m, n, k, a_r.data(), lda, w_r.data(), ldw, want.data(), ldc, /*accumulate=*/true);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < ldc; ++j) {
          ASSERT_EQ(got[i * ldc + j], want[i * ldc + j]) << m << ": " << i << "," << j;
          double ref = c[i * ldc + j];
          if (j < n) {
            for (int p = 0; p < k; ++p) ref += double(a_r[i * lda + p]) * w_r[j * ldw + p];
          }
          EXPECT_NEAR(got[i * ldc + j], ref, 5e-4) << i << "," << j;
        }
      }
    }
  }
}

// The fused ops are defined as the ops they replace: same bits.
TEST(CpuBackendTest, FusedOpsEqualTheOpsTheyReplace) {
  CpuBackend be(2, WeightDType::kBFloat16);
  std::mt19937 gen(7);
  std::normal_distribution<float> d(0.0f, 2.0f);
  auto random = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = d(gen);
    return v;
  };
  const int64_t rows = 3, dim = 96, n = 40;
  // AddRmsNorm = Add, RmsNorm, rounding.
  auto x = random(rows * dim), y = random(rows * dim), w = random(dim);
  std::vector<float> fx = x, fout(rows * dim), ux = x, uout(rows * dim);
  std::vector<uint16_t> f16(rows * dim);
  be.AddRmsNorm(rows, dim, fx.data(), y.data(), w.data(), 1e-6f, fout.data(), f16.data());
  be.Add(rows * dim, ux.data(), y.data(), ux.data());
  be.RmsNorm(rows, dim, ux.data(), dim, w.data(), 1e-6f, uout.data(), dim);
  EXPECT_EQ(fx, ux);
  EXPECT_EQ(fout, uout);
  for (int64_t i = 0; i < rows * dim; ++i) ASSERT_EQ(f16[i], FloatToBf16Bits(uout[i]));
  std::vector<uint16_t> only16(rows * dim);
  be.AddRmsNorm(rows, dim, fx.data(), nullptr, w.data(), 1e-6f, nullptr, only16.data());
  std::vector<float> again(rows * dim);
  be.RmsNorm(rows, dim, fx.data(), dim, w.data(), 1e-6f, again.data(), dim);
  for (int64_t i = 0; i < rows * dim; ++i) ASSERT_EQ(only16[i], FloatToBf16Bits(again[i]));
  // RmsNormBf16 over strided rows = AddRmsNorm's out_bf16 without y on a contiguous copy.
  const int64_t ldx = dim + 5;
  std::vector<float> wide(rows * ldx, 1e4f);
  for (int64_t r = 0; r < rows; ++r) {
    std::copy(fx.begin() + r * dim, fx.begin() + (r + 1) * dim, wide.begin() + r * ldx);
  }
  std::vector<uint16_t> strided16(rows * dim);
  be.RmsNormBf16(rows, dim, wide.data(), ldx, w.data(), 1e-6f, strided16.data());
  EXPECT_EQ(strided16, only16);

  // Gemm of a bf16 operand = Gemm of the fp32 rows it was rounded from (bf16 weights), also
  // with a row stride and accumulating.
  auto wm = random(n * dim);
  auto wbuf = be.UploadWeight(wm.data(), wm.size());
  const WeightView wv(wbuf->data(), WeightDType::kBFloat16);
  const int64_t lda = dim + 8;
  auto a = random(rows * lda);
  std::vector<uint16_t> a16(a.size());
  for (size_t i = 0; i < a.size(); ++i) a16[i] = FloatToBf16Bits(a[i]);
  for (bool accumulate : {false, true}) {
    auto c0 = random(rows * n);
    std::vector<float> c32 = c0, c16 = c0;
    be.Gemm(rows, n, dim, a.data(), lda, wv, dim, c32.data(), n, accumulate);
    be.Gemm(rows, n, dim, ActivationView::Bf16(a16.data()), lda, wv, dim, c16.data(), n,
            accumulate);
    EXPECT_EQ(c16, c32) << "accumulate " << accumulate;
  }

  // SiluMulBf16 = SiluMul, rounded.
  auto g = random(rows * 2 * n);
  std::vector<float> act(rows * n);
  std::vector<uint16_t> act16(rows * n);
  be.SiluMul(rows, n, g.data(), act.data());
  be.SiluMulBf16(rows, n, g.data(), act16.data());
  for (int64_t i = 0; i < rows * n; ++i) ASSERT_EQ(act16[i], FloatToBf16Bits(act[i]));

  // AddRmsNormGemms = AddRmsNorm into the given scratch (bf16 or fp32), then each Gemm.
  auto w2 = random(7 * dim);
  auto w2buf = be.UploadWeight(w2.data(), w2.size());
  const WeightView w2v(w2buf->data(), WeightDType::kBFloat16);
  for (bool bf16_scratch : {true, false}) {
    std::vector<float> gx = x, ox = x, gc1(rows * n), gc2(rows * 7), oc1(rows * n), oc2(rows * 7);
    std::vector<float> normed(rows * dim), onormed(rows * dim);
    std::vector<uint16_t> normed16(rows * dim), onormed16(rows * dim);
    be.AddRmsNormGemms(rows, dim, gx.data(), y.data(), w.data(), 1e-6f,
                       bf16_scratch ? nullptr : normed.data(),
                       bf16_scratch ? normed16.data() : nullptr,
                       {{n, wv, dim, gc1.data(), n}, {7, w2v, dim, gc2.data(), 7}});
    be.AddRmsNorm(rows, dim, ox.data(), y.data(), w.data(), 1e-6f,
                  bf16_scratch ? nullptr : onormed.data(),
                  bf16_scratch ? onormed16.data() : nullptr);
    const ActivationView oa =
        bf16_scratch ? ActivationView::Bf16(onormed16.data()) : ActivationView(onormed.data());
    be.Gemm(rows, n, dim, oa, dim, wv, dim, oc1.data(), n, false);
    be.Gemm(rows, 7, dim, oa, dim, w2v, dim, oc2.data(), 7, false);
    EXPECT_EQ(gx, ox);
    EXPECT_EQ(gc1, oc1) << "bf16 scratch " << bf16_scratch;
    EXPECT_EQ(gc2, oc2) << "bf16 scratch " << bf16_scratch;
  }
}

// NormRopeWriteLatentCache = RmsNorm + ApplyRope (key) + ApplyRope (query) + WriteLatentCache.
TEST(CpuBackendTest, NormRopeWriteLatentCacheEqualsTheFourOps) {
  CpuBackend be(2);
  std::mt19937 gen(11);
  std::normal_distribution<float> d(0.0f, 1.0f);
  auto random = [&](int64_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = d(gen);
    return v;
  };
  const int64_t T = 3, L = 32, R = 8, nh = 2, qk = 4 + R, kvw = L + R, slots_total = 8;
  const std::vector<int32_t> positions = {0, 5, 900}, slots = {6, 1, 3};
  const std::vector<float> inv_freq = {1.0f, 0.1f, 0.01f, 0.001f};
  for (WeightDType dt : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
    const auto kv = random(T * kvw), q = random(T * nh * qk), w = random(L);
    const size_t bytes = slots_total * kvw * WeightDTypeSize(dt);
    std::vector<uint8_t> fused_cache(bytes, 0), unfused_cache(bytes, 0);
    PagedLatentCacheView view;
    view.block_size = 4, view.latent_dim = L, view.rope_dim = R, view.dtype = dt;
    std::vector<float> fq = q;
    NormRopeCacheArgs a;
    a.tokens = T, a.kv = kv.data(), a.ld_kv = kvw, a.norm_weight = w.data(), a.eps = 1e-6f;
    a.q = fq.data() + 4, a.q_heads = nh, a.q_token_stride = nh * qk, a.q_head_stride = qk;
    a.positions = positions.data(), a.inv_freq = inv_freq.data(), a.attention_factor = 1.1f;
    a.interleaved = true, a.slots = slots.data(), a.cache = view;
    a.cache.cache = fused_cache.data();
    be.NormRopeWriteLatentCache(a);

    std::vector<float> ukv = kv, uq = q, latent(T * L);
    be.RmsNorm(T, L, ukv.data(), kvw, w.data(), 1e-6f, latent.data(), L);
    be.ApplyRope(T, 1, ukv.data() + L, kvw, 0, R, positions.data(), inv_freq.data(), 1.1f, true);
    be.ApplyRope(T, nh, uq.data() + 4, nh * qk, qk, R, positions.data(), inv_freq.data(), 1.1f,
                 true);
    view.cache = unfused_cache.data();
    be.WriteLatentCache(T, latent.data(), L, ukv.data() + L, kvw, slots.data(), view);
    EXPECT_EQ(fq, uq) << WeightDTypeName(dt);
    EXPECT_EQ(fused_cache, unfused_cache) << WeightDTypeName(dt);
  }
}

TEST(CpuBackendTest, UploadWeightStoresBf16Bits) {
  CpuBackend be(1, WeightDType::kBFloat16);
  const std::vector<float> w = {1.0f, 1.0f + 1.0f / 256, -3.14159f, 65504.0f};
  auto buf = be.UploadWeight(w.data(), w.size());
  ASSERT_EQ(buf->size_bytes(), w.size() * 2);
  const uint16_t* bits = buf->as<uint16_t>();
  for (size_t i = 0; i < w.size(); ++i) EXPECT_EQ(bits[i], FloatToBf16Bits(w[i])) << i;
}

TEST(CpuBackendTest, BatchedGemmMatchesNaivePerBatch) {
  for (WeightDType dt : {WeightDType::kFloat32, WeightDType::kBFloat16}) {
    CpuBackend be(2, dt);
    // The W_uk layout of absorbed MLA: a = per-head slices of q, c = per-head slices.
    const int batch = 3, m = 5, n = 6, k = 4, lda = 20, stride_a = 7, ldw = 4;
    const int stride_w = n * ldw + 2, ldc = 25, stride_c = 8;
    auto a = Random(m * lda, 21), w = Random(batch * stride_w, 22);
    std::vector<float> w_r(w.size());
    for (size_t i = 0; i < w.size(); ++i)
      w_r[i] = dt == WeightDType::kFloat32 ? w[i] : RoundToBf16(w[i]);
    const std::vector<uint16_t> w_bits = FloatsToBf16Bits(w);
    const WeightView wv = dt == WeightDType::kFloat32
                              ? WeightView(w.data())
                              : WeightView(w_bits.data(), WeightDType::kBFloat16);
    std::vector<float> c(m * ldc, -7.0f);
    be.BatchedGemm(batch, m, n, k, a.data(), lda, stride_a, wv, ldw, stride_w, c.data(), ldc,
                   stride_c);
    for (int i = 0; i < m; ++i) {
      for (int col = 0; col < ldc; ++col) {
        const int b = col / stride_c, j = col % stride_c;
        if (b >= batch || j >= n) {
          EXPECT_EQ(c[i * ldc + col], -7.0f) << "wrote outside the products at " << col;
          continue;
        }
        double ref = 0;
        for (int p = 0; p < k; ++p) {
          const float av = a[i * lda + b * stride_a + p];
          ref += double(dt == WeightDType::kFloat32 ? av : RoundToBf16(av)) *
                 w_r[b * stride_w + j * ldw + p];
        }
        EXPECT_NEAR(c[i * ldc + col], ref, 1e-5) << b << ": " << i << "," << j;
      }
    }
  }
}

TEST(CpuBackendTest, GroupedGemmUsesEachGroupsWeights) {
  CpuBackend be(2);
  const int n = 5, k = 7;
  std::vector<int64_t> offsets = {0, 3, 3, 8};
  auto a = Random(8 * k, 4), w0 = Random(n * k, 5), w1 = Random(n * k, 6), w2 = Random(n * k, 7);
  std::vector<float> c(8 * n);
  be.GroupedGemm(offsets, {w0.data(), w1.data(), w2.data()}, n, k, a.data(), c.data());
  for (int r = 0; r < 8; ++r) {
    const auto& w = r < 3 ? w0 : w2;
    for (int j = 0; j < n; ++j) {
      double ref = 0;
      for (int p = 0; p < k; ++p) ref += double(a[r * k + p]) * w[j * k + p];
      EXPECT_NEAR(c[r * n + j], ref, 1e-5);
    }
  }
}

TEST(CpuBackendTest, RmsNormSiluMulGatherScatter) {
  CpuBackend be(2);
  auto x = Random(3 * 8, 8), wt = Random(8, 9);
  std::vector<float> out(3 * 8);
  be.RmsNorm(3, 8, x.data(), 8, wt.data(), 1e-6f, out.data(), 8);
  for (int r = 0; r < 3; ++r) {
    double ss = 0;
    for (int i = 0; i < 8; ++i) ss += double(x[r * 8 + i]) * x[r * 8 + i];
    double inv = 1.0 / std::sqrt(ss / 8 + 1e-6);
    for (int i = 0; i < 8; ++i) EXPECT_NEAR(out[r * 8 + i], wt[i] * x[r * 8 + i] * inv, 1e-5);
  }
  std::vector<float> gu = {1.0f, -2.0f, 3.0f, 0.5f};  // one row, inter = 2
  std::vector<float> act(2);
  be.SiluMul(1, 2, gu.data(), act.data());
  EXPECT_NEAR(act[0], 1.0 / (1 + std::exp(-1.0)) * 3.0, 1e-6);
  EXPECT_NEAR(act[1], -2.0 / (1 + std::exp(2.0)) * 0.5, 1e-6);

  std::vector<float> src = {1, 2, 3, 4, 5, 6};  // 3 rows of 2
  std::vector<int32_t> idx = {2, 0, 2};
  std::vector<float> g(6);
  be.GatherRows(3, 2, src.data(), idx.data(), g.data());
  EXPECT_EQ(g, (std::vector<float>{5, 6, 1, 2, 5, 6}));
  std::vector<float> dst(6, 0.0f), wts = {0.5f, 2.0f, 1.0f};
  be.ScatterAddRows(3, 2, src.data(), idx.data(), wts.data(), dst.data());
  EXPECT_EQ(dst, (std::vector<float>{6, 8, 0, 0, 5.5, 7}));
}

TEST(CpuBackendTest, RopeRotatesPairsAndDependsOnRelativePosition) {
  CpuBackend be(1);
  const int d = 8;
  std::vector<float> inv = {1.0f, 0.1f, 0.01f, 0.001f};
  // Interleaved: pair (0,1) rotated by positions*inv[0].
  std::vector<float> x = {1, 0, 0, 0, 0, 0, 0, 0};
  std::vector<int32_t> pos = {3};
  be.ApplyRope(1, 1, x.data(), d, d, d, pos.data(), inv.data(), 1.0f, /*interleaved=*/true);
  EXPECT_NEAR(x[0], std::cos(3.0), 1e-6);
  EXPECT_NEAR(x[1], std::sin(3.0), 1e-6);
  // Half layout: pair (0, 4).
  std::vector<float> y = {1, 0, 0, 0, 0, 0, 0, 0};
  be.ApplyRope(1, 1, y.data(), d, d, d, pos.data(), inv.data(), 2.0f, /*interleaved=*/false);
  EXPECT_NEAR(y[0], 2 * std::cos(3.0), 1e-6);
  EXPECT_NEAR(y[4], 2 * std::sin(3.0), 1e-6);
  // q(m)·k(n) depends only on m - n, for both layouts.
  for (bool il : {true, false}) {
    auto q = Random(d, 10), k = Random(d, 11);
    auto dot_at = [&](int m, int n) {
      auto qq = q, kk = k;
      std::vector<int32_t> pm = {m}, pn = {n};
      be.ApplyRope(1, 1, qq.data(), d, d, d, pm.data(), inv.data(), 1.0f, il);
      be.ApplyRope(1, 1, kk.data(), d, d, d, pn.data(), inv.data(), 1.0f, il);
      double s = 0;
      for (int i = 0; i < d; ++i) s += double(qq[i]) * kk[i];
      return s;
    };
    EXPECT_NEAR(dot_at(10, 4), dot_at(56, 50), 1e-4);
    EXPECT_GT(std::abs(dot_at(10, 4) - dot_at(10, 9)), 1e-3);
  }
}

// Writes two sequences into a paged cache of the given element type, checks the stored bits
// (bf16: nearest-even rounding of each value) and the attention output against a double
// reference over the values the cache holds.
void CheckMlaOverPagedCache(WeightDType dtype) {
  CpuBackend be(2);
  const int heads = 3, latent = 6, rope = 4, bs = 4, entry = latent + rope;
  const int num_blocks = 8, max_blocks = 3;
  const bool bf16 = dtype == WeightDType::kBFloat16;
  std::vector<float> cache32(num_blocks * bs * entry, 0.0f);
  std::vector<uint16_t> cache16(num_blocks * bs * entry, 0);
  void* cache = bf16 ? static_cast<void*>(cache16.data()) : static_cast<void*>(cache32.data());
  const PagedLatentCacheView view{cache, bs, latent, rope, dtype};
  EXPECT_EQ(view.entry_bytes(), entry * (bf16 ? 2u : 4u));
  // Two sequences with scattered blocks: lengths 9 and 5.
  std::vector<int32_t> tables = {5, 1, 6, 2, 7, 0};
  std::vector<int> lens = {9, 5};
  std::vector<std::vector<float>> dense(2), stored(2);
  for (int s = 0; s < 2; ++s) {
    dense[s] = Random(lens[s] * entry, 20 + s);
    stored[s] = dense[s];
    if (bf16) {
      for (float& v : stored[s]) v = RoundToBf16(v);
    }
    std::vector<int32_t> slots;
    for (int j = 0; j < lens[s]; ++j)
      slots.push_back(tables[s * max_blocks + j / bs] * bs + j % bs);
    be.WriteLatentCache(lens[s], dense[s].data(), entry, dense[s].data() + latent, entry,
                        slots.data(), view);
    for (int j = 0; j < lens[s]; ++j) {
      for (int i = 0; i < entry; ++i) {
        const int64_t at = static_cast<int64_t>(slots[j]) * entry + i;
        if (bf16) {
          ASSERT_EQ(cache16[at], FloatToBf16Bits(dense[s][j * entry + i])) << "slot " << slots[j];
        } else {
          ASSERT_EQ(cache32[at], dense[s][j * entry + i]) << "slot " << slots[j];
        }
      }
    }
  }
  // Three query tokens: seq 0 at ctx 9 and 4, seq 1 at ctx 5.
  std::vector<int32_t> token_seq = {0, 0, 1}, ctx = {9, 4, 5};
  auto ql = Random(3 * heads * latent, 30);
  auto qr = Random(3 * heads * rope, 31);
  std::vector<float> out(3 * heads * latent);
  MlaAttentionArgs args;
  args.num_tokens = 3;
  args.num_heads = heads;
  args.q_latent = ql.data();
  args.q_rope = qr.data();
  args.q_rope_token_stride = heads * rope;
  args.q_rope_head_stride = rope;
  args.cache = view;
  args.block_tables = tables.data();
  args.max_blocks_per_seq = max_blocks;
  args.token_seq = token_seq.data();
  args.context_len = ctx.data();
  args.softmax_scale = 0.3f;
  args.out_latent = out.data();
  be.MlaAttention(args);
  for (int t = 0; t < 3; ++t) {
    const auto& kv = stored[token_seq[t]];
    for (int h = 0; h < heads; ++h) {
      std::vector<double> s(ctx[t]);
      double mx = -1e30, den = 0;
      for (int j = 0; j < ctx[t]; ++j) {
        double v = 0;
        for (int c = 0; c < latent; ++c) v += ql[(t * heads + h) * latent + c] * kv[j * entry + c];
        for (int c = 0; c < rope; ++c)
          v += qr[(t * heads + h) * rope + c] * kv[j * entry + latent + c];
        s[j] = v * 0.3;
        mx = std::max(mx, s[j]);
      }
      for (double& v : s) den += (v = std::exp(v - mx));
      for (int c = 0; c < latent; ++c) {
        double ref = 0;
        for (int j = 0; j < ctx[t]; ++j) ref += s[j] / den * kv[j * entry + c];
        EXPECT_NEAR(out[(t * heads + h) * latent + c], ref, 1e-5);
      }
    }
  }
}

TEST(CpuBackendTest, MlaAttentionOverPagedCacheMatchesDense) {
  CheckMlaOverPagedCache(WeightDType::kFloat32);
}

TEST(CpuBackendTest, MlaAttentionOverBf16PagedCacheMatchesDenseOfRoundedValues) {
  CheckMlaOverPagedCache(WeightDType::kBFloat16);
}

float Logit(double p) { return static_cast<float>(std::log(p / (1 - p))); }

TEST(CpuBackendTest, AccumulateExpertCountsAddsAndSkipsOutOfRangeIds) {
  CpuBackend be(1);
  std::vector<int64_t> counts = {10, 0, 0, 1};
  const std::vector<int32_t> ids = {0, 2, 2, -1, 4, 3, 2};
  be.AccumulateExpertCounts(static_cast<int64_t>(ids.size()), ids.data(), 4, nullptr,
                            counts.data());
  EXPECT_EQ(counts, (std::vector<int64_t>{11, 0, 3, 2}));
  be.AccumulateExpertCounts(0, ids.data(), 4, nullptr, counts.data());
  EXPECT_EQ(counts, (std::vector<int64_t>{11, 0, 3, 2}));
  // A limit counts only the first ids (the padding rows of a replayed step are left out).
  const int32_t limit = 3;
  be.AccumulateExpertCounts(static_cast<int64_t>(ids.size()), ids.data(), 4, &limit, counts.data());
  EXPECT_EQ(counts, (std::vector<int64_t>{12, 0, 5, 2}));
}

TEST(CpuBackendTest, CaptureIsNotSupported) {
  CpuBackend be(1);
  EXPECT_FALSE(be.SupportsCapture());
  auto captured = be.Capture([] { return absl::OkStatus(); });
  EXPECT_EQ(captured.status().code(), absl::StatusCode::kUnimplemented);
}

TEST(CpuBackendTest, NoauxTcRouterGroupLimitBiasAndUnbiasedWeights) {
  CpuBackend be(1);
  // 8 experts in 4 groups of 2; keep 2 groups, pick 2 experts, scale 2.5.
  std::vector<double> p = {0.9, 0.1, 0.6, 0.55, 0.5, 0.45, 0.2, 0.3};
  std::vector<float> logits;
  for (double v : p) logits.push_back(Logit(v));
  std::vector<float> zero(8, 0.0f), bias(8, 0.0f);
  bias[3] = 0.2f;   // group 1 -> 0.6 + 0.75
  bias[5] = 0.35f;  // group 2 -> 0.5 + 0.8
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  NoauxTcRouteArgs a;
  a.num_tokens = 1;
  a.num_experts = 8;
  a.router_logits = logits.data();
  a.correction_bias = zero.data();
  a.num_groups = 4;
  a.topk_groups = 2;
  a.top_k = 2;
  a.normalize = true;
  a.scaling_factor = 2.5f;
  a.topk_ids = ids.data();
  a.topk_weights = w.data();
  be.NoauxTcRoute(a);
  // Groups by top-2 sums: g1 (1.15), g0 (1.0) kept; best experts there: 0 and 2.
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(w[0], 0.9 / 1.5 * 2.5, 1e-5);
  EXPECT_NEAR(w[1], 0.6 / 1.5 * 2.5, 1e-5);
  // With the bias, groups 1 and 2 win, expert 0 (best unbiased score) is masked by its group,
  // and the weights come from the unbiased scores 0.55 and 0.45.
  a.correction_bias = bias.data();
  be.NoauxTcRoute(a);
  EXPECT_EQ(ids, (std::vector<int32_t>{3, 5}));
  EXPECT_NEAR(w[0], 0.55 / 1.0 * 2.5, 1e-5);
  EXPECT_NEAR(w[1], 0.45 / 1.0 * 2.5, 1e-5);
  // Without normalisation the weights are the raw scores times the factor.
  a.normalize = false;
  be.NoauxTcRoute(a);
  EXPECT_NEAR(w[0], 0.55 * 2.5, 1e-5);
}

// Backend::RouteTokens (the reference the CUDA kernel is checked against) is the three ops it
// replaces, bit for bit, and counts only when asked.
TEST(CpuBackendTest, RouteTokensIsGemmRouteAndCounts) {
  CpuBackend be(2);
  const int32_t T = 5, E = 16, K = 3, H = 24;
  const std::vector<float> hidden = Random(T * H, 11);
  const std::vector<float> weight = Random(E * H, 12);
  const std::vector<float> bias = Random(E, 13);
  std::vector<float> logits(T * E);
  be.Gemm(T, E, H, hidden.data(), H, weight.data(), H, logits.data(), E, false);
  std::vector<int32_t> want_ids(T * K), got_ids(T * K, -1);
  std::vector<float> want_w(T * K), got_w(T * K, -1.0f);
  NoauxTcRouteArgs r;
  r.num_tokens = T;
  r.num_experts = E;
  r.router_logits = logits.data();
  r.correction_bias = bias.data();
  r.num_groups = 4;
  r.topk_groups = 2;
  r.top_k = K;
  r.scaling_factor = 1.5f;
  r.topk_ids = want_ids.data();
  r.topk_weights = want_w.data();
  be.NoauxTcRoute(r);
  std::vector<int64_t> want_counts(E, 2);
  const int32_t limit = 7;
  be.AccumulateExpertCounts(T * K, want_ids.data(), E, &limit, want_counts.data());

  RouteTokensArgs a;
  a.hidden_size = H;
  a.hidden = hidden.data();
  a.router_weight = weight.data();
  a.route = r;
  a.route.router_logits = nullptr;
  a.route.topk_ids = got_ids.data();
  a.route.topk_weights = got_w.data();
  be.RouteTokens(a);  // no counts asked for
  EXPECT_EQ(got_ids, want_ids);
  EXPECT_EQ(got_w, want_w);
  std::vector<int64_t> counts(E, 2);
  a.expert_counts = counts.data();
  a.count_limit = &limit;
  be.RouteTokens(a);
  EXPECT_EQ(counts, want_counts);
}

TEST(CpuBackendTest, GreedySampleRowsGivesTokenAndLogSoftmax) {
  CpuBackend be(1);
  const std::vector<float> l = {1.0f, 3.0f, 3.0f, -2.0f,  // tie: lowest index
                                0.0f, 0.0f, 0.0f, 0.0f};
  std::vector<int32_t> tok(2, -1);
  std::vector<float> lp(2, 1.0f);
  be.GreedySampleRows(2, 4, l.data(), tok.data(), lp.data());
  EXPECT_EQ(tok[0], 1);
  EXPECT_EQ(tok[1], 0);
  const double z0 = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(-2.0));
  EXPECT_NEAR(lp[0], 3.0 - z0, 1e-6);
  EXPECT_NEAR(lp[1], -std::log(4.0), 1e-6);
}

TEST(CpuBackendTest, ArgmaxRows) {
  CpuBackend be(1);
  std::vector<float> l = {0, 3, 1, 3, -1, -2, -0.5f, -3};
  std::vector<int32_t> out(2);
  be.ArgmaxRows(2, 4, l.data(), out.data());
  EXPECT_EQ(out, (std::vector<int32_t>{1, 2}));
}

// Random parameters covering greedy, temperature only, top-k (1, small, >= vocab), top-p
// (tiny, small, large) and both; some rows have an invalid top_p or a NaN temperature.
std::vector<RowSamplingParams> RandomRowParams(int64_t rows, int64_t vocab, std::mt19937_64* gen) {
  const float temps[] = {0.0f, 0.3f, 1.0f, 1.7f};
  const int32_t ks[] = {0, 1, 5, static_cast<int32_t>(vocab) + 3};
  const float ps[] = {1.0f, 0.9f, 0.3f, 1e-6f};
  std::vector<RowSamplingParams> out(rows);
  for (int64_t r = 0; r < rows; ++r) {
    out[r].temperature = temps[(*gen)() % 4];
    out[r].top_k = ks[(*gen)() % 4];
    out[r].top_p = ps[(*gen)() % 4];
    out[r].seed = (*gen)();
    out[r].position = static_cast<int64_t>((*gen)() % 100000);
    if (r % 11 == 10) out[r].top_p = r % 2 ? 0.0f : 1.5f;
    if (r % 11 == 5) out[r].temperature = std::nanf("");
  }
  return out;
}

TEST(CpuBackendTest, SampleRowsIsSampler) {
  CpuBackend be(2);
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 gen(seed);
  for (int64_t vocab : {1, 9, 500}) {
    const int64_t rows = 40;
    auto logits = Random(rows * vocab, seed + vocab);
    for (int64_t r = 0; r < rows; r += 3) {  // planted ties, -0 against +0 among them
      logits[r * vocab + gen() % vocab] = 0.0f;
      logits[r * vocab + gen() % vocab] = -0.0f;
      logits[r * vocab + gen() % vocab] = 2.5f;
      logits[r * vocab + gen() % vocab] = 2.5f;
    }
    const auto params = RandomRowParams(rows, vocab, &gen);
    std::vector<int32_t> tok(rows, -7);
    std::vector<float> lp(rows, 7.0f);
    be.SampleRows(rows, vocab, logits.data(), params.data(), tok.data(), lp.data());
    for (int64_t r = 0; r < rows; ++r) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " row " << r);
      SamplingParams sp;
      sp.temperature = params[r].temperature;
      sp.top_k = params[r].top_k;
      sp.top_p = params[r].top_p;
      sp.seed = params[r].seed;
      auto want = Sampler::Sample(logits.data() + r * vocab, static_cast<int32_t>(vocab), sp,
                                  params[r].position);
      if (!want.ok()) {
        EXPECT_EQ(tok[r], -1);
        EXPECT_TRUE(std::isnan(lp[r]));
        continue;
      }
      EXPECT_EQ(tok[r], want->token);
      EXPECT_EQ(lp[r], want->logprob);
    }
  }
  EXPECT_TRUE(be.status().ok()) << be.status();
  std::vector<int32_t> tok(1, -7);
  std::vector<float> lp(1, 7.0f);
  const RowSamplingParams one;
  be.SampleRows(1, 0, nullptr, &one, tok.data(), lp.data());
  EXPECT_EQ(be.status().code(), absl::StatusCode::kInvalidArgument) << be.status();
  EXPECT_EQ(tok[0], -7);
}

TEST(CpuBackendTest, TopLogprobsRowsIsSampler) {
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  CpuBackend be(2);
  for (int64_t vocab : {1, 7, 300}) {
    for (int32_t n : {1, 5, kMaxTopLogprobs}) {
      SCOPED_TRACE(::testing::Message() << "vocab " << vocab << " n " << n);
      const int64_t rows = 6;
      auto logits = Random(rows * vocab, seed + vocab + n);
      for (int64_t i = 0; i < vocab; i += 2) logits[i] = 1.25f;  // row 0: many ties
      std::vector<int32_t> ids(rows * n, -7);
      std::vector<float> lps(rows * n, 7.0f);
      be.TopLogprobsRows(rows, vocab, logits.data(), n, ids.data(), lps.data());
      for (int64_t r = 0; r < rows; ++r) {
        SamplingParams sp;
        sp.num_logprobs = n;
        auto want = Sampler::Sample(logits.data() + r * vocab, static_cast<int32_t>(vocab), sp, 0);
        ASSERT_TRUE(want.ok()) << want.status();
        for (int32_t j = 0; j < n; ++j) {
          if (j < vocab) {
            EXPECT_EQ(ids[r * n + j], want->top_logprobs[j].first) << r << "," << j;
            EXPECT_EQ(lps[r * n + j], want->top_logprobs[j].second) << r << "," << j;
          } else {
            EXPECT_EQ(ids[r * n + j], -1);
            EXPECT_EQ(lps[r * n + j], -std::numeric_limits<float>::infinity());
          }
        }
      }
    }
  }
  EXPECT_TRUE(be.status().ok()) << be.status();
  std::vector<int32_t> ids(kMaxTopLogprobs + 1, -7);
  std::vector<float> lps(kMaxTopLogprobs + 1, 7.0f);
  std::vector<float> l(4, 0.0f);
  be.TopLogprobsRows(1, 4, l.data(), kMaxTopLogprobs + 1, ids.data(), lps.data());
  EXPECT_EQ(be.status().code(), absl::StatusCode::kInvalidArgument) << be.status();
  EXPECT_NE(be.status().message().find("n must be in [1, 20]"), std::string::npos) << be.status();
  EXPECT_EQ(ids[0], -7);
}

}  // namespace
}  // namespace deepinfer
