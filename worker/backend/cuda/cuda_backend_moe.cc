// CudaBackend's MoE ops: routing (the one-launch router, the noaux_tc route, expert counts), the
// routed experts (device path without host synchronisation for decode, chunked cuBLAS for larger
// batches), the fused MoE block at 1-2 tokens and the dense MLP through it.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/activation/elementwise.h"
#include "kernels/gemm/bf16_mma_gemm.h"
#include "kernels/moe/expert_activation.h"
#include "kernels/moe/expert_counts.h"
#include "kernels/moe/expert_gemm_cublas.h"
#include "kernels/moe/expert_gemm_plan.h"
#include "kernels/moe/expert_gemm_planned.h"
#include "kernels/moe/grouped_gemm.h"
#include "kernels/moe/moe_decode_fused.h"
#include "kernels/moe/moe_permute.h"
#include "kernels/moe/noaux_tc_router.h"
#include "kernels/moe/noaux_tc_router_fused.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/v4/swiglu_clamped.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/op_timer.h"

namespace deepinfer {
namespace {

// The routing fields NoauxTcRouteParams and RouteTokensParams share, from the backend's args
// (router_logits aside: RouteTokens makes its own).
template <typename Params>
void SetRouting(const NoauxTcRouteArgs& a, Params* p) {
  p->num_tokens = a.num_tokens;
  p->num_experts = a.num_experts;
  p->correction_bias = a.correction_bias;
  p->num_groups = a.num_groups;
  p->topk_groups = a.topk_groups;
  p->top_k = a.top_k;
  p->normalize = a.normalize;
  p->scaling_factor = a.scaling_factor;
  p->topk_ids = a.topk_ids;
  p->topk_weights = a.topk_weights;
}

// Rows per chunk of the kChunked expert GEMMs for `avg_rows` rows per expert on average: the
// padding (half a chunk per busy expert on average) against cuBLAS's tile efficiency. Measured
// on the H200 at the Moonlight shape (moe_prefill_bench, docs/kernels/moe-prefill.md): 64 was
// fastest up to 48 rows per expert, 128 from 96 rows on (256 never clearly better).
int32_t ChunkRowsFor(int64_t avg_rows) { return avg_rows < 96 ? 64 : 128; }

const char* ExpertGemmAlgoName(kernels::ExpertGemmCublasAlgo algo) {
  return algo == kernels::ExpertGemmCublasAlgo::kChunked ? "chunked" : "per expert";
}

}  // namespace

void CudaBackend::NoauxTcRoute(const NoauxTcRouteArgs& a) {
  OpTimer timer(this, "NoauxTcRoute");
  kernels::NoauxTcRouteParams p;
  SetRouting(a, &p);
  p.router_logits = a.router_logits;
  Check(kernels::NoauxTcRouteF32(p, stream_), "kernels::NoauxTcRouteF32");
}

void CudaBackend::RouteTokens(const RouteTokensArgs& a) {
  const NoauxTcRouteArgs& r = a.route;
  // The batch-invariant mode takes the one-launch router at every token count, in calls of at
  // most kernels::kMaxFusedRouterTokens tokens: each logit's sum order is the same for every tile
  // and token count, and the routing is per token.
  const int64_t max_call =
      tuning_.batch_invariant ? kernels::kMaxFusedRouterTokens : kFusedRouterMaxTokens;
  if (r.num_tokens <= 0 || (!tuning_.batch_invariant && r.num_tokens > max_call) ||
      r.num_experts <= 0 || r.num_experts > kernels::kMaxFusedRouterExperts) {
    Backend::RouteTokens(a);
    return;
  }
  const int64_t T = r.num_tokens, H = a.hidden_size, K = r.top_k;
  const int64_t call_tokens = std::min(T, max_call);
  // Several calls count the experts afterwards, in one AccumulateExpertCounts (count_limit is
  // over the whole batch's choices).
  const bool count_in_call = T <= max_call;
  kernels::RouteTokensParams p;
  SetRouting(r, &p);
  p.num_tokens = static_cast<int32_t>(call_tokens);
  p.hidden_size = FitsInt(H) ? static_cast<int32_t>(H) : -1;
  p.hidden = a.norm.weight != nullptr ? a.norm.out : a.hidden;
  p.router_weight = a.router_weight;
  p.tile_counters = route_tile_counters_;
  p.expert_counts = count_in_call ? a.expert_counts : nullptr;
  p.count_limit = count_in_call ? a.count_limit : nullptr;
  auto logits = AllocateScratch(static_cast<size_t>(call_tokens) * r.num_experts * sizeof(float));
  p.router_logits = logits->as<float>();
  if (!kernels::RouteTokensSupported(p)) {
    Backend::RouteTokens(a);
    return;
  }
  if (a.norm.weight != nullptr) {
    AddRmsNorm(T, H, a.norm.x, a.norm.y, a.norm.weight, a.norm.eps, a.norm.out, a.norm.out_bf16);
  }
  OpTimer timer(this, "RouteTokens");
  const float* hidden = p.hidden;
  for (int64_t first = 0; first < T; first += call_tokens) {
    kernels::RouteTokensParams c = p;
    c.num_tokens = static_cast<int32_t>(std::min(call_tokens, T - first));
    c.hidden = hidden + first * H;
    c.topk_ids = r.topk_ids + first * K;
    c.topk_weights = r.topk_weights + first * K;
    Check(kernels::RouteTokensF32(c, stream_), "kernels::RouteTokensF32");
  }
  if (!count_in_call && a.expert_counts != nullptr) {
    Check(kernels::AccumulateExpertCounts(T * K, r.topk_ids, r.num_experts, a.count_limit,
                                          a.expert_counts, stream_),
          "kernels::AccumulateExpertCounts");
  }
}

void CudaBackend::AccumulateExpertCounts(int64_t n, const int32_t* ids, int64_t num_experts,
                                         const int32_t* count_limit, int64_t* counts) {
  OpTimer timer(this, "AccumulateExpertCounts");
  Check(kernels::AccumulateExpertCounts(n, ids, num_experts, count_limit, counts, stream_),
        "kernels::AccumulateExpertCounts");
}

CudaBackend::MoePermutation CudaBackend::PermuteRoutedRows(const RoutedExpertsArgs& a, int64_t rows,
                                                           int32_t row_align, bool bf16,
                                                           bool gather, int32_t shared_slots) {
  const int64_t T = a.num_tokens, K = a.top_k + shared_slots, H = a.hidden_size;
  const int32_t E = a.num_experts + shared_slots;
  MoePermutation m;
  // Counts then offsets in one buffer, so the host paths copy both back at once.
  m.plan = Allocate((2 * E + 1) * sizeof(int32_t));
  m.choice_row = AllocateScratch(std::max<int64_t>(1, T * K) * sizeof(int32_t));
  m.row_token = AllocateScratch(rows * sizeof(int32_t));
  if (gather) m.permuted = AllocateScratch(rows * H * (bf16 ? sizeof(uint16_t) : sizeof(float)));
  kernels::MoePermuteParams p;
  p.num_tokens = static_cast<int32_t>(T);
  p.top_k = static_cast<int32_t>(K);
  p.num_experts = a.num_experts;
  p.num_slots = E;
  p.shared_slots = shared_slots;
  p.topk_ids = a.topk_ids;
  p.slot_of_expert = a.slot_of_expert;
  p.hidden_size = gather ? H : 0;  // 0: the plan only
  p.hidden = a.hidden;
  p.slot_counts = m.plan->as<int32_t>();
  p.slot_offsets = m.plan->as<int32_t>() + E;
  p.choice_row = m.choice_row->as<int32_t>();
  p.row_token = m.row_token->as<int32_t>();
  if (gather && bf16) {
    p.permuted_hidden_bf16 = m.permuted->as<uint16_t>();
  } else if (gather) {
    p.permuted_hidden = m.permuted->as<float>();
  }
  p.row_align = row_align;
  // Prefill sizes plan with many blocks (kernels::MoePermutePlanWorkspaceBytes: 0 at decode).
  const int64_t plan_workspace_bytes =
      kernels::MoePermutePlanWorkspaceBytes(static_cast<int32_t>(T), static_cast<int32_t>(K), E);
  if (plan_workspace_bytes > 0) {
    m.plan_workspace = AllocateScratch(plan_workspace_bytes);
    p.plan_workspace = m.plan_workspace->data();
  }
  Check(kernels::MoePermuteF32(p, stream_), "kernels::MoePermuteF32");
  return m;
}

void CudaBackend::CombineExpertRows(const RoutedExpertsArgs& a, const MoePermutation& perm,
                                    const DeviceBuffer& expert_out, bool bf16,
                                    int32_t shared_slots) {
  kernels::MoeCombineParams c;
  c.num_tokens = static_cast<int32_t>(a.num_tokens);
  c.top_k = static_cast<int32_t>(a.top_k) + shared_slots;
  c.shared_slots = shared_slots;
  c.hidden_size = a.hidden_size;
  c.choice_row = perm.choice_row->as<int32_t>();
  c.topk_weights = a.topk_weights;
  if (bf16) {
    c.expert_out_bf16 = expert_out.as<uint16_t>();
  } else {
    c.expert_out = expert_out.as<float>();
  }
  c.accumulate = false;  // MoeCombineParams' default adds into out
  c.out = a.out;
  Check(kernels::MoeCombineF32(c, stream_), "kernels::MoeCombineF32");
}

bool CudaBackend::RoutedExperts(const RoutedExpertsArgs& a) {
  if (a.fp8()) return RoutedExpertsFp8(a);
  // Batch-invariant: bf16 experts on the device path only (fp32 experts: the caller's per-expert
  // GroupedGemm, whose GEMMs are batch-invariant then).
  if (tuning_.batch_invariant && a.dtype != WeightDType::kBFloat16) return false;
  // Decode and small prefills: everything stays on the device (no host synchronisation, so the
  // step can be captured in a CUDA graph). Larger batches: cuBLAS tensor-core GEMMs per expert,
  // fed with the group sizes through one small device-to-host copy.
  // While the stream is being captured into a CUDA graph, the host copy of the cuBLAS path
  // would fail the capture: take the device path then, at any size (correct, only slower).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  Check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
  // MXFP4 experts on the cuBLAS path go on below as bf16 experts (widened a group at a time).
  if (a.mxfp4() && !Mxfp4ExpertsOnCublas(a, capture != cudaStreamCaptureStatusNone)) {
    return RoutedExpertsMxfp4(a);
  }
  if (a.num_experts < 1 || a.num_experts > kernels::kMaxMoeSlots || a.hidden_size % 8 != 0 ||
      a.inter % 8 != 0 || a.num_tokens < 0 || a.top_k < 1) {
    return false;
  }
  // bf16 GEMM operands: bf16 experts, or MXFP4 experts widened to bf16.
  const bool bf16_gemms = a.dtype == WeightDType::kBFloat16 || a.mxfp4();
  const bool device_grouped =
      a.dtype == WeightDType::kBFloat16 &&
      (a.num_tokens <= kMaxFusedMoeTokens || capture != cudaStreamCaptureStatusNone ||
       a.keep_on_device || tuning_.batch_invariant);
  const DecodeMoeAlgo decode_algo =
      tuning_.batch_invariant ? DecodeMoeAlgo::kGroupedF32 : DecodeMoeAlgoFor(a.num_tokens);
  OpTimer timer(this, device_grouped ? "RoutedExperts" : "RoutedExpertsCublas");
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  const int32_t E = a.num_experts;
  const bool chunked =
      !device_grouped && expert_gemm_algo_ == kernels::ExpertGemmCublasAlgo::kChunked;
  const bool planned = device_grouped && decode_algo == DecodeMoeAlgo::kPlannedCublas;
  const int32_t row_align = chunked ? ChunkRowsFor(T * K / E) : planned ? PlannedChunkRows(T) : 1;
  const int64_t rows =
      std::max<int64_t>(1, kernels::MoePermutedRowsBound(static_cast<int32_t>(T),
                                                         static_cast<int32_t>(K), E, row_align));
  if (!FitsInt(rows * std::max(H, 2 * I))) {
    Record(
        absl::InvalidArgumentError(absl::StrCat("CudaBackend::RoutedExperts: ", T, " tokens x top-",
                                                K, " is beyond int range for the expert GEMMs")));
    return true;
  }
  // bf16 weights gather the rows straight into bf16 (the GEMM operand), except for the device
  // path's fp32-activation kernel; the batch-invariant mode's kernel takes them in bf16.
  const bool gather_bf16 =
      bf16_gemms &&
      (!(device_grouped && decode_algo == DecodeMoeAlgo::kGroupedF32) || tuning_.batch_invariant);
  MoePermutation perm;
  {
    PhaseTimer phase(this, "RoutedExpertsCublas/permute", !device_grouped);
    perm = PermuteRoutedRows(a, rows, row_align, gather_bf16, /*gather=*/true);
  }

  // The cuBLAS path with bf16 weights: gate_up and down write bf16 (as a bf16 PyTorch model
  // rounds each Linear's output), halving the GEMMs' output bytes and the SiLU-mul and combine
  // passes over them. The device path's GEMMs write fp32.
  const bool expert_out_bf16 = gather_bf16 && !device_grouped;
  auto expert_out =
      AllocateScratch(rows * H * (expert_out_bf16 ? sizeof(uint16_t) : sizeof(float)));
  if (device_grouped) {
    ExpertGemmsOnDevice(a, decode_algo, perm.plan->as<int32_t>(), perm.choice_row->as<int32_t>(),
                        rows, perm.permuted->data(), expert_out->as<float>());
  } else if (!ExpertGemmsOnCublas(a, perm.plan->as<int32_t>(), row_align, rows,
                                  perm.permuted->data(), expert_out->data())) {
    return true;  // the error is recorded; the output is meaningless, as after any failed op
  }

  PhaseTimer phase(this, "RoutedExpertsCublas/combine", !device_grouped);
  CombineExpertRows(a, perm, *expert_out, expert_out_bf16);
  return true;
}

bool CudaBackend::DecodeMoeFusedFor(int64_t tokens, int64_t hidden_size) {
  // moe_block_decode_bench (4 layers in a CUDA graph, H200, docs/kernels/moe-decode.md), µs a
  // layer, the ops -> the fused kernels (at 2 tokens with the grid-strided down): Moonlight 1 token
  // 63.6 -> 39.9, 2 tokens 77.6 -> 68.5; V3 1 token 220.7 -> 200.2, 2 tokens 351.8 -> 350.6 (no
  // faster: not taken).
  return tokens == 1 || (tokens == 2 && hidden_size <= kMaxFusedMoeHidden);
}

bool CudaBackend::RoutedAndSharedExperts(const RoutedExpertsArgs& a) {
  if (a.fp8()) return RoutedAndSharedExpertsFp8(a);
  if (tuning_.batch_invariant || !DecodeMoeFusedFor(a.num_tokens, a.hidden_size) ||
      a.dtype != WeightDType::kBFloat16 ||
      DecodeMoeAlgoFor(a.num_tokens) != DecodeMoeAlgo::kGroupedF32 || a.top_k < 1 ||
      a.num_experts < 1 || a.inter <= 0 || a.inter % 8 != 0 || a.hidden_size % 8 != 0 ||
      !FitsInt(a.hidden_size) || !FitsInt(a.inter) || a.shared_inter <= 0 ||
      a.shared_inter % a.inter != 0 || a.shared_gate_up == nullptr || a.shared_down == nullptr ||
      a.top_k + a.shared_inter / a.inter > kernels::kMoeDecodeFusedMaxParts ||
      reinterpret_cast<uintptr_t>(a.hidden) % 16 != 0) {
    return false;
  }
  OpTimer timer(this, "RoutedAndSharedExperts");
  kernels::MoeDecodeFusedParams p;
  SetFusedDecodeRouting(a, &p);
  p.gate_up = reinterpret_cast<const uint16_t* const*>(a.gate_up);
  p.down = reinterpret_cast<const uint16_t* const*>(a.down);
  p.shared_gate_up = static_cast<const uint16_t*>(a.shared_gate_up);
  p.shared_down = static_cast<const uint16_t*>(a.shared_down);
  p.swiglu_limit = a.swiglu_limit;
  LaunchMoeDecodeFused(p);
  return true;
}

void CudaBackend::LaunchMoeDecodeFused(kernels::MoeDecodeFusedParams p) {
  const size_t act_bytes =
      kernels::MoeDecodeFusedActFloats(p.num_tokens, p.top_k, p.shared_parts, p.inter) *
      sizeof(float);
  auto act = AllocateScratch(act_bytes);
  p.act = act->as<float>();
  Check(kernels::MoeDecodeFusedF32(p, stream_), "kernels::MoeDecodeFusedF32");
}

bool CudaBackend::NormedDenseMlp(const DenseMlpArgs& a) {
  if (a.gate_up.dtype == WeightDType::kFp8E4M3) return NormedDenseMlpFp8(a);
  if (tuning_.batch_invariant || a.rows != 1 || a.gate_up.dtype != WeightDType::kBFloat16 ||
      a.down.dtype != WeightDType::kBFloat16 || a.hidden_size <= 0 || a.hidden_size % 8 != 0 ||
      a.inter <= 0 || a.inter % 8 != 0 || !FitsInt(a.hidden_size) || !FitsInt(a.inter) ||
      a.x == nullptr || a.norm_weight == nullptr || a.normed == nullptr || a.out == nullptr ||
      a.gate_up.data == nullptr || a.down.data == nullptr ||
      reinterpret_cast<uintptr_t>(a.normed) % 16 != 0) {
    return false;
  }
  OpTimer timer(this, "NormedDenseMlp");
  Check(kernels::AddRmsNormF32(a.rows, a.hidden_size, a.x, a.y, a.norm_weight, a.eps, a.normed,
                               nullptr, stream_),
        "kernels::AddRmsNormF32");
  // The MLP is the fused MoE block's shared MLP alone (top_k 0), as one part: a part split
  // changes neither the work nor the order of the sums.
  kernels::MoeDecodeFusedParams p;
  p.num_tokens = 1;
  p.top_k = 0;
  p.hidden_size = static_cast<int32_t>(a.hidden_size);
  p.inter = static_cast<int32_t>(a.inter);
  p.hidden = a.normed;
  p.shared_parts = 1;
  p.shared_gate_up = static_cast<const uint16_t*>(a.gate_up.data);
  p.shared_down = static_cast<const uint16_t*>(a.down.data);
  p.out = a.out;
  LaunchMoeDecodeFused(p);
  return true;
}

void CudaBackend::SiluMulF32Rows(int64_t rows, int64_t inter, const float* x, float limit,
                                 float* out) {
  if (limit > 0.0f) {
    Check(kernels::SwiGluClampedF32(rows, inter, x, limit, out, stream_),
          "kernels::SwiGluClampedF32");
  } else {
    Check(kernels::SiluMulF32(rows, inter, x, out, stream_), "kernels::SiluMulF32");
  }
}

CudaBackend::DecodeMoeAlgo CudaBackend::DecodeMoeAlgoFor(int64_t tokens) {
  // Fastest per size (grouped_gemm_bench at 1 and 8 tokens; moe_decode_bench, a whole layer in
  // a CUDA graph, at 64-256 tokens, where the planned chunks beat the streaming kernel by 8 %
  // (Moonlight) and 2 % (V3) at 64 tokens; the thresholds between the sizes are not measured):
  // the CUDA-core kernel for 1-2 rows per expert, the planned cuBLAS chunks above.
  if (tokens <= 2) return DecodeMoeAlgo::kGroupedF32;
  return DecodeMoeAlgo::kPlannedCublas;
}

int32_t CudaBackend::PlannedChunkRows(int64_t tokens) { return tokens <= 32 ? 8 : 48; }

void CudaBackend::ExpertGemmsOnDevice(const RoutedExpertsArgs& a, DecodeMoeAlgo algo,
                                      const int32_t* plan, const int32_t* choice_row, int64_t rows,
                                      const void* permuted, float* expert_out) {
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  const int32_t E = a.num_experts;
  const int32_t* offsets = plan + E;
  // The planned cuBLAS GEMMs write gate_up in bf16 (as the prefill path), the kernels fp32.
  const bool gate_up_bf16 = algo == DecodeMoeAlgo::kPlannedCublas;
  auto gate_up = AllocateScratch(rows * 2 * I * (gate_up_bf16 ? sizeof(uint16_t) : sizeof(float)));
  if (tuning_.batch_invariant) {
    // kernels::Bf16MmaGroupedGemm at every size with a fixed k split (each row's sums depend on
    // neither the row count nor the row's place), the rows gathered in bf16 and the SiLU-mul
    // product rounded to bf16 (as the default mode's cuBLAS expert GEMMs take their rows).
    kernels::Bf16MmaGroupedGemmParams g;
    g.num_groups = E;
    g.max_rows = static_cast<int32_t>(T * K);
    g.offsets = offsets;
    g.n = 2 * I;
    g.k = H;
    g.a = static_cast<const uint16_t*>(permuted);
    g.weights = reinterpret_cast<const uint16_t* const*>(a.gate_up);
    g.c = gate_up->as<float>();
    // Only the rows of a pass follow it: twice the average rows of an expert, at most T (a
    // token's top-k experts are distinct), so that most busy experts take one pass over their
    // weights, each of the fewest 8-row tiles that hold its rows (kBf16BatchInvariantTile). A
    // guess; grouped_gemm_bench times the alternatives.
    g.rows_per_group_hint =
        static_cast<int32_t>(std::min<int64_t>(T, 2 * std::max<int64_t>(1, (T * K + E - 1) / E)));
    g.tile = kernels::kBf16BatchInvariantTile;
    // Large groups (prefill): the all-rows loop, each weight loaded once for up to 128 rows
    // instead of 32 (the same sums); from a hint above 64 (above 32 rows an expert on average),
    // a guess like the hint.
    g.tile.all_rows = g.rows_per_group_hint > 64;
    g.k_split = kBatchInvariantBf16KSplit;
    Check(kernels::Bf16MmaGroupedGemm(g, stream_), "kernels::Bf16MmaGroupedGemm(gate_up)");
    auto act = AllocateScratch(rows * I * sizeof(uint16_t));
    if (a.swiglu_limit > 0.0f) {
      auto act_f32 = AllocateScratch(rows * I * sizeof(float));
      SiluMulF32Rows(T * K, I, gate_up->as<float>(), a.swiglu_limit, act_f32->as<float>());
      Check(kernels::RoundF32ToBf16(T * K * I, act_f32->as<float>(), act->as<uint16_t>(), stream_),
            "kernels::RoundF32ToBf16");
    } else {
      Check(kernels::SiluMulF32ToBf16(T * K, I, gate_up->as<float>(), act->as<uint16_t>(), stream_),
            "kernels::SiluMulF32ToBf16");
    }
    g.n = H;
    g.k = I;
    g.a = act->as<uint16_t>();
    g.weights = reinterpret_cast<const uint16_t* const*>(a.down);
    g.c = expert_out;
    Check(kernels::Bf16MmaGroupedGemm(g, stream_), "kernels::Bf16MmaGroupedGemm(down)");
    return;
  }
  if (algo == DecodeMoeAlgo::kGroupedF32) {
    kernels::GroupedGemmBf16Params g;
    g.num_slots = E;
    g.max_rows = static_cast<int32_t>(T * K);
    g.slot_offsets = offsets;
    g.rows_per_slot_hint = static_cast<int32_t>(T);  // a token's top-k experts are distinct
    g.n = static_cast<int32_t>(2 * I);
    g.k = static_cast<int32_t>(H);
    g.weights = reinterpret_cast<const uint16_t* const*>(a.gate_up);
    g.x = static_cast<const float*>(permuted);
    g.y = gate_up->as<float>();
    Check(kernels::GroupedGemmBf16(g, stream_), "kernels::GroupedGemmBf16(gate_up)");
    auto act = AllocateScratch(rows * I * sizeof(float));
    SiluMulF32Rows(T * K, I, gate_up->as<float>(), a.swiglu_limit, act->as<float>());
    g.n = static_cast<int32_t>(H);
    g.k = static_cast<int32_t>(I);
    g.weights = reinterpret_cast<const uint16_t* const*>(a.down);
    g.x = act->as<float>();
    g.y = expert_out;
    Check(kernels::GroupedGemmBf16(g, stream_), "kernels::GroupedGemmBf16(down)");
    return;
  }
  auto act = AllocateScratch(rows * I * sizeof(uint16_t));
  // kPlannedCublas: the pointer arrays of both GEMMs from the device counts, then one batched
  // call each over a fixed number of chunks (the dummies, spread between the real chunks and
  // reading their weights, compute garbage into dummy_y).
  const int32_t C = PlannedChunkRows(T);
  const int32_t batch = kernels::ExpertGemmBatchBound(T * K, E, C);
  auto pointers = AllocateScratch(2 * 3 * static_cast<size_t>(batch) * sizeof(void*));
  auto dummy_x = AllocateScratch(C * std::max(H, I) * sizeof(uint16_t));
  auto dummy_y = AllocateScratch(C * std::max(2 * I, H) * sizeof(float));
  kernels::ExpertGemmPlanParams p;
  p.num_slots = E;
  p.slot_counts = plan;
  p.slot_offsets = offsets;
  p.chunk_rows = C;
  p.batch = batch;
  p.num_gemms = 2;
  void** ptrs = static_cast<void**>(pointers->data());
  // gate_up: permuted [rows, H] bf16 -> gate_up [rows, 2I] bf16; down: act [rows, I] bf16 ->
  // expert_out [rows, H] fp32.
  const struct {
    const void* const* weights;
    const void* x;
    int64_t x_row_bytes;
    void* y;
    int64_t y_row_bytes;
  } gemms[2] = {{a.gate_up, permuted, H * 2, gate_up->data(), 2 * I * 2},
                {a.down, act->data(), I * 2, expert_out, H * 4}};
  for (int i = 0; i < 2; ++i) {
    kernels::ExpertGemmPlanGemm& g = p.gemm[i];
    g.weights = gemms[i].weights;
    g.x = gemms[i].x;
    g.x_row_bytes = gemms[i].x_row_bytes;
    g.y = gemms[i].y;
    g.y_row_bytes = gemms[i].y_row_bytes;
    g.dummy_x = dummy_x->data();
    g.dummy_y = dummy_y->data();
    g.pointers = ptrs + 3 * batch * i;
  }
  Check(kernels::PlanExpertGemmBatches(p, stream_), "kernels::PlanExpertGemmBatches");
  CheckBlas(kernels::PlannedExpertGemmsBf16(cublas_, ptrs, batch, static_cast<int32_t>(2 * I),
                                            static_cast<int32_t>(H), C, /*out_bf16=*/true),
            "PlannedExpertGemmsBf16(gate_up)");
  // The real rows only (choice_row: T * K entries, each real row once): the chunks' padding
  // rows (most of the rows in use: about 12 real rows per 32-row chunk at Moonlight's 128
  // tokens) keep garbage that the down GEMM turns into output rows nobody reads.
  Check(kernels::SiluMulBf16ListedRows(T * K, choice_row, I, gate_up->as<uint16_t>(),
                                       act->as<uint16_t>(), stream_, a.swiglu_limit),
        "kernels::SiluMulBf16ListedRows");
  CheckBlas(kernels::PlannedExpertGemmsBf16(cublas_, ptrs + 3 * batch, batch,
                                            static_cast<int32_t>(H), static_cast<int32_t>(I), C,
                                            /*out_bf16=*/false),
            "PlannedExpertGemmsBf16(down)");
}

bool CudaBackend::ExpertGemmsOnCublas(const RoutedExpertsArgs& a, const int32_t* plan,
                                      int32_t chunk_rows, int64_t rows, const void* permuted,
                                      void* expert_out) {
  const int64_t E = a.num_experts, I = a.inter;
  // The one host synchronisation of this path: cuBLAS takes the group sizes on the host.
  std::vector<int32_t> host_plan(2 * E + 1);  // counts [E] | offsets [E + 1]
  {
    PhaseTimer phase(this, "RoutedExpertsCublas/plan_to_host", true);
    if (!Check(cudaMemcpyAsync(host_plan.data(), plan, host_plan.size() * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync(expert counts)") ||
        !Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize")) {
      return false;
    }
  }
  // bf16 weights (or MXFP4 ones widened to bf16): the activation operands are rounded to bf16
  // (the permutation did it for the hidden rows), as every bf16 GEMM of the backend, and both
  // GEMMs write bf16.
  ExpertGemmsCublasRun run;
  run.host_plan = host_plan.data();
  run.chunk_rows = chunk_rows;
  run.bf16 = a.dtype == WeightDType::kBFloat16 || a.mxfp4();
  const size_t elem = run.bf16 ? sizeof(uint16_t) : sizeof(float);
  run.pointer_count = kernels::ExpertGemmPointerCount(rows, chunk_rows);
  auto pointers = AllocateScratch(run.pointer_count * sizeof(void*));
  auto gate_up_out = AllocateScratch(rows * 2 * I * elem);
  auto act = AllocateScratch(rows * I * elem);
  run.pointers = static_cast<void**>(pointers->data());
  run.permuted = permuted;
  run.gate_up = gate_up_out->data();
  run.act = act->data();
  run.expert_out = expert_out;
  if (a.mxfp4()) return ExpertGemmsMxfp4Widened(a, run);

  std::vector<const void*> gate_up(E), down(E);
  if (a.gate_up_host != nullptr && a.down_host != nullptr) {
    gate_up.assign(a.gate_up_host, a.gate_up_host + E);
    down.assign(a.down_host, a.down_host + E);
  } else if (!Check(cudaMemcpyAsync(gate_up.data(), a.gate_up, E * sizeof(void*),
                                    cudaMemcpyDeviceToHost, stream_),
                    "cudaMemcpyAsync(gate_up table)") ||
             !Check(cudaMemcpyAsync(down.data(), a.down, E * sizeof(void*), cudaMemcpyDeviceToHost,
                                    stream_),
                    "cudaMemcpyAsync(down table)") ||
             !Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize")) {
    return false;
  }
  ExpertMatrices all;
  all.count = static_cast<int32_t>(E);
  all.gate_up = gate_up.data();
  all.down = down.data();
  return ExpertGemmsOnCublasSlice(a, run, all);
}

bool CudaBackend::ExpertGemmsOnCublasSlice(const RoutedExpertsArgs& a,
                                           const ExpertGemmsCublasRun& run,
                                           const ExpertMatrices& m) {
  const int64_t E = a.num_experts, H = a.hidden_size, I = a.inter;
  const size_t elem = run.bf16 ? sizeof(uint16_t) : sizeof(float);
  // The slice's offsets from its first row (kernels::ExpertGemmsCublas starts at 0); its rows
  // are contiguous in every row buffer.
  const int32_t* counts = run.host_plan + m.first;
  const int32_t* offsets = run.host_plan + E + m.first;
  const int64_t first_row = offsets[0];
  std::vector<int32_t> slice_offsets(m.count + 1);
  for (int32_t s = 0; s <= m.count; ++s) slice_offsets[s] = offsets[s] - offsets[0];
  const int64_t slice_rows = slice_offsets[m.count];  // padded (kChunked)
  if (slice_rows == 0) return true;
  // The slice's first row of a row buffer of `width` elements a row.
  auto at = [&](void* base, int64_t width) {
    return static_cast<char*>(base) + first_row * width * static_cast<int64_t>(elem);
  };
  kernels::ExpertGemmCublasParams g;
  g.num_slots = m.count;
  g.host_counts = counts;
  g.host_offsets = slice_offsets.data();
  g.host_weights = m.gate_up;
  g.weight_type = run.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  g.n = static_cast<int32_t>(2 * I);
  g.k = static_cast<int32_t>(H);
  g.x = static_cast<const char*>(run.permuted) + first_row * H * static_cast<int64_t>(elem);
  g.y = at(run.gate_up, 2 * I);
  g.output_type = run.bf16 ? CUDA_R_16BF : CUDA_R_32F;
  g.chunk_rows = run.chunk_rows;
  g.device_pointers = run.pointers;
  g.device_pointers_size = run.pointer_count;
  {
    PhaseTimer phase(this, "RoutedExpertsCublas/gate_up", true);
    if (!ExpertGemms(g, "gate_up")) return false;
  }
  // Padding rows (kChunked) go through SiLU-mul too: meaningless values nobody reads.
  void* act = at(run.act, I);
  {
    PhaseTimer phase(this, "RoutedExpertsCublas/silu_mul", true);
    if (run.bf16) {
      Check(kernels::SiluMulBf16(slice_rows, I, static_cast<const uint16_t*>(g.y),
                                 static_cast<uint16_t*>(act), stream_, nullptr, a.swiglu_limit),
            "kernels::SiluMulBf16");
    } else {
      SiluMulF32Rows(slice_rows, I, static_cast<const float*>(g.y), a.swiglu_limit,
                     static_cast<float*>(act));
    }
  }
  g.host_weights = m.down;
  g.n = static_cast<int32_t>(H);
  g.k = static_cast<int32_t>(I);
  g.x = act;
  g.y = at(run.expert_out, H);
  PhaseTimer phase(this, "RoutedExpertsCublas/down", true);
  return ExpertGemms(g, "down");
}

bool CudaBackend::ExpertGemms(const kernels::ExpertGemmCublasParams& g, const char* which) {
  cublasStatus_t st = kernels::ExpertGemmsCublas(cublas_, g, expert_gemm_algo_);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED &&
      expert_gemm_algo_ != kernels::ExpertGemmCublasAlgo::kPerExpert) {
    // A cuBLAS without this batched / grouped type combination: per expert from now on (it
    // takes any layout, the padded one of kChunked included).
    LOG(WARNING) << "CudaBackend: cuBLAS refused the " << ExpertGemmAlgoName(expert_gemm_algo_)
                 << " expert GEMM; using one cuBLAS GEMM per expert";
    expert_gemm_algo_ = kernels::ExpertGemmCublasAlgo::kPerExpert;
    st = kernels::ExpertGemmsCublas(cublas_, g, expert_gemm_algo_);
  }
  const std::string call = absl::StrCat("kernels::ExpertGemmsCublas(", which, ", ",
                                        ExpertGemmAlgoName(expert_gemm_algo_), ")");
  return CheckBlas(st, call.c_str());
}

}  // namespace deepinfer
