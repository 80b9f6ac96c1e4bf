// CudaBackend's ops on FP8 (e4m3, 128 x 128 block-scaled) matrices: the dense Gemm and the
// routed experts (kernels/gemm/fp8_block_gemm.h).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/activation/elementwise.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/moe/moe_permute.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/op_timer.h"

namespace deepinfer {
namespace {

kernels::Fp8BlockWeight Fp8Weight(const WeightView& w, int64_t ldw) {
  kernels::Fp8BlockWeight f;
  f.data = static_cast<const uint8_t*>(w.data);
  f.ldw = ldw;
  f.scales = w.fp8.scales;
  f.scale_ld = w.fp8.scale_ld;
  f.split_rows = w.fp8.split_rows;
  return f;
}

}  // namespace

std::unique_ptr<DeviceBuffer> CudaBackend::DequantizeToBf16(const WeightView& w, int64_t ldw,
                                                            int64_t n, int64_t k) {
  auto w16 = AllocateScratch(std::max<int64_t>(1, n * k) * sizeof(uint16_t));
  Check(kernels::Fp8DequantToBf16(Fp8Weight(w, ldw), n, k, w16->as<uint16_t>(), stream_),
        "kernels::Fp8DequantToBf16");
  return w16;
}

void CudaBackend::GemmFp8(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda,
                          WeightView w, int64_t ldw, float* c, int64_t ldc, bool accumulate) {
  const bool a_bf16 = a.dtype == WeightDType::kBFloat16;
  if (m <= kFp8SmallMGemmMaxRows) {
    PhaseTimer phase(this, "Gemm/fp8-small-m", true);
    kernels::Fp8SmallMGemmParams p;
    p.m = m, p.n = n, p.k = k, p.a = a.data, p.a_bf16 = a_bf16, p.lda = lda;
    p.w = Fp8Weight(w, ldw);
    p.c = c, p.ldc = ldc, p.accumulate = accumulate;
    if (!kernels::Fp8SmallMGemmSupports(p)) {
      Record(absl::InvalidArgumentError(absl::StrCat(
          "CudaBackend::Gemm: FP8 weight operands not taken (m ", m, " n ", n, " k ", k, " lda ",
          lda, " ldw ", ldw, " ldc ", ldc, " scale_ld ", w.fp8.scale_ld, ")")));
      return;
    }
    Check(kernels::Fp8SmallMGemm(p, stream_), "kernels::Fp8SmallMGemm");
    return;
  }
  // Larger batches (prefill): the weight dequantised to bf16 (the values `--dtype bfloat16`
  // uploads) in scratch, then the bf16 tensor-core path.
  PhaseTimer phase(this, "Gemm/fp8-dequant-bf16", true);
  auto w16 = DequantizeToBf16(w, ldw, n, k);
  const WeightView wb(w16->data(), WeightDType::kBFloat16);
  if (a_bf16) {
    GemmOnCublas(m, n, k, a.data, lda, wb, k, c, ldc, accumulate);
    return;
  }
  auto a16 = RoundToBf16(static_cast<const float*>(a.data), (m - 1) * lda + k);
  GemmOnCublas(m, n, k, a16->data(), lda, wb, k, c, ldc, accumulate);
}

void CudaBackend::ExpertGemmsFp8OnDevice(const RoutedExpertsArgs& a, const int32_t* offsets,
                                         int64_t rows, const float* permuted, float* expert_out) {
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  kernels::Fp8GroupedGemmParams g;
  g.num_groups = a.num_experts;
  g.max_rows = static_cast<int32_t>(rows);
  g.offsets = offsets;
  g.n = 2 * I;
  g.k = H;
  g.a = permuted;
  g.weights = reinterpret_cast<const uint8_t* const*>(a.gate_up);
  g.scales = a.gate_up_scales;
  g.split_rows = I;
  auto gate_up = AllocateScratch(rows * 2 * I * sizeof(float));
  g.c = gate_up->as<float>();
  Check(kernels::Fp8GroupedGemm(g, stream_), "kernels::Fp8GroupedGemm(gate_up)");
  auto act = AllocateScratch(rows * I * sizeof(float));
  Check(kernels::SiluMulF32(T * K, I, gate_up->as<float>(), act->as<float>(), stream_),
        "kernels::SiluMulF32");
  g.n = H;
  g.k = I;
  g.a = act->as<float>();
  g.weights = reinterpret_cast<const uint8_t* const*>(a.down);
  g.scales = a.down_scales;
  g.split_rows = 0;
  g.c = expert_out;
  Check(kernels::Fp8GroupedGemm(g, stream_), "kernels::Fp8GroupedGemm(down)");
}

void CudaBackend::ExpertGemmsFp8PerExpert(const RoutedExpertsArgs& a, const int32_t* offsets,
                                          int64_t rows, const float* permuted, float* expert_out) {
  const int64_t H = a.hidden_size, I = a.inter;
  const int32_t E = a.num_experts;
  std::vector<int32_t> host_offsets(E + 1);
  CopyToHost(offsets, (E + 1) * sizeof(int32_t), host_offsets.data());
  std::vector<const float*> gu_scales(E), dn_scales(E);
  CopyToHost(a.gate_up_scales, E * sizeof(float*), gu_scales.data());
  CopyToHost(a.down_scales, E * sizeof(float*), dn_scales.data());
  auto gate_up = AllocateScratch(rows * 2 * I * sizeof(float));
  auto act = AllocateScratch(rows * I * sizeof(float));
  for (int32_t e = 0; e < E; ++e) {
    const int64_t r0 = host_offsets[e], m = host_offsets[e + 1] - host_offsets[e];
    if (m <= 0) continue;
    const WeightView gu(a.gate_up_host[e],
                        Fp8BlockScales{gu_scales[e], kernels::Fp8ScaleCols(H), I});
    const WeightView dn(a.down_host[e], Fp8BlockScales{dn_scales[e], kernels::Fp8ScaleCols(I), 0});
    GemmFp8(m, 2 * I, H, permuted + r0 * H, H, gu, H, gate_up->as<float>() + r0 * 2 * I, 2 * I,
            false);
    Check(kernels::SiluMulF32(m, I, gate_up->as<float>() + r0 * 2 * I, act->as<float>() + r0 * I,
                              stream_),
          "kernels::SiluMulF32");
    GemmFp8(m, H, I, act->as<float>() + r0 * I, I, dn, I, expert_out + r0 * H, H, false);
  }
}

bool CudaBackend::RoutedExpertsFp8(const RoutedExpertsArgs& a) {
  if (a.num_experts < 1 || a.num_experts > kernels::kMaxMoeSlots || a.num_tokens < 0 ||
      a.top_k < 1 || a.hidden_size < 1 || a.hidden_size % 8 != 0 || a.inter < 1 ||
      a.inter % 8 != 0 || a.gate_up_scales == nullptr || a.down_scales == nullptr ||
      a.swiglu_limit > 0.0f) {  // V4's clamp: its experts are never kept FP8
    return false;
  }
  // Prefill sizes outside graph capture: per-expert GEMMs from the group sizes on the host.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  Check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
  const bool per_expert = a.num_tokens > kMaxFusedMoeTokens &&
                          capture == cudaStreamCaptureStatusNone && a.gate_up_host != nullptr &&
                          a.down_host != nullptr;
  OpTimer timer(this, per_expert ? "RoutedExpertsFp8PerExpert" : "RoutedExpertsFp8");
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  const int32_t E = a.num_experts;
  const int64_t rows = std::max<int64_t>(
      1, kernels::MoePermutedRowsBound(static_cast<int32_t>(T), static_cast<int32_t>(K), E, 1));
  if (!FitsInt(rows * std::max(H, 2 * I))) {
    Record(
        absl::InvalidArgumentError(absl::StrCat("CudaBackend::RoutedExperts: ", T, " tokens x top-",
                                                K, " is beyond int range for the expert GEMMs")));
    return true;
  }
  // The permutation of RoutedExperts (fp32 rows grouped by expert on the device), the expert
  // GEMMs, the combine.
  auto plan = Allocate((2 * E + 1) * sizeof(int32_t));
  auto choice_row = AllocateScratch(std::max<int64_t>(1, T * K) * sizeof(int32_t));
  auto row_token = AllocateScratch(rows * sizeof(int32_t));
  auto permuted = AllocateScratch(rows * H * sizeof(float));
  kernels::MoePermuteParams p;
  p.num_tokens = static_cast<int32_t>(T);
  p.top_k = static_cast<int32_t>(K);
  p.num_experts = E;
  p.num_slots = E;
  p.topk_ids = a.topk_ids;
  p.slot_of_expert = a.slot_of_expert;
  p.hidden_size = H;
  p.hidden = a.hidden;
  p.slot_counts = plan->as<int32_t>();
  p.slot_offsets = plan->as<int32_t>() + E;
  p.choice_row = choice_row->as<int32_t>();
  p.row_token = row_token->as<int32_t>();
  p.permuted_hidden = permuted->as<float>();
  p.row_align = 1;
  const int64_t plan_workspace_bytes =
      kernels::MoePermutePlanWorkspaceBytes(static_cast<int32_t>(T), static_cast<int32_t>(K), E);
  std::unique_ptr<DeviceBuffer> plan_workspace;
  if (plan_workspace_bytes > 0) {
    plan_workspace = AllocateScratch(plan_workspace_bytes);
    p.plan_workspace = plan_workspace->data();
  }
  Check(kernels::MoePermuteF32(p, stream_), "kernels::MoePermuteF32");

  auto expert_out = AllocateScratch(rows * H * sizeof(float));
  if (per_expert) {
    ExpertGemmsFp8PerExpert(a, plan->as<int32_t>() + E, rows, permuted->as<float>(),
                            expert_out->as<float>());
  } else {
    ExpertGemmsFp8OnDevice(a, plan->as<int32_t>() + E, rows, permuted->as<float>(),
                           expert_out->as<float>());
  }

  kernels::MoeCombineParams c;
  c.num_tokens = static_cast<int32_t>(T);
  c.top_k = static_cast<int32_t>(K);
  c.hidden_size = H;
  c.choice_row = choice_row->as<int32_t>();
  c.topk_weights = a.topk_weights;
  c.expert_out = expert_out->as<float>();
  c.accumulate = false;
  c.out = a.out;
  Check(kernels::MoeCombineF32(c, stream_), "kernels::MoeCombineF32");
  return true;
}

}  // namespace deepinfer
