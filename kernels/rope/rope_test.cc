// ApplyRopeF32 against CpuBackend::ApplyRope: both layouts, strided heads (the rope slice of
// each query head), large positions, a YaRN attention factor. The whole buffer is compared, so
// writes outside the rope slices are caught too.
#include "kernels/rope/rope.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/mla_attention.h"
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
  for (Shape s : {Shape{1, 0, 64}, Shape{3, 128, 64}, Shape{4, 16, 8}}) {
    for (bool interleaved : {true, false}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message() << "heads " << s.heads << " rope " << s.rope
                                        << " interleaved " << interleaved << " seed " << seed);
      const int64_t tokens = 37, head_stride = s.nope + s.rope;
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

}  // namespace
}  // namespace deepinfer
