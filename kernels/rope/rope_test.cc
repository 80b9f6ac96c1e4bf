// ApplyRopeF32 against CpuBackend::ApplyRope: both layouts, strided heads (the rope slice of
// each query head), large positions, a YaRN attention factor. The whole buffer is compared, so
// writes outside the rope slices are caught too. RmsNormRopeF32 against the CPU and the two
// kernels it replaces, RmsNormRopeToBf16 against its rounded output.
#include "kernels/rope/rope.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/mla_attention.h"
#include "kernels/gemm/small_m_gemm.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

TEST(RopeKernelTest, MatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  struct Shape {
    int64_t heads, nope, rope;
  };
  // 64 heads of 448 + 64 at 1 and 2 tokens: DeepSeek-V4's decode query, its pairs spread over
  // blocks.
  for (Shape s : {Shape{1, 0, 64}, Shape{3, 128, 64}, Shape{4, 16, 8}, Shape{64, 448, 64}}) {
    for (const int64_t tokens : {int64_t{1}, int64_t{2}, int64_t{37}}) {
      for (bool interleaved : {true, false}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << "heads " << s.heads << " rope " << s.rope << " tokens " << tokens
                     << " interleaved " << interleaved << " seed " << seed);
        const int64_t head_stride = s.nope + s.rope;
        const int64_t token_stride = s.heads * head_stride + 5;
        auto x = testing::RandomFloats(tokens * token_stride, seed);
        std::mt19937 gen(seed + 1);
        std::uniform_int_distribution<int32_t> pos(0, 160000);
        std::vector<int32_t> positions(tokens);
        for (int32_t& p : positions) p = pos(gen);
        positions[0] = 0;
        std::vector<float> inv_freq(s.rope / 2);
        for (int64_t j = 0; j < s.rope / 2; ++j) {
          inv_freq[j] = static_cast<float>(std::pow(10000.0, -2.0 * j / s.rope));
        }
        const float factor = 1.2079f;
        std::vector<float> want = x;
        cpu.ApplyRope(tokens, s.heads, want.data() + s.nope, token_stride, head_stride, s.rope,
                      positions.data(), inv_freq.data(), factor, interleaved);
        DeviceArray<float> dx(x), dinv(inv_freq);
        DeviceArray<int32_t> dpos(positions);
        DEEPINFER_CUDA_OK(kernels::ApplyRopeF32(tokens, s.heads, dx.get() + s.nope, token_stride,
                                                head_stride, s.rope, dpos.get(), dinv.get(), factor,
                                                interleaved, nullptr));
        std::vector<float> got;
        DEEPINFER_CUDA_OK(dx.Download(&got));
        EXPECT_TRUE(AllClose(got, want, 2e-6, 2e-6));
      }
    }
  }
}

