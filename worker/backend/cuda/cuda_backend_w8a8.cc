// CudaBackend's W8A8 ops that quantise an activation once for the cuBLASLt FP8 GEMMs reading it
// (CudaTuning::fp8_w8a8_min_rows rows on, compute capability 9.0): AddRmsNormGemms' targets
// on one quantisation written by the norm's own pass (kernels::AddRmsNormFp8), and the SwiGLU
// MLP's down GEMM on its SiLU-mul quantised in the same pass (SwiGluMlpBf16).
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_quantize.h"
#include "kernels/norm/rms_norm.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/op_timer.h"

namespace deepinfer {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

int64_t RoundUp4(int64_t v) { return (v + 3) / 4 * 4; }

}  // namespace

bool CudaBackend::AddRmsNormGemmsW8A8(int64_t rows, int64_t dim, float* x, const float* y,
                                      const float* weight, float eps, float* normed,
                                      uint16_t* normed_bf16, const std::vector<NormedGemm>& gemms) {
  // Each target's Gemm would take GemmFp8W8A8 on the normed rows (normed_bf16 if set, else
  // normed; row stride dim): the same quantised rows and cuBLASLt GEMM here, quantised once.
  const bool from_bf16 = normed_bf16 != nullptr;
  const void* normed_rows = from_bf16 ? static_cast<const void*>(normed_bf16) : normed;
  if (tuning_.batch_invariant || rows < tuning_.fp8_w8a8_min_rows || gemms.empty() ||
      normed_rows == nullptr || !Aligned16(normed_rows) || dim % 16 != 0 || !FitsInt(rows) ||
      !FitsInt(dim)) {
    return false;
  }
  std::vector<W8A8Gemm> prepared(gemms.size());
  for (size_t t = 0; t < gemms.size(); ++t) {
    const NormedGemm& g = gemms[t];
    if (g.w.dtype != WeightDType::kFp8E4M3 || g.n <= 0 || !FitsInt(g.n) || !FitsInt(g.ldw) ||
        !FitsInt(g.ldc)) {
      return false;
    }
    auto ready = PrepareW8A8Gemm(rows, g.n, dim, g.w, g.ldw, g.c, g.ldc, /*c_bf16=*/false,
                                 /*accumulate=*/false, &prepared[t]);
    if (!Record(ready.status())) return true;
    if (!*ready) return false;
  }
  PhaseTimer phase(this, "AddRmsNormGemms/fp8-w8a8", true);
  const int64_t m4 = RoundUp4(rows);
  auto q = AllocateScratch(m4 * dim);
  auto q_scales = AllocateScratch(kernels::Fp8ScaleCols(dim) * m4 * sizeof(float));
  kernels::RmsNormFp8Out fp8;
  fp8.q = q->as<uint8_t>(), fp8.ldq = dim, fp8.scales = q_scales->as<float>(), fp8.m_pad = m4;
  fp8.from_bf16 = from_bf16;
  if (kernels::AddRmsNormFp8Supports(rows, dim, x, y, weight, nullptr, nullptr, fp8)) {
    // The normed rows are scratch the targets no longer read: left unwritten.
    Check(kernels::AddRmsNormFp8(rows, dim, x, y, weight, eps, nullptr, nullptr, fp8, stream_),
          "kernels::AddRmsNormFp8");
  } else {
    Check(kernels::AddRmsNormF32(rows, dim, x, y, weight, eps, from_bf16 ? nullptr : normed,
                                 normed_bf16, stream_),
          "kernels::AddRmsNormF32");
    kernels::Fp8QuantizeParams qp;
    qp.m = rows, qp.k = dim, qp.a = normed_rows, qp.a_bf16 = from_bf16, qp.lda = dim;
    qp.q = fp8.q, qp.ldq = dim, qp.scales = fp8.scales, qp.m_pad = m4;
    Check(kernels::Fp8QuantizeRows(qp, stream_), "kernels::Fp8QuantizeRows");
  }
  for (const W8A8Gemm& g : prepared) RunW8A8Gemm(g, fp8.q, fp8.scales);
  return true;
}

