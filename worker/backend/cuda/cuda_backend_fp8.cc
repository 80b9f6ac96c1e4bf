// CudaBackend's ops on FP8 (e4m3, 128 x 128 block-scaled) matrices: the dense Gemm's paths (W8A8
// on cuBLASLt, the tensor-core and CUDA-core FP8 kernels, the dequantised fallback), the prefill
// MLPs' gate_up, the routed experts (kernels/gemm/fp8_*.h), and the fused decode MoE block and
// dense MLP (kernels/moe/moe_decode_fused_fp8.h).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/activation/elementwise.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_mma_gemm.h"
#include "kernels/gemm/fp8_quantize.h"
#include "kernels/gemm/fp8_tiled_gemm.h"
#include "kernels/gemm/fp8_wgmma_decode.h"
#include "kernels/moe/expert_activation.h"
#include "kernels/moe/moe_permute.h"
#include "kernels/norm/rms_norm.h"
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

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t RoundUp4(int64_t v) { return (v + 3) / 4 * 4; }

}  // namespace

std::unique_ptr<DeviceBuffer> CudaBackend::DequantizeToBf16(const WeightView& w, int64_t ldw,
                                                            int64_t n, int64_t k) {
  auto w16 = AllocateScratch(std::max<int64_t>(1, n * k) * sizeof(uint16_t));
  Check(kernels::Fp8DequantToBf16(Fp8Weight(w, ldw), n, k, w16->as<uint16_t>(), stream_),
        "kernels::Fp8DequantToBf16");
  return w16;
}

absl::StatusOr<bool> CudaBackend::PrepareW8A8Gemm(int64_t m, int64_t n, int64_t k,
                                                  const WeightView& w, int64_t ldw, void* c,
                                                  int64_t ldc, bool c_bf16, bool accumulate,
                                                  W8A8Gemm* out) {
  if (lt_fp8_ == nullptr || m < 1 || k < 16 || k % 16 != 0 ||
      w.fp8.scale_ld != kernels::Fp8ScaleLd(k)) {
    return false;
  }
  // cuBLASLt takes whole groups of 4 rows: a ragged fp32 result goes through scratch.
  const int64_t m4 = RoundUp4(m);
  const bool direct = c_bf16 || (m4 == m && Aligned16(c) && ldc % 4 == 0);
  Fp8LtGemm& g = out->g;
  g = Fp8LtGemm();
  g.m = m4, g.n = n, g.k = k, g.ldq = k;
  g.w = Fp8Weight(w, ldw);
  g.d_bf16 = c_bf16;
  g.d = c, g.ldd = ldc, g.accumulate = accumulate;
  if (direct && !(Aligned16(c) && ((c_bf16 ? 2 : 4) * ldc) % 16 == 0)) return false;
  if (!direct) {  // the scratch, taken by RunW8A8Gemm
    g.d = nullptr;
    g.ldd = RoundUp4(n);
    g.accumulate = false;
  }
  out->m = m, out->c = c, out->ldc = ldc, out->direct = direct, out->accumulate = accumulate;
  return lt_fp8_->Ready(g);
}

void CudaBackend::RunW8A8Gemm(const W8A8Gemm& w8a8, const uint8_t* q, const float* q_scales) {
  Fp8LtGemm g = w8a8.g;
  std::unique_ptr<DeviceBuffer> d;
  if (!w8a8.direct) {
    d = AllocateScratch(g.m * g.ldd * sizeof(float));
    g.d = d->data();
  }
  g.q = q;
  g.q_scales = q_scales;
  // An accumulating shape's first prefill call times cuBLASLt's candidates into scratch.
  std::unique_ptr<DeviceBuffer> timing;
  if (lt_fp8_->NeedsTimingBuffer(g)) {
    timing = AllocateScratch(g.m * g.ldd * (g.d_bf16 ? sizeof(uint16_t) : sizeof(float)));
    g.timing_d = timing->data();
  }
  auto ran = lt_fp8_->Run(g, stream_);
  if (!Record(ran.status())) return;
  if (!*ran) {
    Record(absl::InternalError("CudaBackend::Gemm: cuBLASLt refused an FP8 GEMM it had accepted"));
    return;
  }
  if (!w8a8.direct) {
    Check(kernels::AddRowsF32(w8a8.m, g.n, d->as<float>(), g.ldd, static_cast<float*>(w8a8.c),
                              w8a8.ldc, w8a8.accumulate, stream_),
          "kernels::AddRowsF32");
  }
}