// NormRopeWriteLatentCacheF32 against CpuBackend::NormRopeWriteLatentCache, and bit for bit
// against the four kernels it replaces (RmsNormF32, ApplyRopeF32 on the key and on the query,
// WriteLatentCacheF32): fp32 and bf16 caches, both rope layouts, with and without a query,
// tokens written to scattered slots. The whole cache and query are compared.
TEST(RopeKernelTest, NormRopeWriteLatentCacheMatchesCpuAndTheUnfusedKernels) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  const int64_t T = 5, L = 512, R = 64, nh = 16, nope = 128, qk = nope + R, kvw = L + R;
  const int64_t slots_total = 24;
  const std::vector<int32_t> slots = {7, 0, 23, 12, 3};
  std::vector<int32_t> positions = {0, 1, 977, 4095, 130000};
  std::vector<float> inv_freq(R / 2);
  for (int64_t j = 0; j < R / 2; ++j) inv_freq[j] = std::pow(10000.0f, -2.0f * j / R);
  for (bool bf16 : {false, true}) {
    for (bool interleaved : {true, false}) {
      for (int64_t heads : {nh, int64_t{0}}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << "bf16 " << bf16 << " interleaved " << interleaved
                                          << " heads " << heads << " seed " << seed);
        auto kv = testing::RandomFloats(T * kvw, seed, 2.0f);
        auto q = testing::RandomFloats(T * nh * qk, seed + 1);
        auto w = testing::RandomFloats(L, seed + 2);
        const size_t value_bytes = bf16 ? 2 : 4;
        const size_t cache_bytes = slots_total * kvw * value_bytes;
        std::vector<uint8_t> cache0(cache_bytes, 0x5a);

        // CPU reference.
        std::vector<float> cq = q;
        std::vector<uint8_t> ccache = cache0;
        NormRopeCacheArgs a;
        a.tokens = T, a.kv = kv.data(), a.ld_kv = kvw, a.norm_weight = w.data(), a.eps = 1e-6f;
        a.q = cq.data() + nope, a.q_heads = heads, a.q_token_stride = nh * qk, a.q_head_stride = qk;
        a.positions = positions.data(), a.inv_freq = inv_freq.data(), a.attention_factor = 1.25f;
        a.interleaved = interleaved, a.slots = slots.data();
        a.cache.cache = ccache.data(), a.cache.block_size = 4, a.cache.latent_dim = L;
        a.cache.rope_dim = R;
        a.cache.dtype = bf16 ? WeightDType::kBFloat16 : WeightDType::kFloat32;
        cpu.NormRopeWriteLatentCache(a);

        // Fused kernel.
        DeviceArray<float> dkv(kv), dq(q), dw(w), dinv(inv_freq);
        DeviceArray<int32_t> dslots(slots), dpos(positions);
        DeviceArray<uint8_t> dcache(cache0);
        kernels::NormRopeCacheParams p;
        p.tokens = T, p.kv = dkv.get(), p.ld_kv = kvw, p.norm_weight = dw.get(), p.eps = 1e-6f;
        p.latent_dim = L, p.rope_dim = R;
        p.q = dq.get() + nope, p.q_heads = heads, p.q_token_stride = nh * qk, p.q_head_stride = qk;
        p.positions = dpos.get(), p.inv_freq = dinv.get(), p.attention_factor = 1.25f;
        p.interleaved = interleaved, p.slots = dslots.get(), p.cache = dcache.get();
        p.cache_bf16 = bf16;
        DEEPINFER_CUDA_OK(kernels::NormRopeWriteLatentCacheF32(p, nullptr));
        std::vector<float> got_q, got_kv;
        std::vector<uint8_t> got_cache;
        DEEPINFER_CUDA_OK(dq.Download(&got_q));
        DEEPINFER_CUDA_OK(dkv.Download(&got_kv));
        DEEPINFER_CUDA_OK(dcache.Download(&got_cache));
        EXPECT_EQ(got_kv, kv) << "kv must not change";

        // The unfused kernels, on copies.
        DeviceArray<float> ukv(kv), uq(q), ulatent(T * L);
        DeviceArray<uint8_t> ucache(cache0);
        DEEPINFER_CUDA_OK(
            kernels::RmsNormF32(T, L, ukv.get(), kvw, dw.get(), 1e-6f, ulatent.get(), L, nullptr));
        DEEPINFER_CUDA_OK(kernels::ApplyRopeF32(T, 1, ukv.get() + L, kvw, 0, R, dpos.get(),
                                                dinv.get(), 1.25f, interleaved, nullptr));
        if (heads > 0) {
          DEEPINFER_CUDA_OK(kernels::ApplyRopeF32(T, heads, uq.get() + nope, nh * qk, qk, R,
                                                  dpos.get(), dinv.get(), 1.25f, interleaved,
                                                  nullptr));
        }
        kernels::PagedLatentCache uc{
            ucache.get(), 4, static_cast<int32_t>(L), static_cast<int32_t>(R),
            bf16 ? kernels::LatentCacheType::kBFloat16 : kernels::LatentCacheType::kFloat32};
        DEEPINFER_CUDA_OK(kernels::WriteLatentCacheF32(T, ulatent.get(), L, ukv.get() + L, kvw,
                                                       dslots.get(), uc, nullptr));
        std::vector<float> unfused_q;
        std::vector<uint8_t> unfused_cache;
        DEEPINFER_CUDA_OK(uq.Download(&unfused_q));
        DEEPINFER_CUDA_OK(ucache.Download(&unfused_cache));
        EXPECT_EQ(got_q, unfused_q);
        EXPECT_TRUE(got_cache == unfused_cache) << "cache differs from the unfused kernels'";

        // Against the CPU: the query and the cache as fp32 values.
        EXPECT_TRUE(AllClose(got_q, cq, 1e-5, 1e-5));
        auto widen = [&](const std::vector<uint8_t>& bytes) {
          std::vector<float> v(slots_total * kvw);
          for (size_t i = 0; i < v.size(); ++i) {
            if (bf16) {
              uint16_t b;
              std::memcpy(&b, bytes.data() + 2 * i, 2);
              v[i] = Bf16BitsToFloat(b);
            } else {
              std::memcpy(&v[i], bytes.data() + 4 * i, 4);
            }
          }
          return v;
        };
        // bf16: a 1e-5-close fp32 value can round to the neighbouring bf16 value.
        EXPECT_TRUE(AllClose(widen(got_cache), widen(ccache), 1e-5, bf16 ? 1.0 / 128 : 1e-5));
      }
    }
  }
}

