// CudaBackend's W8A8 ops that quantise an activation once for the cuBLASLt FP8 GEMMs reading it
// (CudaTuning::fp8_w8a8_min_rows rows on, compute capability 9.0): AddRmsNormGemms' targets
// on one quantisation written by the norm's own pass (kernels::AddRmsNormFp8).
#include <cstdint>
#include <memory>
#include <vector>

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

}  // namespace deepinfer
