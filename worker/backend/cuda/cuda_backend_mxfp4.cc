// CudaBackend's routed experts kept in MXFP4 (e2m1 with UE8M0 scales per 32 values, DeepSeek-V4's
// layout). Decode sizes (and any size while captured): the permutation to bf16 rows,
// kernels::Mxfp4MmaGroupedGemm for gate_up and down, the combine, the group extents on the
// device; in CudaTuning::mxfp4_w4a8_min_tokens .. mxfp4_w4a8_max_tokens the rows quantised to
// e4m3 instead and both GEMMs on kernels::Mxfp4W4a8GroupedGemm (W4A8), or with
// CudaTuning::mxfp4_wgmma_swap each GEMM whose weights fit on kernels::Mxfp4WgmmaSwapGroupedGemm
// (swap-AB wgmma) on the same e4m3 rows. Prefill sizes:
// RoutedExperts' cuBLAS path, fed with the experts widened to bf16 a group at a time
// (ExpertGemmsMxfp4Widened).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/activation/elementwise.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_quantize.h"
#include "kernels/gemm/mxfp4_dequant.h"
#include "kernels/gemm/mxfp4_mma_gemm.h"
#include "kernels/gemm/mxfp4_w4a8_gemm.h"
#include "kernels/gemm/mxfp4_wgmma_decode.h"
#include "kernels/moe/expert_activation.h"
#include "kernels/moe/moe_permute.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/op_timer.h"