bool CudaBackend::SwiGluMlpBf16(int64_t rows, int64_t hidden, int64_t inter, ActivationView h,
                                WeightView gate_up, WeightView down, float* out, bool accumulate) {
  const int64_t H = hidden, I = inter;
  const int64_t h_elem = h.dtype == WeightDType::kBFloat16 ? 2 : 4;
  if (tuning_.batch_invariant || rows < tuning_.fp8_w8a8_min_rows ||
      gate_up.dtype != WeightDType::kFp8E4M3 || down.dtype != WeightDType::kFp8E4M3 || H <= 0 ||
      I <= 0 || I % 16 != 0 || !FitsInt(rows) || !FitsInt(H) || !FitsInt(2 * I) ||
      (H * h_elem) % 16 != 0 || !Aligned16(h.data)) {
    return false;
  }
  // The ops one by one (ops/mlp_ops.h's SwiGlu): gate_up as GateUpSiluMulBf16 takes it from
  // kBf16GateUpMinRows rows (GemmFp8W8A8 into bf16, as GateUpSiluMulFp8), below as Gemm
  // (GemmFp8W8A8 into fp32); the SiLU-mul's bf16 rows (SiluMulBf16 / SiluMulF32ToBf16), which
  // down's Gemm (GemmFp8W8A8) quantises. Both GEMMs are checked before anything is launched.
  const bool gate_up_bf16 = rows >= kBf16GateUpMinRows;
  const int64_t m4 = RoundUp4(rows);
  W8A8Gemm gu_check, dn;
  auto gu_ready = PrepareW8A8Gemm(rows, 2 * I, H, gate_up, H, nullptr, 2 * I, gate_up_bf16,
                                  /*accumulate=*/false, &gu_check);
  if (!Record(gu_ready.status())) return true;
  if (!*gu_ready) return false;
  auto dn_ready = PrepareW8A8Gemm(rows, H, I, down, I, out, H, /*c_bf16=*/false, accumulate, &dn);
  if (!Record(dn_ready.status())) return true;
  if (!*dn_ready) return false;
  OpTimer timer(this, "SwiGluMlpBf16");
  // bf16: m rounded up to 4 rows (GemmFp8W8A8 writes the padding rows).
  auto gu = AllocateScratch((gate_up_bf16 ? m4 * sizeof(uint16_t) : rows * sizeof(float)) * 2 * I);
  if (!GemmFp8W8A8(rows, 2 * I, H, h, H, gate_up, H, gu->data(), 2 * I, gate_up_bf16,
                   /*accumulate=*/false, "SwiGluMlpBf16/gate_up-w8a8")) {
    Record(absl::InternalError("CudaBackend::SwiGluMlpBf16: gate_up's W8A8 GEMM declined"));
    return true;
  }
  PhaseTimer phase(this, "SwiGluMlpBf16/silu_mul_quantize-down", true);
  auto q = AllocateScratch(m4 * I);
  auto q_scales = AllocateScratch(kernels::Fp8ScaleCols(I) * m4 * sizeof(float));
  kernels::Fp8QuantizeParams qp;
  qp.m = rows, qp.k = I, qp.a = gu->data(), qp.a_bf16 = gate_up_bf16, qp.silu_mul = true;
  qp.lda = 2 * I, qp.q = q->as<uint8_t>(), qp.ldq = I, qp.scales = q_scales->as<float>();
  qp.m_pad = m4;
  Check(kernels::Fp8QuantizeRows(qp, stream_), "kernels::Fp8QuantizeRows(silu_mul)");
  RunW8A8Gemm(dn, q->as<uint8_t>(), q_scales->as<float>());
  return true;
}

}  // namespace deepinfer