// NormRopeCacheAbsorbQueryF32 against CpuBackend::NormRopeCacheAbsorbQuery (its
// NormRopeWriteLatentCache + BatchedGemm with bf16 W_uk), and bit for bit against the two
// launches it replaces (NormRopeWriteLatentCacheF32, then SmallMGemmBf16 with m = tokens and
// batch = heads, the CUDA backend's W_uk product): 1-4 tokens, nope 64 / 128 / 256 / 320 (8, 16
// and 32 lanes a row, one or two chunks a lane), a latent not a multiple of a block's rows, both
// caches. The whole query, cache and output are compared (poisoned output: unwritten rows fail).
TEST(RopeKernelTest, NormRopeCacheAbsorbQueryMatchesCpuAndTheTwoLaunches) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  struct Case {
    int64_t tokens, heads, nope, latent;
    bool bf16;
  };
  const int64_t R = 64;
  for (const Case& c :
       {Case{1, 16, 128, 512, true}, Case{1, 16, 128, 512, false}, Case{3, 5, 64, 100, true},
        Case{4, 2, 256, 512, true}, Case{2, 3, 320, 264, false}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "tokens " << c.tokens << " heads " << c.heads << " nope " << c.nope
                 << " latent " << c.latent << " bf16 " << c.bf16 << " seed " << seed);
    const int64_t T = c.tokens, L = c.latent, nh = c.heads, nope = c.nope;
    const int64_t qk = nope + R, kvw = L + R, slots_total = 9;
    const std::vector<int32_t> all_slots = {5, 0, 8, 2};
    const std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + T);
    const std::vector<int32_t> all_pos = {1023, 0, 4095, 77};
    const std::vector<int32_t> positions(all_pos.begin(), all_pos.begin() + T);
    std::vector<float> inv_freq(R / 2);
    for (int64_t j = 0; j < R / 2; ++j) inv_freq[j] = std::pow(10000.0f, -2.0f * j / R);
    auto kv = testing::RandomFloats(T * kvw, seed, 2.0f);
    auto q = testing::RandomFloats(T * nh * qk, seed + 1);
    auto w = testing::RandomFloats(L, seed + 2);
    const std::vector<uint16_t> wuk =
        FloatsToBf16Bits(testing::RandomFloats(nh * L * nope, seed + 3, 0.1f));
    const size_t value_bytes = c.bf16 ? 2 : 4;
    std::vector<uint8_t> cache0(slots_total * kvw * value_bytes, 0x5a);

    // CPU reference (Backend's default: the two ops).
    std::vector<float> cq = q, cq_latent(T * nh * L, 0.0f);
    std::vector<uint8_t> ccache = cache0;
    NormRopeCacheArgs a;
    a.tokens = T, a.kv = kv.data(), a.ld_kv = kvw, a.norm_weight = w.data(), a.eps = 1e-6f;
    a.q = cq.data() + nope, a.q_heads = nh, a.q_token_stride = nh * qk, a.q_head_stride = qk;
    a.positions = positions.data(), a.inv_freq = inv_freq.data(), a.attention_factor = 1.25f;
    a.interleaved = true, a.slots = slots.data();
    a.cache.cache = ccache.data(), a.cache.block_size = 4, a.cache.latent_dim = L;
    a.cache.rope_dim = R;
    a.cache.dtype = c.bf16 ? WeightDType::kBFloat16 : WeightDType::kFloat32;
    AbsorbQueryArgs aq;
    aq.heads = nh, aq.nope_dim = nope, aq.latent_dim = L;
    aq.q_nope = cq.data(), aq.q_token_stride = nh * qk, aq.q_head_stride = qk;
    aq.w_uk = WeightView(wuk.data(), WeightDType::kBFloat16);
    aq.q_latent = cq_latent.data();
    cpu.NormRopeCacheAbsorbQuery(a, aq);

    // The fused launch.
    DeviceArray<float> dkv(kv), dq(q), dw(w), dinv(inv_freq), dout(T * nh * L);
    DeviceArray<int32_t> dslots(slots), dpos(positions);
    DeviceArray<uint8_t> dcache(cache0);
    DeviceArray<uint16_t> dwuk(wuk);
    dout.Poison();
    kernels::NormRopeCacheParams p;
    p.tokens = T, p.kv = dkv.get(), p.ld_kv = kvw, p.norm_weight = dw.get(), p.eps = 1e-6f;
    p.latent_dim = L, p.rope_dim = R;
    p.q = dq.get() + nope, p.q_heads = nh, p.q_token_stride = nh * qk, p.q_head_stride = qk;
    p.positions = dpos.get(), p.inv_freq = dinv.get(), p.attention_factor = 1.25f;
    p.interleaved = true, p.slots = dslots.get(), p.cache = dcache.get();
    p.cache_bf16 = c.bf16;
    kernels::AbsorbQueryParams ka;
    ka.heads = nh, ka.nope_dim = nope, ka.latent_dim = L;
    ka.q_nope = dq.get(), ka.q_token_stride = nh * qk, ka.q_head_stride = qk;
    ka.w = dwuk.get(), ka.out = dout.get();
    ASSERT_TRUE(kernels::NormRopeCacheAbsorbQuerySupported(p, ka));
    DEEPINFER_CUDA_OK(kernels::NormRopeCacheAbsorbQueryF32(p, ka, nullptr));
    std::vector<float> got_q, got_out;
    std::vector<uint8_t> got_cache;
    DEEPINFER_CUDA_OK(dq.Download(&got_q));
    DEEPINFER_CUDA_OK(dout.Download(&got_out));
    DEEPINFER_CUDA_OK(dcache.Download(&got_cache));

    // The two launches, on copies.
    DeviceArray<float> uq(q), uout(T * nh * L);
    DeviceArray<uint8_t> ucache(cache0);
    uout.Poison();
    kernels::NormRopeCacheParams up = p;
    up.q = uq.get() + nope, up.cache = ucache.get();
    DEEPINFER_CUDA_OK(kernels::NormRopeWriteLatentCacheF32(up, nullptr));
    kernels::SmallMGemmParams g;
    g.m = T, g.n = L, g.k = nope, g.a = uq.get(), g.lda = nh * qk;
    g.w = dwuk.get(), g.ldw = nope, g.c = uout.get(), g.ldc = nh * L;
    g.batch = nh, g.stride_a = qk, g.stride_w = L * nope, g.stride_c = L;
    g.algo = kernels::SmallMGemmAlgo::kRowPerGroup;
    DEEPINFER_CUDA_OK(kernels::SmallMGemmBf16(g, nullptr));
    std::vector<float> two_q, two_out;
    std::vector<uint8_t> two_cache;
    DEEPINFER_CUDA_OK(uq.Download(&two_q));
    DEEPINFER_CUDA_OK(uout.Download(&two_out));
    DEEPINFER_CUDA_OK(ucache.Download(&two_cache));
    EXPECT_EQ(got_q, two_q);
    EXPECT_TRUE(got_cache == two_cache) << "cache differs from the two launches'";
    EXPECT_EQ(got_out, two_out);

    // Against the CPU.
    EXPECT_TRUE(AllClose(got_q, cq, 1e-5, 1e-5));
    EXPECT_TRUE(AllClose(got_out, cq_latent, 1e-4, 1e-4));
    if (!c.bf16) {
      std::vector<float> gc(got_cache.size() / 4), cc(ccache.size() / 4);
      std::memcpy(gc.data(), got_cache.data(), got_cache.size());
      std::memcpy(cc.data(), ccache.data(), ccache.size());
      EXPECT_TRUE(AllClose(gc, cc, 1e-5, 1e-5));
    }
  }
}