namespace deepinfer {

bool CudaBackend::Mxfp4ExpertsOnCublas(const RoutedExpertsArgs& a, bool captured) {
  const int64_t H = a.hidden_size, I = a.inter;
  return a.mxfp4() && a.num_tokens > kMxfp4MaxDeviceTokens && !captured && !a.keep_on_device &&
         H >= 1 && H % kernels::kMxfp4BlockSize == 0 && I >= 1 &&
         I % kernels::kMxfp4BlockSize == 0 && a.gate_up_mx_scales != nullptr &&
         a.down_mx_scales != nullptr && a.gate_up_scale_ld >= H / kernels::kMxfp4BlockSize &&
         a.down_scale_ld >= I / kernels::kMxfp4BlockSize;
}

bool CudaBackend::ExpertGemmsMxfp4Widened(const RoutedExpertsArgs& a,
                                          const ExpertGemmsCublasRun& run) {
  const int64_t E = a.num_experts, H = a.hidden_size, I = a.inter;
  const int64_t bound = tuning_.mxfp4_dequant_scratch_bytes;
  const int64_t group = Mxfp4DequantGroupExperts(E, H, I, bound);
  // One buffer for every group (stream order: a group's widening runs after the previous
  // group's GEMMs): the group's gate_up matrices [group, 2I, H], then its down [group, H, I].
  auto scratch = AllocateScratch(Mxfp4DequantScratchBytes(E, H, I, bound));
  uint16_t* gate_up = scratch->as<uint16_t>();
  uint16_t* down = gate_up + group * 2 * I * H;
  std::vector<const void*> gate_up_ptr(group), down_ptr(group);
  for (int64_t i = 0; i < group; ++i) {
    gate_up_ptr[i] = gate_up + i * 2 * I * H;
    down_ptr[i] = down + i * H * I;
  }
  const int32_t* offsets = run.host_plan + E;
  for (int64_t first = 0; first < E; first += group) {
    const int64_t count = std::min(group, E - first);
    if (offsets[first + count] == offsets[first]) continue;  // no rows
    {
      PhaseTimer phase(this, "RoutedExpertsCublas/mxfp4_dequant", true);
      kernels::Mxfp4DequantParams d;
      d.first = static_cast<int32_t>(first);
      d.num_matrices = static_cast<int32_t>(count);
      d.weights = reinterpret_cast<const uint8_t* const*>(a.gate_up);
      d.scales = a.gate_up_mx_scales;
      d.n = 2 * I;
      d.k = H;
      d.scale_ld = a.gate_up_scale_ld;
      d.out = gate_up;
      Check(kernels::Mxfp4DequantToBf16(d, stream_), "kernels::Mxfp4DequantToBf16(gate_up)");
      d.weights = reinterpret_cast<const uint8_t* const*>(a.down);
      d.scales = a.down_mx_scales;
      d.n = H;
      d.k = I;
      d.scale_ld = a.down_scale_ld;
      d.out = down;
      Check(kernels::Mxfp4DequantToBf16(d, stream_), "kernels::Mxfp4DequantToBf16(down)");
    }
    ExpertMatrices m;
    m.first = static_cast<int32_t>(first);
    m.count = static_cast<int32_t>(count);
    m.gate_up = gate_up_ptr.data();
    m.down = down_ptr.data();
    if (!ExpertGemmsOnCublasSlice(a, run, m)) return false;
  }
  return true;
}

bool CudaBackend::RoutedExpertsMxfp4(const RoutedExpertsArgs& a) {
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  const int32_t E = a.num_experts;
  if (E < 1 || E > kernels::kMaxMoeSlots || T < 0 || K < 1 || H < 1 ||
      H % kernels::kMxfp4BlockSize != 0 || I < 1 || I % kernels::kMxfp4BlockSize != 0 ||
      a.gate_up_mx_scales == nullptr || a.down_mx_scales == nullptr ||
      a.gate_up_scale_ld < H / kernels::kMxfp4BlockSize ||
      a.down_scale_ld < I / kernels::kMxfp4BlockSize || !kernels::Mxfp4MmaGemmAvailable()) {
    return false;
  }
  OpTimer timer(this, "RoutedExpertsMxfp4");
  const int64_t rows = std::max<int64_t>(
      1, kernels::MoePermutedRowsBound(static_cast<int32_t>(T), static_cast<int32_t>(K), E, 1));
  if (!FitsInt(rows * std::max(H, 2 * I))) {
    Record(
        absl::InvalidArgumentError(absl::StrCat("CudaBackend::RoutedExperts: ", T, " tokens x top-",
                                                K, " is beyond int range for the expert GEMMs")));
    return true;
  }
  if (!tuning_.batch_invariant && tuning_.mxfp4_w4a8_min_tokens > 0 &&
      T >= tuning_.mxfp4_w4a8_min_tokens && T <= tuning_.mxfp4_w4a8_max_tokens &&
      K <= 32 /* Fp8QuantizeRows' dests_per_row */ && kernels::Mxfp4W4a8GemmAvailable()) {
    RoutedExpertsMxfp4W4a8(a, rows);
    return true;
  }
  const MoePermutation perm = PermuteRoutedRows(a, rows, /*row_align=*/1, /*bf16=*/true,
                                                /*gather=*/true);
  auto gate_up = AllocateScratch(rows * 2 * I * sizeof(float));
  kernels::Mxfp4MmaGroupedGemmParams g;
  g.num_groups = E;
  g.max_rows = static_cast<int32_t>(rows);
  g.offsets = perm.plan->as<int32_t>() + E;
  g.n = 2 * I;
  g.k = H;
  g.a = perm.permuted->as<uint16_t>();
  g.weights = reinterpret_cast<const uint8_t* const*>(a.gate_up);
  g.scales = a.gate_up_mx_scales;
  g.scale_ld = a.gate_up_scale_ld;
  g.c = gate_up->as<float>();
  // A token's top-k experts are distinct: T rows at most in one expert, T * K / E on average.
  g.rows_per_group_hint =
      static_cast<int32_t>(std::min<int64_t>(T, std::max<int64_t>(1, (T * K + E - 1) / E)));
  g.tile = kernels::kGroupedMmaTile;
  Check(kernels::Mxfp4MmaGroupedGemm(g, stream_), "kernels::Mxfp4MmaGroupedGemm(gate_up)");
  auto act = AllocateScratch(rows * I * sizeof(uint16_t));
  if (a.swiglu_limit > 0.0f) {
    // DeepSeek-V4's clamped SwiGLU: the clamping SiLU-mul reads bf16 rows, so gate_up is rounded
    // to bf16 first (as the cuBLAS path's bf16 GEMM output is).
    auto gate_up16 = AllocateScratch(rows * 2 * I * sizeof(uint16_t));
    Check(kernels::RoundF32ToBf16(T * K * 2 * I, gate_up->as<float>(), gate_up16->as<uint16_t>(),
                                  stream_),
          "kernels::RoundF32ToBf16");
    Check(kernels::SiluMulBf16(T * K, I, gate_up16->as<uint16_t>(), act->as<uint16_t>(), stream_,
                               nullptr, a.swiglu_limit),
          "kernels::SiluMulBf16");
  } else {
    Check(kernels::SiluMulF32ToBf16(T * K, I, gate_up->as<float>(), act->as<uint16_t>(), stream_),
          "kernels::SiluMulF32ToBf16");
  }
  auto expert_out = AllocateScratch(rows * H * sizeof(float));
  g.n = H;
  g.k = I;
  g.a = act->as<uint16_t>();
  g.weights = reinterpret_cast<const uint8_t* const*>(a.down);
  g.scales = a.down_mx_scales;
  g.scale_ld = a.down_scale_ld;
  g.c = expert_out->as<float>();
  Check(kernels::Mxfp4MmaGroupedGemm(g, stream_), "kernels::Mxfp4MmaGroupedGemm(down)");

  CombineExpertRows(a, perm, *expert_out, /*bf16=*/false);
  return true;
}

const void* CudaBackend::Mxfp4SwapWeightMaps(const void* const* table,
                                             const void* const* host_table,
                                             const uint8_t* const* scales, int64_t scale_ld,
                                             int32_t num_experts, int64_t n, int64_t k) {
  if (host_table == nullptr || scales == nullptr || num_experts < 1 || k % 128 != 0 ||
      scale_ld % 4 != 0 || !kernels::Mxfp4WgmmaSwapDeviceSupports()) {
    return nullptr;
  }
  const std::vector<const void*> weights(host_table, host_table + num_experts);
  Mxfp4SwapMaps& maps = mxfp4_swap_maps_[std::make_tuple(static_cast<const void*>(table), n, k)];
  if (maps.checked && maps.weights == weights) return maps.fits ? maps.device : nullptr;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  Check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  maps.checked = false;
  maps.weights = weights;
  const auto* device_weights = reinterpret_cast<const uint8_t* const*>(table);
  if (kernels::Mxfp4WgmmaSwapCheck(num_experts, device_weights, scales, n, k, scale_ld, &maps.fits,
                                   stream_) != cudaSuccess) {
    maps.weights.clear();  // checked again at the next call
    return nullptr;
  }
  maps.checked = true;
  if (!maps.fits) return nullptr;
  if (maps.device == nullptr && cudaMalloc(&maps.device, kernels::Mxfp4WgmmaSwapWeightMapsBytes(
                                                             num_experts)) != cudaSuccess) {
    maps.device = nullptr;
    maps.checked = false;
    return nullptr;
  }
  if (kernels::Mxfp4WgmmaSwapBuildWeightMaps(
          num_experts, reinterpret_cast<const uint8_t* const*>(weights.data()), n, k, maps.device,
          stream_) != cudaSuccess) {
    maps.checked = false;
    return nullptr;
  }
  return maps.device;
}

void CudaBackend::RoutedExpertsMxfp4W4a8(const RoutedExpertsArgs& a, int64_t rows) {
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  const int32_t E = a.num_experts;
  // The plan only: the token rows go straight from a.hidden into their groups' quantised rows.
  const MoePermutation perm = PermuteRoutedRows(a, rows, /*row_align=*/1, /*bf16=*/true,
                                                /*gather=*/false);
  const int32_t* offsets = perm.plan->as<int32_t>() + E;
  const int64_t width = std::max(H, I);
  auto q = AllocateScratch(rows * width);
  auto q_scales = AllocateScratch(rows * kernels::Fp8ScaleCols(width) * sizeof(float));
  auto gate_up = AllocateScratch(rows * 2 * I * sizeof(float));
  auto expert_out = AllocateScratch(rows * H * sizeof(float));
  // Each group's rows quantised with their scales packed for the group (Fp8QuantizeRows' grouped
  // layout, which the kernel reads): each token row rounded to bf16 (the W4A16 path's gathered
  // values), quantised once and written to its experts' rows.
  kernels::Fp8QuantizeParams qp;
  qp.m = T, qp.k = H, qp.a = a.hidden, qp.round_bf16 = true, qp.lda = H;
  qp.q = q->as<uint8_t>(), qp.ldq = H, qp.scales = q_scales->as<float>(), qp.m_pad = T;
  qp.group_offsets = offsets, qp.num_groups = E;
  qp.dest_rows = perm.choice_row->as<int32_t>(), qp.dests_per_row = static_cast<int32_t>(K);
  {
    PhaseTimer phase(this, "RoutedExpertsMxfp4W4a8/quantize_permute", true);
    Check(kernels::Fp8QuantizeRows(qp, stream_), "kernels::Fp8QuantizeRows(permute)");
  }
  kernels::Mxfp4W4a8GroupedGemmParams g;
  g.num_groups = E;
  g.max_rows = static_cast<int32_t>(rows);
  g.offsets = offsets;
  // A token's top-k experts are distinct: T rows at most in one expert, T * K / E on average.
  g.rows_per_group_hint =
      static_cast<int32_t>(std::min<int64_t>(T, std::max<int64_t>(1, (T * K + E - 1) / E)));
  g.n = 2 * I;
  g.k = H;
  g.a = q->as<uint8_t>();
  g.a_scales = q_scales->as<float>();
  g.weights = reinterpret_cast<const uint8_t* const*>(a.gate_up);
  g.scales = a.gate_up_mx_scales;
  g.scale_ld = a.gate_up_scale_ld;
  g.c = gate_up->as<float>();
  // The swap-AB kernel for a GEMM whose weight table fits it (CudaTuning::mxfp4_wgmma_swap), on
  // the same e4m3 rows and scales; else W4A8.
  auto swap_gemm = [&](const void* const* table, const void* const* host_table,
                       const uint8_t* const* scales, int64_t scale_ld, int64_t n, int64_t k,
                       float* c) {
    if (!tuning_.mxfp4_wgmma_swap) return false;
    kernels::Mxfp4WgmmaSwapGroupedGemmParams s;
    s.weight_maps = Mxfp4SwapWeightMaps(table, host_table, scales, scale_ld, E, n, k);
    if (s.weight_maps == nullptr) return false;
    s.num_groups = E, s.max_rows = static_cast<int32_t>(rows), s.offsets = offsets;
    s.n = n, s.k = k, s.a = q->as<uint8_t>(), s.lda = k, s.a_scales = q_scales->as<float>();
    s.scales = scales, s.scale_ld = scale_ld, s.c = c, s.ldc = n;
    s.rows_per_group_hint = g.rows_per_group_hint;
    if (!kernels::Mxfp4WgmmaSwapGroupedGemmSupports(s)) return false;
    PhaseTimer phase(this, "RoutedExpertsMxfp4W4a8/wgmma-swap", true);
    Check(kernels::Mxfp4WgmmaSwapGroupedGemm(s, stream_), "kernels::Mxfp4WgmmaSwapGroupedGemm");
    return true;
  };
  if (!swap_gemm(a.gate_up, a.gate_up_host, a.gate_up_mx_scales, a.gate_up_scale_ld, 2 * I, H,
                 gate_up->as<float>())) {
    PhaseTimer phase(this, "RoutedExpertsMxfp4W4a8/gate_up", true);
    Check(kernels::Mxfp4W4a8GroupedGemm(g, stream_), "kernels::Mxfp4W4a8GroupedGemm(gate_up)");
  }
  {
    PhaseTimer phase(this, "RoutedExpertsMxfp4W4a8/silu_mul_quantize", true);
    qp.dest_rows = nullptr, qp.dests_per_row = 0;
    qp.m = rows, qp.k = I, qp.ldq = I, qp.m_pad = rows, qp.round_bf16 = false;
    std::unique_ptr<DeviceBuffer> act;
    if (a.swiglu_limit > 0.0f) {
      // DeepSeek-V4's clamped SwiGLU: gate_up rounded to bf16, the clamping SiLU-mul (as the
      // W4A16 path), then its bf16 rows quantised.
      auto gate_up16 = AllocateScratch(rows * 2 * I * sizeof(uint16_t));
      act = AllocateScratch(rows * I * sizeof(uint16_t));
      Check(kernels::RoundF32ToBf16(T * K * 2 * I, gate_up->as<float>(), gate_up16->as<uint16_t>(),
                                    stream_),
            "kernels::RoundF32ToBf16");
      Check(kernels::SiluMulBf16(T * K, I, gate_up16->as<uint16_t>(), act->as<uint16_t>(), stream_,
                                 nullptr, a.swiglu_limit),
            "kernels::SiluMulBf16");
      qp.a = act->data(), qp.a_bf16 = true, qp.lda = I;
    } else {
      // SiLU-mul rounded to bf16 (SiluMulF32ToBf16's values) and quantised in one pass.
      qp.a = gate_up->data(), qp.a_bf16 = false, qp.silu_mul = true, qp.lda = 2 * I;
    }
    Check(kernels::Fp8QuantizeRows(qp, stream_), "kernels::Fp8QuantizeRows(silu_mul)");
  }
  g.n = H;
  g.k = I;
  g.weights = reinterpret_cast<const uint8_t* const*>(a.down);
  g.scales = a.down_mx_scales;
  g.scale_ld = a.down_scale_ld;
  g.c = expert_out->as<float>();
  if (!swap_gemm(a.down, a.down_host, a.down_mx_scales, a.down_scale_ld, H, I,
                 expert_out->as<float>())) {
    PhaseTimer phase(this, "RoutedExpertsMxfp4W4a8/down", true);
    Check(kernels::Mxfp4W4a8GroupedGemm(g, stream_), "kernels::Mxfp4W4a8GroupedGemm(down)");
  }
  PhaseTimer phase(this, "RoutedExpertsMxfp4W4a8/combine", true);
  CombineExpertRows(a, perm, *expert_out, /*bf16=*/false);
}

}  // namespace deepinfer