bool CudaBackend::GemmFp8W8A8(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda,
                              const WeightView& w, int64_t ldw, void* c, int64_t ldc, bool c_bf16,
                              bool accumulate, const char* phase_name) {
  const bool a_bf16 = a.dtype == WeightDType::kBFloat16;
  const int64_t a_elem = a_bf16 ? 2 : 4;
  if ((lda * a_elem) % 16 != 0 || !Aligned16(a.data)) return false;
  // The shape is checked (and cuBLASLt's heuristic asked) before any scratch is taken.
  W8A8Gemm g;
  auto ready = PrepareW8A8Gemm(m, n, k, w, ldw, c, ldc, c_bf16, accumulate, &g);
  if (!Record(ready.status())) return true;
  if (!*ready) return false;

  PhaseTimer phase(this, phase_name, true);
  const int64_t m4 = RoundUp4(m);
  auto q = AllocateScratch(m4 * k);
  auto q_scales = AllocateScratch(kernels::Fp8ScaleCols(k) * m4 * sizeof(float));
  kernels::Fp8QuantizeParams qp;
  qp.m = m, qp.k = k, qp.a = a.data, qp.a_bf16 = a_bf16, qp.lda = lda;
  qp.q = q->as<uint8_t>(), qp.ldq = k, qp.scales = q_scales->as<float>(), qp.m_pad = m4;
  Check(kernels::Fp8QuantizeRows(qp, stream_), "kernels::Fp8QuantizeRows");
  RunW8A8Gemm(g, q->as<uint8_t>(), q_scales->as<float>());
  return true;
}

bool CudaBackend::GemmFp8Tiled(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda,
                               const WeightView& w, int64_t ldw, float* c, int64_t ldc,
                               bool accumulate) {
  const bool a_bf16 = a.dtype == WeightDType::kBFloat16;
  kernels::Fp8TiledGemmParams p;
  p.m = m, p.n = n, p.k = k, p.lda = lda;
  // fp32 rows: checked at their own address and stride, which their bf16 copy keeps.
  p.a = static_cast<const uint16_t*>(a.data);
  p.w = Fp8Weight(w, ldw);
  p.c = c, p.ldc = ldc, p.accumulate = accumulate;
  const size_t workspace_bytes = kernels::Fp8TiledGemmWorkspaceBytes(p);
  std::unique_ptr<DeviceBuffer> workspace;
  if (workspace_bytes > 0) {
    workspace = AllocateScratch(workspace_bytes);
    p.workspace = workspace->as<float>();
  }
  if (!kernels::Fp8TiledGemmSupports(p)) return false;
  PhaseTimer phase(this, "Gemm/fp8-tiled", true);
  std::unique_ptr<DeviceBuffer> a16;
  if (!a_bf16) {
    a16 = RoundToBf16(static_cast<const float*>(a.data), (m - 1) * lda + k);
    p.a = a16->as<uint16_t>();
  }
  Check(kernels::Fp8TiledGemm(p, stream_), "kernels::Fp8TiledGemm");
  return true;
}

