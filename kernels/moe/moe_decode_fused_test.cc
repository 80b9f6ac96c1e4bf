// MoeDecodeFusedF32 against the CPU backend doing the MoE block op by op on the same values
// (bf16 weights widened to fp32, so the CPU multiplies exactly what the kernel does): per token,
// each chosen expert's gate_up Gemm, SiluMul, down Gemm, scaled by its routing weight and summed
// in k order, plus the shared MLP computed whole (intermediate shared_parts * inter, not in
// parts). 1 and 2 tokens, Moonlight- and V3-like shapes (scaled down, and Moonlight's real one),
// random routing with experts repeated across the two tokens, a non-identity slot table,
// poisoned workspace and output, and the argument checks. top_k 0 (a dense MLP as shared parts
// only) with the routed fields null. The shapes reach both down kernels (the stationary one at
// one token where a thread's chunks fit, the grid-strided one past that and at two tokens).
#include "kernels/moe/moe_decode_fused.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe/moe_reference.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::DeviceArray;

struct Shape {
  int32_t experts, top_k, hidden, inter, shared_parts;
};

// n bf16 values (bits) and their fp32 widening.
void RandomBf16(size_t n, std::mt19937& gen, float stddev, std::vector<uint16_t>* bits,
                std::vector<float>* wide) {
  std::normal_distribution<float> d(0.0f, stddev);
  bits->resize(n);
  wide->resize(n);
  for (size_t i = 0; i < n; ++i) {
    (*bits)[i] = kernels::FloatToBf16(d(gen));
    (*wide)[i] = kernels::Bf16ToFloat((*bits)[i]);
  }
}

// The MLP x -> down(silu(gate) * up) of one token on the CPU backend, fp32 weights (limit > 0:
// V4's clamped SwiGLU, V4Ops::SwiGluClamped).
std::vector<float> CpuMlp(CpuBackend& cpu, const float* x, const float* gate_up, const float* down,
                          int64_t hidden, int64_t inter, float limit) {
  std::vector<float> gu(2 * inter), act(inter), y(hidden);
  cpu.Gemm(1, 2 * inter, hidden, x, hidden, gate_up, hidden, gu.data(), 2 * inter, false);
  if (limit > 0.0f) {
    cpu.v4_ops()->SwiGluClamped(1, inter, gu.data(), limit, act.data());
  } else {
    cpu.SiluMul(1, inter, gu.data(), act.data());
  }
  cpu.Gemm(1, hidden, inter, act.data(), inter, down, inter, y.data(), hidden, false);
  return y;
}

