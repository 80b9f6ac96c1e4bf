// The weight GEMM shapes of the FP8 GEMM benchmarks (kernels/gemm/fp8_block_gemm_bench,
// worker/backend/cuda/fp8_gemm_bench), their FP8 weight bytes, and the routed experts' row
// counts under random top-k routing.
#ifndef DEEPINFER_KERNELS_TESTING_GEMM_BENCH_SHAPES_H_
#define DEEPINFER_KERNELS_TESTING_GEMM_BENCH_SHAPES_H_

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

namespace deepinfer {
namespace bench {

// A weight [n, k].
struct GemmShape {
  const char* name;
  int64_t n, k;
};

// DeepSeek-V3's weight GEMMs (hidden 7168, q_lora 1536, kv_lora 512 + rope 64, 128 heads, dense
// intermediate 18432, routed experts and the shared expert of 2048).
inline std::vector<GemmShape> DeepSeekV3Gemms() {
  return {{"v3 q_a", 1536, 7168},       {"v3 q_b", 24576, 1536},      {"v3 kv_a", 576, 7168},
          {"v3 o_proj", 7168, 16384},   {"v3 dense gu", 36864, 7168}, {"v3 dense dn", 7168, 18432},
          {"v3 expert gu", 4096, 7168}, {"v3 expert dn", 7168, 2048}};
}

// A routed MoE layer: `experts` of [2 * inter, hidden] (gate; up) and [hidden, inter], `top_k`
// a token.
struct MoeShape {
  const char* name;
  int32_t experts, top_k;
  int64_t hidden, inter;
};

inline MoeShape DeepSeekV3Moe() { return {"v3", 256, 8, 7168, 2048}; }

// Random e4m3 bytes from a xorshift stream of `seed` (never 0x7F / 0xFF, the NaNs).
inline std::vector<uint8_t> RandomFp8(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint8_t& b : v) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    b = static_cast<uint8_t>(x >> 56) & 0xF7;
  }
  return v;
}

// Each of `tokens` tokens routed to `top_k` of `experts` experts uniformly at random (seeded by
// the token count): the experts' row offsets (experts + 1) and how many experts got a row.
struct Routing {
  std::vector<int32_t> offsets;
  int32_t busy = 0;
};

inline Routing RandomRouting(int32_t tokens, int32_t experts, int32_t top_k) {
  std::mt19937 gen(tokens);
  std::vector<int32_t> count(experts, 0);
  for (int32_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> ids(experts);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), gen);
    for (int32_t j = 0; j < top_k; ++j) ++count[ids[j]];
  }
  Routing r;
  r.offsets.assign(experts + 1, 0);
  for (int32_t e = 0; e < experts; ++e) {
    r.offsets[e + 1] = r.offsets[e] + count[e];
    r.busy += count[e] > 0;
  }
  return r;
}

}  // namespace bench
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_TESTING_GEMM_BENCH_SHAPES_H_