void CudaBackend::GemmFp8(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda,
                          WeightView w, int64_t ldw, float* c, int64_t ldc, bool accumulate) {
  const bool a_bf16 = a.dtype == WeightDType::kBFloat16;
  if (tuning_.batch_invariant) {
    // One path for every m: the tensor-core kernel with a fixed k split, else the weight
    // dequantised to bf16 for the batch-invariant bf16 GEMM. The tile is Fp8MmaDenseTile's: every
    // tile variant gives the same sums bit for bit at a fixed k split (fp8_mma_gemm_test), so a
    // row's bits do not depend on which one runs.
    kernels::Fp8MmaGemmParams p;
    p.m = m, p.n = n, p.k = k, p.a = a.data, p.a_bf16 = a_bf16, p.lda = lda;
    p.w = Fp8Weight(w, ldw);
    p.c = c, p.ldc = ldc, p.accumulate = accumulate;
    p.k_split = kBatchInvariantFp8KSplit;
    p.tile = kernels::Fp8MmaDenseTile(m);
    if (kernels::Fp8MmaGemmSupports(p)) {
      PhaseTimer phase(this, "Gemm/fp8-mma", true);
      Check(kernels::Fp8MmaGemm(p, stream_), "kernels::Fp8MmaGemm");
      return;
    }
    PhaseTimer phase(this, "Gemm/fp8-dequant-bf16", true);
    auto w16 = DequantizeToBf16(w, ldw, n, k);
    kernels::BatchInvariantGemmParams b;
    b.m = m, b.n = n, b.k = k, b.a = a.data, b.a_bf16 = a_bf16, b.lda = lda;
    b.w = w16->data(), b.ldw = k, b.c = c, b.ldc = ldc, b.accumulate = accumulate;
    BatchInvariantGemm(b);
    return;
  }
  if (m >= tuning_.fp8_w8a8_min_rows &&
      GemmFp8W8A8(m, n, k, a, lda, w, ldw, c, ldc, /*c_bf16=*/false, accumulate, "Gemm/fp8-w8a8")) {
    return;
  }
  if (m >= CudaTuningDefaults::kFp8TiledMinRows && m < tuning_.fp8_w8a8_min_rows &&
      GemmFp8Tiled(m, n, k, a, lda, w, ldw, c, ldc, accumulate)) {
    return;
  }
  if (m > kFp8CudaCoreMaxRows) {
    kernels::Fp8MmaGemmParams p;
    p.m = m, p.n = n, p.k = k, p.a = a.data, p.a_bf16 = a_bf16, p.lda = lda;
    p.w = Fp8Weight(w, ldw);
    p.c = c, p.ldc = ldc, p.accumulate = accumulate;
    p.tile = kernels::Fp8MmaDenseTile(m);
    if (kernels::Fp8MmaGemmSupports(p)) {
      PhaseTimer phase(this, "Gemm/fp8-mma", true);
      Check(kernels::Fp8MmaGemm(p, stream_), "kernels::Fp8MmaGemm");
      return;
    }
  }
  if (m <= kFp8SmallMGemmMaxRows) {
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
    PhaseTimer phase(this, "Gemm/fp8-small-m", true);
    Check(kernels::Fp8SmallMGemm(p, stream_), "kernels::Fp8SmallMGemm");
    return;
  }
  // The weight dequantised to bf16 (the values `--dtype bfloat16` uploads) in scratch, then the
  // bf16 tensor-core path: where neither FP8 kernel takes the operands.
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

bool CudaBackend::GateUpSiluMulFp8(int64_t rows, int64_t inter, int64_t k, ActivationView a,
                                   int64_t lda, WeightView w, int64_t ldw, uint16_t* out) {
  OpTimer timer(this, "GateUpSiluMulBf16");
  if (rows >= tuning_.fp8_w8a8_min_rows) {
    // gate_up in bf16 (the epilogue's rounding, as the bf16 path), its rows padded to 4.
    auto gate_up = AllocateScratch(RoundUp4(rows) * 2 * inter * sizeof(uint16_t));
    if (GemmFp8W8A8(rows, 2 * inter, k, a, lda, w, ldw, gate_up->data(), 2 * inter,
                    /*c_bf16=*/true, /*accumulate=*/false, "GateUpSiluMulBf16/fp8-w8a8")) {
      Check(kernels::SiluMulBf16(rows, inter, gate_up->as<uint16_t>(), out, stream_),
            "kernels::SiluMulBf16");
      return true;
    }
  }
  auto w16 = DequantizeToBf16(w, ldw, 2 * inter, k);
  return GateUpSiluMulBf16(rows, inter, k, a, lda, WeightView(w16->data(), WeightDType::kBFloat16),
                           k, /*swiglu_limit=*/0.0f, out);
}

void CudaBackend::ExpertGemmsFp8OnDevice(const RoutedExpertsArgs& a, const int32_t* offsets,
                                         int64_t rows, bool mma, const void* permuted,
                                         float* expert_out) {
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  auto gate_up = AllocateScratch(rows * 2 * I * sizeof(float));
  if (mma) {
    kernels::Fp8MmaGroupedGemmParams g;
    g.num_groups = a.num_experts;
    g.max_rows = static_cast<int32_t>(rows);
    g.offsets = offsets;
    g.n = 2 * I;
    g.k = H;
    g.a = static_cast<const uint16_t*>(permuted);
    g.weights = reinterpret_cast<const uint8_t* const*>(a.gate_up);
    g.scales = a.gate_up_scales;
    g.scale_ld = a.gate_up_scale_ld;
    g.split_rows = I;
    g.c = gate_up->as<float>();
    // A token's top-k experts are distinct: T rows at most in one expert, T * K / E on average.
    g.rows_per_group_hint = static_cast<int32_t>(
        std::min<int64_t>(T, std::max<int64_t>(1, (T * K + a.num_experts - 1) / a.num_experts)));
    g.tile = kernels::kGroupedMmaTile;  // the same at every row count
    if (tuning_.batch_invariant) g.k_split = kBatchInvariantFp8KSplit;
    Check(kernels::Fp8MmaGroupedGemm(g, stream_), "kernels::Fp8MmaGroupedGemm(gate_up)");
    auto act = AllocateScratch(rows * I * sizeof(uint16_t));
    Check(kernels::SiluMulF32ToBf16(T * K, I, gate_up->as<float>(), act->as<uint16_t>(), stream_),
          "kernels::SiluMulF32ToBf16");
    g.n = H;
    g.k = I;
    g.a = act->as<uint16_t>();
    g.weights = reinterpret_cast<const uint8_t* const*>(a.down);
    g.scales = a.down_scales;
    g.scale_ld = a.down_scale_ld;
    g.split_rows = 0;
    g.c = expert_out;
    Check(kernels::Fp8MmaGroupedGemm(g, stream_), "kernels::Fp8MmaGroupedGemm(down)");
    return;
  }
  kernels::Fp8GroupedGemmParams g;
  g.num_groups = a.num_experts;
  g.max_rows = static_cast<int32_t>(rows);
  g.offsets = offsets;
  g.n = 2 * I;
  g.k = H;
  g.a = static_cast<const float*>(permuted);
  g.weights = reinterpret_cast<const uint8_t* const*>(a.gate_up);
  g.scales = a.gate_up_scales;
  g.scale_ld = a.gate_up_scale_ld;
  g.split_rows = I;
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
  g.scale_ld = a.down_scale_ld;
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
  const int64_t used = host_offsets[E];
  for (int32_t e = 0; e < E; ++e) {
    const int64_t r0 = host_offsets[e], m = host_offsets[e + 1] - host_offsets[e];
    if (m <= 0) continue;
    GemmFp8(m, 2 * I, H, permuted + r0 * H, H,
            WeightView(a.gate_up_host[e], Fp8BlockScales{gu_scales[e], a.gate_up_scale_ld, I}), H,
            gate_up->as<float>() + r0 * 2 * I, 2 * I, false);
  }
  Check(kernels::SiluMulF32(used, I, gate_up->as<float>(), act->as<float>(), stream_),
        "kernels::SiluMulF32");
  for (int32_t e = 0; e < E; ++e) {
    const int64_t r0 = host_offsets[e], m = host_offsets[e + 1] - host_offsets[e];
    if (m <= 0) continue;
    GemmFp8(m, H, I, act->as<float>() + r0 * I, I,
            WeightView(a.down_host[e], Fp8BlockScales{dn_scales[e], a.down_scale_ld, 0}), I,
            expert_out + r0 * H, H, false);
  }
}

bool CudaBackend::RoutedExpertsFp8W8A8(const RoutedExpertsArgs& a, const MoePermutation& perm) {
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  const int32_t E = a.num_experts;
  if (lt_fp8_ == nullptr || H % 16 != 0 || I % 16 != 0 || !Aligned16(a.hidden) ||
      a.gate_up_scale_ld != kernels::Fp8ScaleLd(H) || a.down_scale_ld != kernels::Fp8ScaleLd(I)) {
    return false;
  }
  const int32_t* offsets = perm.plan->as<int32_t>() + E;
  std::vector<int32_t> host_offsets(E + 1);
  std::vector<const float*> gu_scales(E), dn_scales(E);
  {
    PhaseTimer phase(this, "RoutedExpertsFp8PerExpert/plan_to_host", true);
    CopyToHost(offsets, (E + 1) * sizeof(int32_t), host_offsets.data());
    CopyToHost(a.gate_up_scales, E * sizeof(float*), gu_scales.data());
    CopyToHost(a.down_scales, E * sizeof(float*), dn_scales.data());
  }
  const int64_t used = host_offsets[E], h_blocks = kernels::Fp8ScaleCols(H),
                i_blocks = kernels::Fp8ScaleCols(I);
  // Every busy expert's two GEMMs must be available before any runs (or the caller's other path
  // redoes them all). Both write bf16, as the bf16 experts' cuBLAS GEMMs.
  std::vector<std::pair<int64_t, Fp8LtGemm>> gate_ups, downs;  // (first row, GEMM)
  for (int32_t e = 0; e < E; ++e) {
    const int64_t r0 = host_offsets[e], m = host_offsets[e + 1] - host_offsets[e];
    if (m <= 0) continue;
    Fp8LtGemm g;
    g.m = m, g.n = 2 * I, g.k = H, g.ldq = H, g.ldd = 2 * I, g.d_bf16 = true;
    g.w.data = static_cast<const uint8_t*>(a.gate_up_host[e]), g.w.ldw = H;
    g.w.scales = gu_scales[e], g.w.scale_ld = a.gate_up_scale_ld, g.w.split_rows = I;
    Fp8LtGemm d;
    d.m = m, d.n = H, d.k = I, d.ldq = I, d.ldd = H, d.d_bf16 = true;
    d.w.data = static_cast<const uint8_t*>(a.down_host[e]), d.w.ldw = I;
    d.w.scales = dn_scales[e], d.w.scale_ld = a.down_scale_ld, d.w.split_rows = 0;
    for (const Fp8LtGemm* x : {&g, &d}) {
      auto ready = lt_fp8_->Ready(*x);
      if (!Record(ready.status())) return true;
      if (!*ready) return false;
    }
    gate_ups.emplace_back(r0, g);
    downs.emplace_back(r0, d);
  }
  const int64_t alloc_rows = std::max<int64_t>(1, used);
  auto q = AllocateScratch(alloc_rows * std::max(H, I));
  auto q_scales = AllocateScratch(alloc_rows * std::max(h_blocks, i_blocks) * sizeof(float));
  auto gate_up = AllocateScratch(alloc_rows * 2 * I * sizeof(uint16_t));
  auto expert_out = AllocateScratch(alloc_rows * H * sizeof(uint16_t));
  // One expert GEMM a busy expert, its rows' operands at their group's place.
  auto run = [&](std::vector<std::pair<int64_t, Fp8LtGemm>>& gemms, int64_t k, int64_t blocks,
                 void* d) {
    for (auto& [r0, g] : gemms) {
      g.q = q->as<uint8_t>() + r0 * k;
      g.q_scales = q_scales->as<float>() + r0 * blocks;
      g.d = static_cast<uint16_t*>(d) + r0 * g.n;
      auto ran = lt_fp8_->Run(g, stream_);
      if (!Record(ran.status())) return;
      if (!*ran) {
        Record(absl::InternalError(
            "CudaBackend::RoutedExperts: cuBLASLt refused an FP8 expert GEMM it had accepted"));
        return;
      }
    }
  };
  kernels::Fp8QuantizeParams qp;
  qp.q = q->as<uint8_t>();
  qp.scales = q_scales->as<float>();
  qp.group_offsets = offsets;
  qp.num_groups = E;
  {
    // Each token row quantised once, written to its top-k experts' rows (the rows' values are
    // those a gather then a quantisation would give; a group's padding rows stay unwritten, and
    // their GEMM results are never combined).
    PhaseTimer phase(this, "RoutedExpertsFp8PerExpert/quantize_permute", true);
    qp.m = T, qp.k = H, qp.a = a.hidden, qp.lda = H, qp.ldq = H, qp.m_pad = T;
    qp.dest_rows = perm.choice_row->as<int32_t>();
    qp.dests_per_row = static_cast<int32_t>(K);
    Check(kernels::Fp8QuantizeRows(qp, stream_), "kernels::Fp8QuantizeRows(permute)");
  }
  {
    PhaseTimer phase(this, "RoutedExpertsFp8PerExpert/w8a8-gate_up", true);
    run(gate_ups, H, h_blocks, gate_up->data());
  }
  {
    // SiLU-mul rounded to bf16 (SiluMulBf16's values) and quantised for down in one pass.
    PhaseTimer phase(this, "RoutedExpertsFp8PerExpert/silu_mul_quantize", true);
    qp.m = used, qp.k = I, qp.a = gate_up->data(), qp.a_bf16 = true, qp.silu_mul = true;
    qp.lda = 2 * I, qp.ldq = I, qp.m_pad = used;
    qp.dest_rows = nullptr, qp.dests_per_row = 0;
    Check(kernels::Fp8QuantizeRows(qp, stream_), "kernels::Fp8QuantizeRows(silu_mul)");
  }
  {
    PhaseTimer phase(this, "RoutedExpertsFp8PerExpert/w8a8-down", true);
    run(downs, I, i_blocks, expert_out->data());
  }
  PhaseTimer phase(this, "RoutedExpertsFp8PerExpert/combine", true);
  CombineExpertRows(a, perm, *expert_out, /*bf16=*/true);
  return true;
}

const void* CudaBackend::Fp8SwapWeightMaps(const void* const* table, const void* const* host_table,
                                           int32_t num_experts, int64_t n, int64_t k) {
  if (host_table == nullptr) return nullptr;
  const std::vector<const void*> weights(host_table, host_table + num_experts);
  Fp8SwapMaps& maps = fp8_swap_maps_[std::make_tuple(static_cast<const void*>(table), n, k)];
  if (maps.device != nullptr && maps.weights == weights) return maps.device;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  Check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  if (maps.device == nullptr || maps.weights.size() != weights.size()) {
    cudaFree(maps.device);
    maps.device = nullptr;
    maps.weights.clear();
    if (cudaMalloc(&maps.device, kernels::Fp8WgmmaSwapWeightMapsBytes(num_experts)) !=
        cudaSuccess) {
      maps.device = nullptr;
      return nullptr;
    }
  }
  const cudaError_t e = kernels::Fp8WgmmaSwapBuildWeightMaps(
      num_experts, reinterpret_cast<const uint8_t* const*>(weights.data()), n, k, k, maps.device,
      stream_);
  if (e != cudaSuccess) {
    maps.weights.clear();  // rebuilt (or refused) at the next call
    return nullptr;
  }
  maps.weights = weights;
  return maps.device;
}

bool CudaBackend::Fp8SwapTakes(const RoutedExpertsArgs& a, int32_t num_groups) {
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  if (tuning_.batch_invariant || T < tuning_.fp8_swap_min_tokens || H % 128 != 0 || I % 128 != 0 ||
      K > 32 || !Aligned16(a.hidden) || !kernels::Fp8WgmmaSwapDeviceSupports()) {
    return false;
  }
  kernels::Fp8WgmmaSwapGroupedGemmParams gu, dn;
  gu.num_groups = dn.num_groups = num_groups;
  gu.max_rows = dn.max_rows = 1;
  gu.n = 2 * I, gu.k = H, gu.lda = H;
  gu.scale_ld = a.gate_up_scale_ld, gu.split_rows = I;
  gu.ldc = 2 * I;
  dn.n = H, dn.k = I, dn.lda = I;
  dn.scale_ld = a.down_scale_ld, dn.split_rows = 0;
  dn.ldc = H;
  // The layout checked before the descriptors are built or any scratch is taken (the scratch is
  // 64-byte aligned).
  alignas(64) static const float kProbe[16] = {};
  for (kernels::Fp8WgmmaSwapGroupedGemmParams* p : {&gu, &dn}) {
    p->offsets = reinterpret_cast<const int32_t*>(kProbe);
    p->a = reinterpret_cast<const uint8_t*>(kProbe), p->a_scales = kProbe;
    p->weight_maps = kProbe, p->c = const_cast<float*>(kProbe);
    if (p == &gu && tuning_.fp8_swap_gate_up_bf16) {
      p->c = nullptr;
      p->c_bf16 = reinterpret_cast<uint16_t*>(const_cast<float*>(kProbe));
    }
    p->scales = reinterpret_cast<const float* const*>(kProbe);
    if (!kernels::Fp8WgmmaSwapGroupedGemmSupports(*p)) return false;
  }
  return true;
}

bool CudaBackend::RoutedExpertsFp8Swap(const RoutedExpertsArgs& a, int64_t rows) {
  const int32_t E = a.num_experts;
  if (!Fp8SwapTakes(a, E)) return false;
  Fp8SwapGroups g;
  g.num_groups = E;
  g.gate_up_maps = Fp8SwapWeightMaps(a.gate_up, a.gate_up_host, E, 2 * a.inter, a.hidden_size);
  g.down_maps = Fp8SwapWeightMaps(a.down, a.down_host, E, a.hidden_size, a.inter);
  if (g.gate_up_maps == nullptr || g.down_maps == nullptr) return false;
  g.gate_up_scales = a.gate_up_scales;
  g.down_scales = a.down_scales;
  RunFp8SwapGroups(a, rows, g, "RoutedExpertsFp8Mma/wgmma-swap");
  return true;
}

void CudaBackend::RunFp8SwapGroups(const RoutedExpertsArgs& a, int64_t rows, const Fp8SwapGroups& g,
                                   const char* phase_name) {
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  const int32_t E = a.num_experts, S = g.shared_parts;
  kernels::Fp8WgmmaSwapGroupedGemmParams gu, dn;
  gu.num_groups = dn.num_groups = g.num_groups;
  gu.max_rows = dn.max_rows = static_cast<int32_t>(rows);
  // A token's top-k experts are distinct: T rows at most in one expert, T * K / E on average (a
  // shared group's T rows run in several chunks).
  gu.rows_per_group_hint = dn.rows_per_group_hint =
      static_cast<int32_t>(std::min<int64_t>(T, std::max<int64_t>(1, (T * K + E - 1) / E)));
  gu.n = 2 * I, gu.k = H, gu.lda = H;
  gu.scales = g.gate_up_scales, gu.scale_ld = a.gate_up_scale_ld, gu.split_rows = I;
  gu.ldc = 2 * I;
  dn.n = H, dn.k = I, dn.lda = I;
  dn.scales = g.down_scales, dn.scale_ld = a.down_scale_ld, dn.split_rows = 0;
  dn.ldc = H;
  gu.weight_maps = g.gate_up_maps;
  dn.weight_maps = g.down_maps;
  // The plan only: the token rows go straight from a.hidden into their groups' quantised rows.
  const MoePermutation perm =
      PermuteRoutedRows(a, rows, /*row_align=*/1, /*bf16=*/true, /*gather=*/false, S);
  const int32_t* offsets = perm.plan->as<int32_t>() + g.num_groups;
  gu.offsets = dn.offsets = offsets;
  PhaseTimer phase(this, phase_name, true);
  const int64_t width = std::max(H, I);
  auto q = AllocateScratch(rows * width);
  auto q_scales = AllocateScratch(rows * kernels::Fp8ScaleCols(width) * sizeof(float));
  // gate_up in bf16 (CudaTuning::fp8_swap_gate_up_bf16): g and u rounded to bf16 before the
  // SiLU-mul, as the prefill experts' cuBLASLt gate_up and GateUpSiluMulBf16 round them.
  const bool gate_up_bf16 = tuning_.fp8_swap_gate_up_bf16;
  auto gate_up = AllocateScratch(rows * 2 * I * (gate_up_bf16 ? sizeof(uint16_t) : sizeof(float)));
  auto expert_out = AllocateScratch(rows * H * sizeof(float));
  // Each group's rows quantised with their scales packed for the group (Fp8QuantizeRows'
  // grouped layout, which the swap kernel reads). The rows are those of a bf16 gather (each
  // token row rounded to bf16, then quantised once and written to its groups' rows) and of
  // SiluMulBf16's (bf16 gate_up) or SiluMulF32ToBf16's (fp32) product; row_align 1: no group
  // padding rows.
  kernels::Fp8QuantizeParams qp;
  qp.m = T, qp.k = H, qp.a = a.hidden, qp.round_bf16 = true, qp.lda = H;
  qp.q = q->as<uint8_t>(), qp.ldq = H, qp.scales = q_scales->as<float>(), qp.m_pad = T;
  qp.group_offsets = offsets, qp.num_groups = g.num_groups;
  qp.dest_rows = perm.choice_row->as<int32_t>(), qp.dests_per_row = static_cast<int32_t>(K + S);
  Check(kernels::Fp8QuantizeRows(qp, stream_), "kernels::Fp8QuantizeRows(gate_up)");
  gu.a = q->as<uint8_t>(), gu.a_scales = q_scales->as<float>();
  if (gate_up_bf16) {
    gu.c_bf16 = gate_up->as<uint16_t>();
  } else {
    gu.c = gate_up->as<float>();
  }
  Check(kernels::Fp8WgmmaSwapGroupedGemm(gu, stream_), "kernels::Fp8WgmmaSwapGroupedGemm(gate_up)");
  qp.m = rows, qp.k = I, qp.a = gate_up->data(), qp.round_bf16 = false, qp.silu_mul = true;
  qp.a_bf16 = gate_up_bf16;
  qp.lda = 2 * I, qp.ldq = I, qp.m_pad = rows;
  qp.dest_rows = nullptr, qp.dests_per_row = 0;
  Check(kernels::Fp8QuantizeRows(qp, stream_), "kernels::Fp8QuantizeRows(silu_mul)");
  dn.a = q->as<uint8_t>(), dn.a_scales = q_scales->as<float>(), dn.c = expert_out->as<float>();
  Check(kernels::Fp8WgmmaSwapGroupedGemm(dn, stream_), "kernels::Fp8WgmmaSwapGroupedGemm(down)");
  CombineExpertRows(a, perm, *expert_out, /*bf16=*/false, S);
}

bool CudaBackend::RoutedExpertsFp8(const RoutedExpertsArgs& a) {
  if (a.num_experts < 1 || a.num_experts > kernels::kMaxMoeSlots || a.num_tokens < 0 ||
      a.top_k < 1 || a.hidden_size < 1 || a.hidden_size % 8 != 0 || a.inter < 1 ||
      a.inter % 8 != 0 || a.gate_up_scales == nullptr || a.down_scales == nullptr ||
      a.gate_up_scale_ld < kernels::Fp8ScaleCols(a.hidden_size) ||
      a.down_scale_ld < kernels::Fp8ScaleCols(a.inter) ||
      a.swiglu_limit > 0.0f) {  // V4's clamp: its experts are never kept FP8
    return false;
  }
  // Prefill sizes outside graph capture: per-expert GEMMs from the group sizes on the host.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  Check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
  const bool per_expert = !tuning_.batch_invariant && a.num_tokens > kMaxFusedMoeTokens &&
                          capture == cudaStreamCaptureStatusNone && a.gate_up_host != nullptr &&
                          a.down_host != nullptr;
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  const int32_t E = a.num_experts;
  // The device path on tensor cores (bf16 rows) where the kernel is built and takes the sizes.
  const bool mma = !per_expert && H % 16 == 0 && I % 16 == 0 && kernels::Fp8MmaGemmAvailable();
  // Batch-invariant: the tensor-core grouped kernel with a fixed k split only (otherwise the
  // caller's per-expert GroupedGemm, on GemmFp8's batch-invariant path).
  if (tuning_.batch_invariant && !mma) return false;
  OpTimer timer(this, per_expert ? "RoutedExpertsFp8PerExpert"
                      : mma      ? "RoutedExpertsFp8Mma"
                                 : "RoutedExpertsFp8");
  const int32_t row_align = per_expert ? 4 : 1;
  const int64_t rows =
      std::max<int64_t>(1, kernels::MoePermutedRowsBound(static_cast<int32_t>(T),
                                                         static_cast<int32_t>(K), E, row_align));
  if (!FitsInt(rows * std::max(H, 2 * I))) {
    Record(
        absl::InvalidArgumentError(absl::StrCat("CudaBackend::RoutedExperts: ", T, " tokens x top-",
                                                K, " is beyond int range for the expert GEMMs")));
    return true;
  }
  // The permutation of RoutedExperts (rows grouped by expert on the device), the expert GEMMs,
  // the combine. Prefill on cuBLASLt quantises the token rows itself: the plan only, then.
  if (per_expert) {
    MoePermutation plan;
    {
      PhaseTimer phase(this, "RoutedExpertsFp8PerExpert/permute_plan", true);
      plan = PermuteRoutedRows(a, rows, row_align, /*bf16=*/false, /*gather=*/false);
    }
    if (RoutedExpertsFp8W8A8(a, plan)) return true;
  }
  if (mma && RoutedExpertsFp8Swap(a, rows)) return true;
  const MoePermutation perm = PermuteRoutedRows(a, rows, row_align, /*bf16=*/mma, /*gather=*/true);
  auto expert_out = AllocateScratch(rows * H * sizeof(float));
  if (per_expert) {
    ExpertGemmsFp8PerExpert(a, perm.plan->as<int32_t>() + E, rows, perm.permuted->as<float>(),
                            expert_out->as<float>());
  } else {
    ExpertGemmsFp8OnDevice(a, perm.plan->as<int32_t>() + E, rows, mma, perm.permuted->data(),
                           expert_out->as<float>());
  }

  CombineExpertRows(a, perm, *expert_out, /*bf16=*/false);
  return true;
}

bool CudaBackend::RoutedAndSharedExpertsFp8(const RoutedExpertsArgs& a) {
  if (!DecodeMoeFusedFor(a.num_tokens, a.hidden_size)) return RoutedAndSharedExpertsFp8Swap(a);
  if (tuning_.batch_invariant || a.top_k < 1 || a.num_experts < 1 || a.inter <= 0 ||
      a.inter % 16 != 0 || a.hidden_size % 16 != 0 || !FitsInt(a.hidden_size) ||
      !FitsInt(a.inter) || a.shared_inter <= 0 || a.shared_inter % a.inter != 0 ||
      a.shared_gate_up == nullptr || a.shared_down == nullptr ||
      a.top_k + a.shared_inter / a.inter > kernels::kMoeDecodeFusedMaxParts ||
      a.gate_up_scales == nullptr || a.down_scales == nullptr ||
      a.gate_up_scale_ld < kernels::Fp8ScaleCols(a.hidden_size) ||
      a.down_scale_ld < kernels::Fp8ScaleCols(a.inter) || !FitsInt(a.gate_up_scale_ld) ||
      !FitsInt(a.down_scale_ld) || a.shared_gate_up_fp8.scales == nullptr ||
      a.shared_down_fp8.scales == nullptr || a.shared_down_fp8.split_rows != 0 ||
      !FitsInt(a.shared_gate_up_fp8.scale_ld) || !FitsInt(a.shared_gate_up_fp8.split_rows) ||
      !FitsInt(a.shared_down_fp8.scale_ld) ||
      a.swiglu_limit > 0.0f ||  // V4's clamp: its experts are never kept FP8
      !Aligned16(a.hidden) || !Aligned16(a.shared_gate_up) || !Aligned16(a.shared_down)) {
    return false;
  }
  OpTimer timer(this, "RoutedAndSharedExpertsFp8");
  kernels::MoeDecodeFusedFp8Params p;
  SetFusedDecodeRouting(a, &p);
  // Each expert's gate_up is stacked at inter rows (its gate and up tensors' block grids), as
  // ExpertGemmsFp8OnDevice reads it.
  p.gate_up = reinterpret_cast<const uint8_t* const*>(a.gate_up);
  p.gate_up_scales = a.gate_up_scales;
  p.gate_up_scale_ld = static_cast<int32_t>(a.gate_up_scale_ld);
  p.down = reinterpret_cast<const uint8_t* const*>(a.down);
  p.down_scales = a.down_scales;
  p.down_scale_ld = static_cast<int32_t>(a.down_scale_ld);
  p.shared_gate_up = static_cast<const uint8_t*>(a.shared_gate_up);
  p.shared_gate_up_scales = a.shared_gate_up_fp8.scales;
  p.shared_gate_up_scale_ld = static_cast<int32_t>(a.shared_gate_up_fp8.scale_ld);
  p.shared_gate_up_split_rows = static_cast<int32_t>(a.shared_gate_up_fp8.split_rows);
  p.shared_down = static_cast<const uint8_t*>(a.shared_down);
  p.shared_down_scales = a.shared_down_fp8.scales;
  p.shared_down_scale_ld = static_cast<int32_t>(a.shared_down_fp8.scale_ld);
  LaunchMoeDecodeFusedFp8(p);
  return true;
}

bool CudaBackend::NormedDenseMlpFp8(const DenseMlpArgs& a) {
  const Fp8BlockScales& gs = a.gate_up.fp8;
  const Fp8BlockScales& ds = a.down.fp8;
  if (tuning_.batch_invariant || a.rows != 1 || a.gate_up.dtype != WeightDType::kFp8E4M3 ||
      a.down.dtype != WeightDType::kFp8E4M3 || a.hidden_size <= 0 || a.hidden_size % 16 != 0 ||
      a.inter <= 0 || a.inter % 16 != 0 || !FitsInt(a.hidden_size) || !FitsInt(a.inter) ||
      a.x == nullptr || a.norm_weight == nullptr || a.normed == nullptr || a.out == nullptr ||
      a.gate_up.data == nullptr || a.down.data == nullptr || gs.scales == nullptr ||
      ds.scales == nullptr || gs.scale_ld < kernels::Fp8ScaleCols(a.hidden_size) ||
      ds.scale_ld < kernels::Fp8ScaleCols(a.inter) || !FitsInt(gs.scale_ld) ||
      !FitsInt(ds.scale_ld) || gs.split_rows < 0 || !FitsInt(gs.split_rows) || ds.split_rows != 0 ||
      !Aligned16(a.normed) || !Aligned16(a.gate_up.data) || !Aligned16(a.down.data)) {
    return false;
  }
  OpTimer timer(this, "NormedDenseMlpFp8");
  Check(kernels::AddRmsNormF32(a.rows, a.hidden_size, a.x, a.y, a.norm_weight, a.eps, a.normed,
                               nullptr, stream_),
        "kernels::AddRmsNormF32");
  // The MLP is the fused block's shared MLP alone (top_k 0), as one part.
  kernels::MoeDecodeFusedFp8Params p;
  p.num_tokens = 1;
  p.top_k = 0;
  p.hidden_size = static_cast<int32_t>(a.hidden_size);
  p.inter = static_cast<int32_t>(a.inter);
  p.hidden = a.normed;
  p.shared_parts = 1;
  p.shared_gate_up = static_cast<const uint8_t*>(a.gate_up.data);
  p.shared_gate_up_scales = gs.scales;
  p.shared_gate_up_scale_ld = static_cast<int32_t>(gs.scale_ld);
  p.shared_gate_up_split_rows = static_cast<int32_t>(gs.split_rows);
  p.shared_down = static_cast<const uint8_t*>(a.down.data);
  p.shared_down_scales = ds.scales;
  p.shared_down_scale_ld = static_cast<int32_t>(ds.scale_ld);
  p.out = a.out;
  LaunchMoeDecodeFusedFp8(p);
  return true;
}

void CudaBackend::LaunchMoeDecodeFusedFp8(kernels::MoeDecodeFusedFp8Params p) {
  const size_t act_bytes =
      kernels::MoeDecodeFusedActFloats(p.num_tokens, p.top_k, p.shared_parts, p.inter) *
      sizeof(float);
  auto act = AllocateScratch(act_bytes);
  p.act = act->as<float>();
  Check(kernels::MoeDecodeFusedFp8(p, stream_), "kernels::MoeDecodeFusedFp8");
}

}  // namespace deepinfer