// invalid_choice >= 0: token 0's choice of that index gets an expert id past the last expert
// (it must contribute nothing). limit > 0: V4's clamped SwiGLU (MoeDecodeFusedParams::
// swiglu_limit).
void Check(const Shape& s, int32_t tokens, int32_t repeated, int32_t invalid_choice = -1,
           float limit = 0.0f) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << "experts " << s.experts << " top_k " << s.top_k << " hidden " << s.hidden
               << " inter " << s.inter << " shared_parts " << s.shared_parts << " tokens " << tokens
               << " repeated " << repeated << " invalid choice " << invalid_choice << " limit "
               << limit << " seed " << seed);
  std::mt19937 gen(seed);
  const int64_t H = s.hidden, I = s.inter, SI = int64_t{s.shared_parts} * I;
  const int64_t per_expert = 3 * I * H;
  std::vector<uint16_t> w16, shared16;
  std::vector<float> w32, shared32;
  RandomBf16(per_expert * s.experts, gen, 0.05f, &w16, &w32);
  RandomBf16(3 * SI * H + 1, gen, 0.05f, &shared16, &shared32);
  const std::vector<float> hidden = testing::RandomFloats(tokens * H, seed + 1, 1.0f);

  // Routing: distinct ids ascending per token; token 1 repeats `repeated` of token 0's experts.
  std::vector<int32_t> all(s.experts), ids;
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), gen);
  std::vector<int32_t> first(all.begin(), all.begin() + s.top_k);
  ids = first;
  std::sort(ids.begin(), ids.end());
  if (tokens == 2) {
    std::vector<int32_t> second(first.begin(), first.begin() + repeated);
    for (int32_t j = s.top_k; static_cast<int32_t>(second.size()) < s.top_k; ++j) {
      second.push_back(all[j]);
    }
    std::sort(second.begin(), second.end());
    ids.insert(ids.end(), second.begin(), second.end());
  }
  if (invalid_choice >= 0) ids[invalid_choice] = s.experts + 3;
  std::uniform_real_distribution<float> uni(0.05f, 1.0f);
  std::vector<float> topk_w(tokens * s.top_k);
  for (float& v : topk_w) v = uni(gen);
  // Expert e lives in table entry slot_of[e] (reversed order).
  std::vector<int32_t> slot_of(s.experts);
  for (int32_t e = 0; e < s.experts; ++e) slot_of[e] = s.experts - 1 - e;

  DeviceArray<uint16_t> dw(w16), dshared(shared16);
  std::vector<const uint16_t*> gate_up_table(s.experts), down_table(s.experts);
  for (int32_t e = 0; e < s.experts; ++e) {
    gate_up_table[slot_of[e]] = dw.get() + e * per_expert;
    down_table[slot_of[e]] = dw.get() + e * per_expert + 2 * I * H;
  }
  DeviceArray<const uint16_t*> dgu(gate_up_table), ddown(down_table);
  DeviceArray<float> dhidden(hidden), dtopk_w(topk_w);
  DeviceArray<int32_t> dids(ids), dslot(slot_of);
  DeviceArray<float> dact(kernels::MoeDecodeFusedActFloats(tokens, s.top_k, s.shared_parts, I));
  DeviceArray<float> dout(tokens * H);
  CpuBackend cpu(2);
  std::vector<float> want(tokens * H, 0.0f);
  double scale = 0;
  for (int32_t t = 0; t < tokens; ++t) {
    const float* x = hidden.data() + t * H;
    float* o = want.data() + t * H;
    for (int32_t k = 0; k < s.top_k; ++k) {
      if (ids[t * s.top_k + k] >= s.experts) continue;
      const float* ew = w32.data() + ids[t * s.top_k + k] * per_expert;
      const std::vector<float> y = CpuMlp(cpu, x, ew, ew + 2 * I * H, H, I, limit);
      for (int64_t i = 0; i < H; ++i) o[i] += topk_w[t * s.top_k + k] * y[i];
    }
    if (s.shared_parts > 0) {
      const std::vector<float> y =
          CpuMlp(cpu, x, shared32.data(), shared32.data() + 2 * SI * H, H, SI, limit);
      cpu.Add(H, o, y.data(), o);
    }
  }
  for (float v : want) scale = std::max(scale, static_cast<double>(std::abs(v)));

  kernels::MoeDecodeFusedParams p;
  p.num_tokens = tokens;
  p.top_k = s.top_k;
  p.num_experts = s.experts;
  // top_k 0 (a dense MLP): the routed fields must not be read; null them (a read faults).
  const bool routed = s.top_k > 0;
  p.hidden_size = s.hidden;
  p.inter = s.inter;
  p.hidden = dhidden.get();
  p.topk_ids = routed ? dids.get() : nullptr;
  p.topk_weights = routed ? dtopk_w.get() : nullptr;
  p.slot_of_expert = routed ? dslot.get() : nullptr;
  p.gate_up = routed ? dgu.get() : nullptr;
  p.down = routed ? ddown.get() : nullptr;
  p.shared_parts = s.shared_parts;
  p.shared_gate_up = s.shared_parts > 0 ? dshared.get() : nullptr;
  p.shared_down = s.shared_parts > 0 ? dshared.get() + 2 * SI * H : nullptr;
  p.act = dact.get();
  p.out = dout.get();
  p.swiglu_limit = limit;

  dact.Poison();
  dout.Poison();
  DEEPINFER_CUDA_OK(kernels::MoeDecodeFusedF32(p, nullptr));
  std::vector<float> got;
  DEEPINFER_CUDA_OK(dout.Download(&got));
  // fp32 sums of a few thousand products in another order: far below 1e-4 of the largest
  // output; a missing or doubled part, a wrong row or a wrong weight is of the order of the
  // output.
  EXPECT_TRUE(testing::AllClose(got, want, 1e-4 * scale, 1e-4));
}

const Shape kMoonlightSmall{16, 6, 256, 96, 2};
const Shape kV3Small{32, 8, 512, 128, 1};

TEST(MoeDecodeFusedTest, OneTokenMatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check(kMoonlightSmall, 1, 0);
  Check(kV3Small, 1, 0);
  Check({16, 6, 256, 96, 0}, 1, 0);  // no shared experts
  Check({8, 2, 2048, 40, 3}, 1, 0);  // hidden beyond one unrolled pass of the gate_up warp
  // A feature's parts beyond one pass of the grid-strided down block (9 x 256 vectors of 8).
  Check({8, 4, 512, 2048, 1}, 1, 0);
  // V3's down row length and parts (9 x 256 chunks: the stationary down's 5-chunk kernel), and more
  // chunks than the stationary down holds (11 x 256: the grid-strided down).
  Check({16, 8, 256, 2048, 1}, 1, 0);
  Check({16, 8, 256, 2048, 3}, 1, 0);
}

TEST(MoeDecodeFusedTest, InvalidExpertIdContributesNothing) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check(kMoonlightSmall, 1, 0, /*invalid_choice=*/2);
  Check({8, 6, 2048, 1408, 2}, 1, 0, /*invalid_choice=*/5);
}

TEST(MoeDecodeFusedTest, TwoTokensWithRepeatedExpertsMatchCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check(kMoonlightSmall, 2, 0);
  Check(kMoonlightSmall, 2, 3);
  Check(kMoonlightSmall, 2, 6);  // the same experts for both tokens
  Check(kV3Small, 2, 5);
}