// Arguments outside NormRopeCacheAbsorbQuerySupported launch nothing and say so.
// RmsNormRopeF32 against CpuBackend's RmsNorm + ApplyRope, and bit for bit against the two
// kernels it replaces (RmsNormF32, ApplyRopeF32); RmsNormRopeToBf16 bit for bit its values
// rounded; RmsNormRopeBf16 (bf16 rows in) against the CPU on the widened rows and bit for bit
// RmsNormRopeToBf16 on them (rows of an even stride): DeepSeek-V4's query (1 and 3 tokens x 64
// heads of 512, rope 64, normed in place), its key and compressed entries (one head of 512 and of
// 128), rows not a multiple of 32 wide and padded row strides, each warp-row size (up to 2048), row
// counts on both sides of the few-rows launch shape's limit (128), each launch shape
// (RopeRows::kAuto, kWide), blocks within one token (16 heads: the shared cos/sin of 8 fp32 or
// 16 bf16 rows) and across tokens (12 heads), an odd count of rows.
TEST(RopeKernelTest, RmsNormRopeMatchesCpuAndTheTwoKernels) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  struct Case {
    int64_t tokens, heads, dim, rope, ld;
    bool in_place;
  };
  for (const Case& c : {Case{1, 64, 512, 64, 512, true}, Case{3, 64, 512, 64, 512, true},
                        Case{37, 1, 512, 64, 512, false}, Case{5, 1, 128, 64, 128, false},
                        Case{9, 3, 200, 16, 205, false}, Case{4, 2, 1000, 64, 1000, true},
                        Case{2, 2, 2048, 64, 2052, false}, Case{1, 65, 512, 64, 512, true},
                        Case{1, 129, 128, 64, 128, false}, Case{1, 1, 512, 64, 512, true},
                        Case{20, 16, 512, 64, 512, true}, Case{21, 12, 512, 64, 520, false}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "tokens " << c.tokens << " heads " << c.heads << " dim " << c.dim << " rope "
                 << c.rope << " ld " << c.ld << " in place " << c.in_place << " seed " << seed);
    const int64_t rows = c.tokens * c.heads, n = rows * c.ld;
    auto x = testing::RandomFloats(n, seed, 3.0f);
    auto w = testing::RandomFloats(c.dim, seed + 1);
    std::mt19937 gen(seed + 2);
    std::uniform_int_distribution<int32_t> pos(0, 160000);
    std::vector<int32_t> positions(c.tokens);
    for (int32_t& p : positions) p = pos(gen);
    std::vector<float> inv_freq(c.rope / 2);
    for (int64_t j = 0; j < c.rope / 2; ++j) {
      inv_freq[j] = static_cast<float>(std::pow(160000.0, -2.0 * j / c.rope));
    }
    const float eps = 1e-6f, factor = 1.2079f;
    // The CPU reference: the two ops, into a separate buffer (the padding between rows kept).
    std::vector<float> want = x;
    cpu.RmsNorm(rows, c.dim, x.data(), c.ld, w.data(), eps, want.data(), c.ld);
    cpu.ApplyRope(c.tokens, c.heads, want.data() + c.dim - c.rope, c.heads * c.ld, c.ld, c.rope,
                  positions.data(), inv_freq.data(), factor, /*interleaved=*/true);
    DeviceArray<float> dw(w), dinv(inv_freq), ux(x), uout(x);
    DeviceArray<int32_t> dpos(positions);
    float* uo = c.in_place ? ux.get() : uout.get();
    DEEPINFER_CUDA_OK(
        kernels::RmsNormF32(rows, c.dim, ux.get(), c.ld, dw.get(), eps, uo, c.ld, nullptr));
    DEEPINFER_CUDA_OK(kernels::ApplyRopeF32(c.tokens, c.heads, uo + c.dim - c.rope, c.heads * c.ld,
                                            c.ld, c.rope, dpos.get(), dinv.get(), factor,
                                            /*interleaved=*/true, nullptr));
    std::vector<float> unfused;
    DEEPINFER_CUDA_OK((c.in_place ? ux : uout).Download(&unfused));
    ASSERT_TRUE(kernels::RmsNormRopeSupported(c.tokens, c.heads, c.dim, c.rope));
    for (const kernels::RopeRows shape : {kernels::RopeRows::kAuto, kernels::RopeRows::kWide}) {
      SCOPED_TRACE(::testing::Message() << "rows shape " << static_cast<int>(shape));
      DeviceArray<float> dx(x), dout(x);
      float* out = c.in_place ? dx.get() : dout.get();
      DEEPINFER_CUDA_OK(kernels::RmsNormRopeF32(c.tokens, c.heads, c.dim, dx.get(), c.ld, dw.get(),
                                                eps, out, c.ld, c.rope, dpos.get(), dinv.get(),
                                                factor, nullptr, shape));
      std::vector<float> got;
      DEEPINFER_CUDA_OK((c.in_place ? dx : dout).Download(&got));
      EXPECT_TRUE(AllClose(got, want, 2e-5, 2e-6));
      ASSERT_EQ(got.size(), unfused.size());
      EXPECT_EQ(0, std::memcmp(got.data(), unfused.data(), got.size() * sizeof(float)))
          << "not bit for bit RmsNormF32 + ApplyRopeF32";
    }
    // The bf16 output: the fp32 output rounded to nearest even, value for value (the padding
    // between rows untouched).
    const uint16_t kUntouched = 0x7FC1;
    DeviceArray<uint16_t> d16(std::vector<uint16_t>(n, kUntouched));
    DeviceArray<float> x_again(x);
    DEEPINFER_CUDA_OK(kernels::RmsNormRopeToBf16(c.tokens, c.heads, c.dim, x_again.get(), c.ld,
                                                 dw.get(), eps, d16.get(), c.ld, c.rope, dpos.get(),
                                                 dinv.get(), factor, nullptr));
    std::vector<uint16_t> got16;
    DEEPINFER_CUDA_OK(d16.Download(&got16));
    int64_t wrong = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < c.ld; ++i) {
        const int64_t e = r * c.ld + i;
        wrong += got16[e] != (i < c.dim ? FloatToBf16Bits(unfused[e]) : kUntouched);
      }
    }
    EXPECT_EQ(wrong, 0) << "bf16 output differs from RmsNormRopeF32's rounded";

    // bf16 rows in: the CPU's RmsNorm + ApplyRope of the widened rows within the output's
    // rounding, and bit for bit RmsNormRopeToBf16 on the widened rows (in place where the case
    // is; the padding between rows untouched). An odd row stride is refused (4-byte words).
    if (c.ld % 2 != 0) {
      DeviceArray<uint16_t> dx16(std::vector<uint16_t>(n, 0));
      EXPECT_EQ(cudaErrorInvalidValue,
                kernels::RmsNormRopeBf16(c.tokens, c.heads, c.dim, dx16.get(), c.ld, dw.get(), eps,
                                         dx16.get(), c.ld, c.rope, dpos.get(), dinv.get(), factor,
                                         nullptr));
      continue;
    }
    std::vector<uint16_t> x16(n);
    std::vector<float> widened(n);
    for (int64_t e = 0; e < n; ++e) {
      x16[e] = FloatToBf16Bits(x[e]);
      widened[e] = Bf16BitsToFloat(x16[e]);
    }
    std::vector<float> want_w = widened;
    cpu.RmsNorm(rows, c.dim, widened.data(), c.ld, w.data(), eps, want_w.data(), c.ld);
    cpu.ApplyRope(c.tokens, c.heads, want_w.data() + c.dim - c.rope, c.heads * c.ld, c.ld, c.rope,
                  positions.data(), inv_freq.data(), factor, /*interleaved=*/true);
    DeviceArray<float> dwidened(widened);
    DeviceArray<uint16_t> ref16(std::vector<uint16_t>(n, kUntouched));
    DEEPINFER_CUDA_OK(kernels::RmsNormRopeToBf16(c.tokens, c.heads, c.dim, dwidened.get(), c.ld,
                                                 dw.get(), eps, ref16.get(), c.ld, c.rope,
                                                 dpos.get(), dinv.get(), factor, nullptr));
    std::vector<uint16_t> input16 = x16;
    if (!c.in_place) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t i = c.dim; i < c.ld; ++i) input16[r * c.ld + i] = kUntouched;
      }
    }
    DeviceArray<uint16_t> dx16(input16), dout16(std::vector<uint16_t>(n, kUntouched));
    uint16_t* out16 = c.in_place ? dx16.get() : dout16.get();
    DEEPINFER_CUDA_OK(kernels::RmsNormRopeBf16(c.tokens, c.heads, c.dim, dx16.get(), c.ld, dw.get(),
                                               eps, out16, c.ld, c.rope, dpos.get(), dinv.get(),
                                               factor, nullptr));
    std::vector<uint16_t> from16, want16;
    DEEPINFER_CUDA_OK((c.in_place ? dx16 : dout16).Download(&from16));
    DEEPINFER_CUDA_OK(ref16.Download(&want16));
    std::vector<float> got_w, cpu_w;
    wrong = 0;
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t i = 0; i < c.ld; ++i) {
        const int64_t e = r * c.ld + i;
        if (i >= c.dim) {
          // In place the padding keeps the input's bits; otherwise it is untouched.
          wrong += from16[e] != (c.in_place ? x16[e] : kUntouched);
          continue;
        }
        wrong += from16[e] != want16[e];
        got_w.push_back(Bf16BitsToFloat(from16[e]));
        cpu_w.push_back(want_w[e]);
      }
    }
    EXPECT_EQ(wrong, 0) << "bf16 rows in: not RmsNormRopeToBf16 on the widened rows";
    EXPECT_TRUE(AllClose(got_w, cpu_w, 1e-6, 1.0 / 256)) << "bf16 rows in: against the CPU";
  }
  EXPECT_EQ(cudaErrorInvalidValue,
            kernels::RmsNormRopeBf16(1, 2, 64, reinterpret_cast<const uint16_t*>(16), 64, nullptr,
                                     1e-6f, reinterpret_cast<uint16_t*>(16), 80, 16, nullptr,
                                     nullptr, 1.0f, nullptr))
      << "in place with another row stride";
  EXPECT_FALSE(kernels::RmsNormRopeSupported(1, 1, 2049, 64));
  EXPECT_FALSE(kernels::RmsNormRopeSupported(1, 1, 512, 63));
  EXPECT_FALSE(kernels::RmsNormRopeSupported(1, 1, 64, 128));
  EXPECT_FALSE(kernels::RmsNormRopeSupported(1, 0, 512, 64));
  EXPECT_EQ(cudaErrorInvalidValue,
            kernels::RmsNormRopeF32(1, 1, 2049, nullptr, 2049, nullptr, 1e-6f, nullptr, 2049, 64,
                                    nullptr, nullptr, 1.0f, nullptr));
}

