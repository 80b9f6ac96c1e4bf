// prefill_passes_bench: the memory-bound passes of a prefill step at 8192 and 32768 rows
// (Moonlight shape: hidden 2048, 64 experts top-6, moe_intermediate 1408, 2 shared experts,
// dense intermediate 11264), each with the previous kernel ("old",
// kernels::SetVectorisedMemoryPasses(false)) and the current one ("new") in the same process:
//
//   silu_dense / silu_shared   SiluMulF32ToBf16: fp32 [rows, 2I] in, bf16 [rows, I] out
//   silu_routed                SiluMulBf16 over rows * top_k expert rows (bf16 in, unchanged)
//   permute                    MoePermuteF32 (plan + bf16 gather, rows padded to 128 as the
//                              chunked cuBLAS path); new = multi-block plan + by-token gather
//   combine                    MoeCombineF32, bf16 expert rows in, out overwritten
//   gather_rows                GatherRowsF32, the embedding lookup (vocab 129280)
//   add_rms_norm               AddRmsNormF32 with fp32 and bf16 outputs (scalar / 16-byte)
//
// Time: bench::MedianMs (CUDA events, median of 20 after 3 warm-ups). GB/s counts the bytes the
// pass must move once (each input read once, each output written once; the permutation: the
// hidden rows once and the top_k bf16 rows, its plan's index traffic left out), against
// 4.3 TB/s. Exit status 1 on a CUDA error.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

#include "kernels/activation/elementwise.h"
#include "kernels/common/memory_pass_variant.h"
#include "kernels/embedding/rows.h"
#include "kernels/moe/expert_activation.h"
#include "kernels/moe/moe_permute.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

using bench::DeviceAlloc;

constexpr int64_t kHidden = 2048, kExperts = 64, kTopK = 6, kInter = 1408, kShared = 2;
constexpr int64_t kDenseInter = 11264, kVocab = 129280;
constexpr double kPeakBytesPerS = 4.3e12;

// Fraction of kPeakBytesPerS that `bytes` in `ms` milliseconds reach.
double Fraction(double bytes, double ms) { return bytes / (ms * 1e-3) / kPeakBytesPerS; }

template <typename Fn>
void Report(const char* name, int64_t rows, double bytes, Fn&& fn) {
  double ms[2];
  for (int v = 0; v < 2; ++v) {
    kernels::SetVectorisedMemoryPasses(v == 1);
    ms[v] = bench::MedianMs(fn);
  }
  kernels::SetVectorisedMemoryPasses(true);
  std::printf(
      "%-14s rows %6lld  %8.1f MB  old %8.1f us %6.0f GB/s (%4.1f%%)  new %8.1f us %6.0f "
      "GB/s (%4.1f%%)  %.2fx\n",
      name, static_cast<long long>(rows), bytes / 1e6, ms[0] * 1e3, bytes / ms[0] / 1e6,
      100 * Fraction(bytes, ms[0]), ms[1] * 1e3, bytes / ms[1] / 1e6, 100 * Fraction(bytes, ms[1]),
      ms[0] / ms[1]);
  std::fflush(stdout);
}