// top_k 0: a dense MLP layer as shared parts only (no routing; null routed fields, 0 experts),
// against the CPU backend's Gemm + SiluMul + Gemm over the whole intermediate. Moonlight's dense
// layer (intermediate 11264 = 8 x 1408) and V3's (18432 = 9 x 2048) scaled down, and as one part
// of the whole width; the stationary down's 3- and 5-chunk kernels and past its limit
// (the grid-strided down); two tokens.
TEST(MoeDecodeFusedTest, DenseMlpWithoutRoutingMatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check({0, 0, 256, 96, 8}, 1, 0);    // Moonlight-like, 8 parts
  Check({0, 0, 512, 128, 9}, 1, 0);   // V3-like, 9 parts
  Check({0, 0, 256, 768, 1}, 1, 0);   // one part of the whole intermediate
  Check({0, 0, 256, 1408, 8}, 1, 0);  // 1408 chunks: the 3-chunk stationary down
  Check({0, 0, 256, 2048, 9}, 1, 0);  // 2304 chunks: the 5-chunk stationary down
  Check({0, 0, 256, 2816, 8}, 1, 0);  // 2816 chunks: the grid-strided down
  Check({0, 0, 256, 96, 8}, 2, 0);
  Check({0, 0, 512, 128, 9}, 2, 0);
}

// Moonlight's dense layer at its real sizes: hidden 2048, intermediate 11264 (8 x 1408, and one
// part of 11264: the same chunks).
TEST(MoeDecodeFusedTest, MoonlightDenseSizesMatchCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check({0, 0, 2048, 1408, 8}, 1, 0);
  Check({0, 0, 2048, 11264, 1}, 1, 0);
}

// DeepSeek-V4's clamped SwiGLU in every part (routed and shared): a limit of 0.3 clamps many of
// the gate and up sums of these weights (|sum| ~ 0.05 sqrt(hidden)); V4-Flash's hidden 4096.
TEST(MoeDecodeFusedTest, ClampedSwiGluMatchesCpuV4Ops) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check({16, 6, 512, 256, 1}, 1, 0, -1, 0.3f);
  Check({16, 6, 512, 256, 1}, 2, 2, -1, 0.3f);
  Check({8, 6, 4096, 256, 1}, 1, 0, -1, 0.3f);
}

// Moonlight's real sizes (hidden 2048, moe_intermediate 1408, 2 shared parts), 8 experts.
TEST(MoeDecodeFusedTest, MoonlightSizesMatchCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Shape moonlight{8, 6, 2048, 1408, 2};
  Check(moonlight, 1, 0);
  Check(moonlight, 2, 4);
}

TEST(MoeDecodeFusedTest, RejectsBadArguments) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<float> buf(64);
  DeviceArray<int32_t> ids(4);
  DeviceArray<const uint16_t*> table(1);
  kernels::MoeDecodeFusedParams p;
  p.num_tokens = 1;
  p.top_k = 1;
  p.num_experts = 1;
  p.hidden_size = 8;
  p.inter = 8;
  p.hidden = buf.get();
  p.topk_ids = ids.get();
  p.topk_weights = buf.get();
  p.slot_of_expert = ids.get();
  p.gate_up = table.get();
  p.down = table.get();
  p.act = buf.get();
  p.out = buf.get();
  auto expect_invalid = [](kernels::MoeDecodeFusedParams q, const char* what) {
    EXPECT_EQ(kernels::MoeDecodeFusedF32(q, nullptr), cudaErrorInvalidValue) << what;
  };
  kernels::MoeDecodeFusedParams q = p;
  q.num_tokens = 3;
  expect_invalid(q, "3 tokens");
  q = p;
  q.num_tokens = 0;
  expect_invalid(q, "0 tokens");
  q = p;
  q.hidden_size = 12;
  expect_invalid(q, "hidden not a multiple of 8");
  q = p;
  q.inter = 4;
  expect_invalid(q, "inter not a multiple of 8");
  q = p;
  q.shared_parts = 1;
  expect_invalid(q, "shared parts without weights");
  q = p;
  q.top_k = kernels::kMoeDecodeFusedMaxParts + 1;
  expect_invalid(q, "too many parts");
  q = p;
  q.hidden = buf.get() + 1;
  expect_invalid(q, "misaligned hidden");
  q = p;
  q.out = nullptr;
  expect_invalid(q, "null out");
  q = p;
  q.top_k = 0;
  expect_invalid(q, "no routed experts and no shared parts");
  q = p;
  q.top_k = -1;
  q.shared_parts = 1;
  q.shared_gate_up = reinterpret_cast<const uint16_t*>(buf.get());
  q.shared_down = q.shared_gate_up;
  expect_invalid(q, "negative top_k");
  q.top_k = 0;
  q.shared_parts = kernels::kMoeDecodeFusedMaxParts + 1;
  expect_invalid(q, "too many shared parts without routing");
  q = p;
  q.num_experts = 0;
  expect_invalid(q, "routed experts but none in the table");
  q = p;
  q.topk_ids = nullptr;
  expect_invalid(q, "null topk_ids with top_k > 0");
}

}  // namespace
}  // namespace deepinfer