// RmsNormRopePairF32 bit for bit RmsNormRopeF32 on each of its two calls, and within the
// tolerance of CpuBackend's RmsNorm + ApplyRope: DeepSeek-V4's query heads (in place) with its
// key row (1 and 3 tokens, 64 x 512 and 1 x 512; 3 x 64 rows: the wide launch shape), rows of
// 128 with rows of 200 (one width class, padded strides), each launch shape; a pair of two width
// classes is refused.
TEST(RopeKernelTest, RmsNormRopePairIsTheTwoCalls) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  struct Rows {
    int64_t heads, dim, ld;
    bool in_place;
  };
  struct Case {
    int64_t tokens;
    Rows a, b;
  };
  constexpr int64_t kRope = 64;
  for (const Case& c : {Case{1, {64, 512, 512, true}, {1, 512, 512, false}},
                        Case{3, {64, 512, 512, true}, {1, 512, 512, false}},
                        Case{2, {5, 128, 130, false}, {3, 200, 200, true}}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "tokens " << c.tokens << " a " << c.a.heads << " x "
                                      << c.a.dim << " b " << c.b.heads << " x " << c.b.dim
                                      << " seed " << seed);
    std::mt19937 gen(seed);
    std::uniform_int_distribution<int32_t> pos(0, 160000);
    std::vector<int32_t> positions(c.tokens);
    for (int32_t& p : positions) p = pos(gen);
    std::vector<float> inv_freq(kRope / 2);
    for (int64_t j = 0; j < kRope / 2; ++j) {
      inv_freq[j] = static_cast<float>(std::pow(160000.0, -2.0 * j / kRope));
    }
    const float eps = 1e-6f, factor = 1.2079f;
    DeviceArray<int32_t> dpos(positions);
    DeviceArray<float> dinv(inv_freq);
    struct Side {
      std::vector<float> x, w, want;
      std::unique_ptr<DeviceArray<float>> dw;
    };
    Side side[2];
    for (int i = 0; i < 2; ++i) {
      const Rows& r = i == 0 ? c.a : c.b;
      const int64_t rows = c.tokens * r.heads;
      side[i].x = testing::RandomFloats(rows * r.ld, seed + 1 + 2 * i, 3.0f);
      side[i].w = testing::RandomFloats(r.dim, seed + 2 + 2 * i);
      side[i].dw = std::make_unique<DeviceArray<float>>(side[i].w);
      side[i].want = side[i].x;
      cpu.RmsNorm(rows, r.dim, side[i].x.data(), r.ld, side[i].w.data(), eps,
                  side[i].want.data(), r.ld);
      cpu.ApplyRope(c.tokens, r.heads, side[i].want.data() + r.dim - kRope, r.heads * r.ld, r.ld,
                    kRope, positions.data(), inv_freq.data(), factor, /*interleaved=*/true);
    }
    // Each call alone.
    std::vector<float> single[2];
    for (int i = 0; i < 2; ++i) {
      const Rows& r = i == 0 ? c.a : c.b;
      DeviceArray<float> dx(side[i].x), dout(side[i].x);
      float* out = r.in_place ? dx.get() : dout.get();
      DEEPINFER_CUDA_OK(kernels::RmsNormRopeF32(c.tokens, r.heads, r.dim, dx.get(), r.ld,
                                                side[i].dw->get(), eps, out, r.ld, kRope,
                                                dpos.get(), dinv.get(), factor, nullptr));
      DEEPINFER_CUDA_OK((r.in_place ? dx : dout).Download(&single[i]));
    }
    for (const kernels::RopeRows shape : {kernels::RopeRows::kAuto, kernels::RopeRows::kWide}) {
      SCOPED_TRACE(::testing::Message() << "rows shape " << static_cast<int>(shape));
      DeviceArray<float> dx0(side[0].x), dout0(side[0].x), dx1(side[1].x), dout1(side[1].x);
      kernels::RmsNormRopeRows rows[2];
      DeviceArray<float>* outs[2] = {c.a.in_place ? &dx0 : &dout0, c.b.in_place ? &dx1 : &dout1};
      DeviceArray<float>* xs[2] = {&dx0, &dx1};
      for (int i = 0; i < 2; ++i) {
        const Rows& r = i == 0 ? c.a : c.b;
        rows[i].tokens = c.tokens, rows[i].heads = r.heads, rows[i].dim = r.dim;
        rows[i].x = xs[i]->get(), rows[i].ldx = r.ld, rows[i].weight = side[i].dw->get();
        rows[i].out = outs[i]->get(), rows[i].ldout = r.ld;
      }
      ASSERT_TRUE(kernels::RmsNormRopePairSupported(rows[0], rows[1], kRope));
      DEEPINFER_CUDA_OK(kernels::RmsNormRopePairF32(rows[0], rows[1], eps, kRope, dpos.get(),
                                                    dinv.get(), factor, nullptr, shape));
      for (int i = 0; i < 2; ++i) {
        SCOPED_TRACE(i == 0 ? "first" : "second");
        std::vector<float> got;
        DEEPINFER_CUDA_OK(outs[i]->Download(&got));
        EXPECT_TRUE(AllClose(got, side[i].want, 2e-5, 2e-6));
        ASSERT_EQ(got.size(), single[i].size());
        EXPECT_EQ(0, std::memcmp(got.data(), single[i].data(), got.size() * sizeof(float)))
            << "not bit for bit RmsNormRopeF32";
      }
    }
  }
  kernels::RmsNormRopeRows q, k;
  q.tokens = 1, q.heads = 64, q.dim = 512, k.tokens = 1, k.heads = 1, k.dim = 128;
  std::vector<float> any(1);
  q.out = k.out = any.data();  // never read: refused before any launch
  q.x = k.x = any.data();
  EXPECT_FALSE(kernels::RmsNormRopePairSupported(q, k, kRope));
  EXPECT_EQ(kernels::RmsNormRopePairF32(q, k, 1e-6f, kRope, nullptr, nullptr, 1.0f, nullptr),
            cudaErrorInvalidValue);
}