void Run(int64_t T) {
  std::mt19937 gen(static_cast<uint32_t>(T));
  // SiLU-mul, fp32 in (the dense MLP and the shared experts: gate_up GEMMs write fp32).
  {
    const int64_t inter_max = kDenseInter;
    float* x = DeviceAlloc<float>(T * 2 * inter_max * sizeof(float));
    uint16_t* out = DeviceAlloc<uint16_t>(T * inter_max * sizeof(uint16_t));
    BENCH_CUDA(cudaMemset(x, 0x3c, T * 2 * inter_max * sizeof(float)));
    for (int64_t inter : {kDenseInter, kShared * kInter}) {
      Report(inter == kDenseInter ? "silu_dense" : "silu_shared", T,
             static_cast<double>(T) * inter * (8 + 2),
             [&] { return kernels::SiluMulF32ToBf16(T, inter, x, out, nullptr); });
    }
    BENCH_CUDA(cudaFree(x));
    BENCH_CUDA(cudaFree(out));
  }
  // The routed experts' SiLU-mul (bf16 in), over rows * top_k rows.
  {
    const int64_t rows = T * kTopK;
    uint16_t* x = DeviceAlloc<uint16_t>(rows * 2 * kInter * 2);
    uint16_t* out = DeviceAlloc<uint16_t>(rows * kInter * 2);
    BENCH_CUDA(cudaMemset(x, 0x3c, rows * 2 * kInter * 2));
    Report("silu_routed", rows, static_cast<double>(rows) * kInter * (4 + 2),
           [&] { return kernels::SiluMulBf16(rows, kInter, x, out, nullptr); });
    BENCH_CUDA(cudaFree(x));
    BENCH_CUDA(cudaFree(out));
  }
  // Permutation and combine: uniform random routing, K distinct experts per token.
  {
    std::vector<int32_t> ids, slot_of_expert(kExperts);
    std::vector<float> weights;
    std::vector<int32_t> all(kExperts);
    for (int64_t e = 0; e < kExperts; ++e) slot_of_expert[e] = static_cast<int32_t>(e);
    std::uniform_real_distribution<float> u(0.01f, 1.0f);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t e = 0; e < kExperts; ++e) all[e] = static_cast<int32_t>(e);
      std::vector<int32_t> pick;
      for (int64_t k = 0; k < kTopK; ++k) {
        std::uniform_int_distribution<int64_t> d(k, kExperts - 1);
        std::swap(all[k], all[d(gen)]);
        pick.push_back(all[k]);
      }
      std::sort(pick.begin(), pick.end());
      ids.insert(ids.end(), pick.begin(), pick.end());
      for (int64_t k = 0; k < kTopK; ++k) weights.push_back(u(gen));
    }
    const int32_t align = 128;
    const int64_t bound =
        kernels::MoePermutedRowsBound(static_cast<int32_t>(T), kTopK, kExperts, align);
    int32_t* d_ids = bench::Upload(ids);
    int32_t* d_map = bench::Upload(slot_of_expert);
    float* d_w = bench::Upload(weights);
    float* hidden = DeviceAlloc<float>(T * kHidden * 4);
    BENCH_CUDA(cudaMemset(hidden, 0x3c, T * kHidden * 4));
    int32_t* plan = DeviceAlloc<int32_t>((2 * kExperts + 1) * 4);
    int32_t* choice_row = DeviceAlloc<int32_t>(T * kTopK * 4);
    int32_t* row_token = DeviceAlloc<int32_t>(bound * 4);
    uint16_t* permuted = DeviceAlloc<uint16_t>(bound * kHidden * 2);
    const int64_t ws_bytes =
        kernels::MoePermutePlanWorkspaceBytes(static_cast<int32_t>(T), kTopK, kExperts);
    void* ws = DeviceAlloc<char>(ws_bytes);
    kernels::MoePermuteParams p;
    p.num_tokens = static_cast<int32_t>(T);
    p.top_k = kTopK;
    p.num_experts = kExperts;
    p.num_slots = kExperts;
    p.topk_ids = d_ids;
    p.slot_of_expert = d_map;
    p.hidden_size = kHidden;
    p.hidden = hidden;
    p.slot_counts = plan;
    p.slot_offsets = plan + kExperts;
    p.choice_row = choice_row;
    p.row_token = row_token;
    p.permuted_hidden_bf16 = permuted;
    p.row_align = align;
    Report("permute", T, static_cast<double>(T) * kHidden * (4 + kTopK * 2), [&] {
      kernels::MoePermuteParams q = p;
      q.plan_workspace = kernels::VectorisedMemoryPassesEnabled() ? ws : nullptr;
      return kernels::MoePermuteF32(q, nullptr);
    });
    // The plan alone (no hidden rows: hidden_size 0 skips the gather).
    Report("permute_plan", T, static_cast<double>(T) * kTopK * 4 * 3, [&] {
      kernels::MoePermuteParams q = p;
      q.hidden_size = 0;
      q.plan_workspace = kernels::VectorisedMemoryPassesEnabled() ? ws : nullptr;
      return kernels::MoePermuteF32(q, nullptr);
    });
    kernels::MoeCombineParams c;
    c.num_tokens = static_cast<int32_t>(T);
    c.top_k = kTopK;
    c.hidden_size = kHidden;
    c.choice_row = choice_row;
    c.topk_weights = d_w;
    c.expert_out_bf16 = permuted;  // any bf16 rows of the permuted layout
    c.out = hidden;
    c.accumulate = false;
    Report("combine", T, static_cast<double>(T) * kHidden * (kTopK * 2 + 4),
           [&] { return kernels::MoeCombineF32(c, nullptr); });
    for (void* q :
         {static_cast<void*>(d_ids), static_cast<void*>(d_map), static_cast<void*>(d_w),
          static_cast<void*>(hidden), static_cast<void*>(plan), static_cast<void*>(choice_row),
          static_cast<void*>(row_token), static_cast<void*>(permuted), ws}) {
      BENCH_CUDA(cudaFree(q));
    }
  }
  // The embedding lookup and the residual add + norm.
  {
    float* table = DeviceAlloc<float>(kVocab * kHidden * 4);
    float* x = DeviceAlloc<float>(T * kHidden * 4);
    float* y = DeviceAlloc<float>(T * kHidden * 4);
    float* out = DeviceAlloc<float>(T * kHidden * 4);
    uint16_t* out16 = DeviceAlloc<uint16_t>(T * kHidden * 2);
    float* w = DeviceAlloc<float>(kHidden * 4);
    BENCH_CUDA(cudaMemset(table, 0x3c, kVocab * kHidden * 4));
    BENCH_CUDA(cudaMemset(x, 0x3c, T * kHidden * 4));
    BENCH_CUDA(cudaMemset(y, 0, T * kHidden * 4));
    BENCH_CUDA(cudaMemset(w, 0x3c, kHidden * 4));
    std::vector<int32_t> tok(T);
    std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(kVocab - 1));
    for (int32_t& t : tok) t = pick(gen);
    int32_t* d_tok = bench::Upload(tok);
    Report("gather_rows", T, static_cast<double>(T) * kHidden * 8,
           [&] { return kernels::GatherRowsF32(T, kHidden, table, d_tok, x, nullptr); });
    Report("add_rms_norm", T, static_cast<double>(T) * kHidden * (4 * 4 + 2),
           [&] { return kernels::AddRmsNormF32(T, kHidden, x, y, w, 1e-5f, out, out16, nullptr); });
    for (void* q : {static_cast<void*>(table), static_cast<void*>(x), static_cast<void*>(y),
                    static_cast<void*>(out), static_cast<void*>(out16), static_cast<void*>(w),
                    static_cast<void*>(d_tok)}) {
      BENCH_CUDA(cudaFree(q));
    }
  }
}

}  // namespace
}  // namespace deepinfer

int main() {
  for (int64_t rows : {int64_t{8192}, int64_t{32768}}) deepinfer::Run(rows);
  return 0;
}