TEST(RopeKernelTest, NormRopeCacheAbsorbQueryRejectsWhatItDoesNotTake) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<float> buf(4096);
  DeviceArray<uint16_t> w(4096);
  kernels::NormRopeCacheParams p;
  p.tokens = 1, p.kv = buf.get(), p.ld_kv = 576, p.latent_dim = 512, p.rope_dim = 64;
  p.q = buf.get() + 128, p.q_heads = 1, p.q_token_stride = 192, p.q_head_stride = 192;
  kernels::AbsorbQueryParams a;
  a.heads = 1, a.nope_dim = 128, a.latent_dim = 8, a.q_nope = buf.get(), a.q_token_stride = 192;
  a.q_head_stride = 192, a.w = w.get(), a.out = buf.get() + 1024;
  EXPECT_TRUE(kernels::NormRopeCacheAbsorbQuerySupported(p, a));
  auto rejected = [&](kernels::NormRopeCacheParams pp, kernels::AbsorbQueryParams aa) {
    return !kernels::NormRopeCacheAbsorbQuerySupported(pp, aa) &&
           kernels::NormRopeCacheAbsorbQueryF32(pp, aa, nullptr) == cudaErrorInvalidValue;
  };
  kernels::NormRopeCacheParams p5 = p;
  p5.tokens = 5;
  EXPECT_TRUE(rejected(p5, a)) << "5 tokens";
  kernels::NormRopeCacheParams p0 = p;
  p0.q_heads = 0;
  EXPECT_TRUE(rejected(p0, a)) << "no query rope";
  kernels::AbsorbQueryParams a_nope = a;
  a_nope.nope_dim = 132;
  EXPECT_TRUE(rejected(p, a_nope)) << "nope 132";
  a_nope.nope_dim = 520;
  EXPECT_TRUE(rejected(p, a_nope)) << "nope 520";
  kernels::AbsorbQueryParams a_align = a;
  a_align.q_nope = buf.get() + 1;
  EXPECT_TRUE(rejected(p, a_align)) << "q_nope misaligned";
  a_align = a;
  a_align.q_head_stride = 194;
  EXPECT_TRUE(rejected(p, a_align)) << "head stride misaligned";
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace deepinfer
