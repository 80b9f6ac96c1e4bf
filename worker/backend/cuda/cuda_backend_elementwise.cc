// CudaBackend's elementwise and row ops: norms, the residual add, SiLU-mul, the dummy weight
// fill, row gather and scatter-add.
#include <cstdint>

#include "kernels/activation/elementwise.h"
#include "kernels/embedding/rows.h"
#include "kernels/fill/dummy_fill.h"
#include "kernels/norm/rms_norm.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/op_timer.h"

namespace deepinfer {

void CudaBackend::RmsNorm(int64_t rows, int64_t dim, const float* x, int64_t ldx,
                          const float* weight, float eps, float* out, int64_t ldout) {
  OpTimer timer(this, "RmsNorm");
  Check(kernels::RmsNormF32(rows, dim, x, ldx, weight, eps, out, ldout, stream_),
        "kernels::RmsNormF32");
}

void CudaBackend::AddRmsNorm(int64_t rows, int64_t dim, float* x, const float* y,
                             const float* weight, float eps, float* out, uint16_t* out_bf16) {
  OpTimer timer(this, "AddRmsNorm");
  Check(kernels::AddRmsNormF32(rows, dim, x, y, weight, eps, out, out_bf16, stream_),
        "kernels::AddRmsNormF32");
}

void CudaBackend::RmsNormBf16(int64_t rows, int64_t dim, const float* x, int64_t ldx,
                              const float* weight, float eps, uint16_t* out_bf16) {
  OpTimer timer(this, "RmsNormBf16");
  Check(kernels::StridedRmsNormF32(rows, dim, x, ldx, weight, eps, nullptr, out_bf16, stream_),
        "kernels::StridedRmsNormF32");
}

void CudaBackend::Add(int64_t n, const float* a, const float* b, float* out) {
  OpTimer timer(this, "Add");
  Check(kernels::AddF32(n, a, b, out, stream_), "kernels::AddF32");
}

void CudaBackend::SiluMul(int64_t rows, int64_t inter, const float* x, float* out) {
  OpTimer timer(this, "SiluMul");
  Check(kernels::SiluMulF32(rows, inter, x, out, stream_), "kernels::SiluMulF32");
}

void CudaBackend::FillDummy(const DummyFill& fill, int64_t n, WeightDType dtype, void* out) {
  OpTimer timer(this, "FillDummy");
  if (dtype == WeightDType::kBFloat16) {
    Check(kernels::FillDummyBf16(fill, n, static_cast<uint16_t*>(out), stream_),
          "kernels::FillDummyBf16");
  } else {
    Check(kernels::FillDummyF32(fill, n, static_cast<float*>(out), stream_),
          "kernels::FillDummyF32");
  }
}

void CudaBackend::SiluMulBf16(int64_t rows, int64_t inter, const float* x, uint16_t* out) {
  OpTimer timer(this, "SiluMulBf16");
  Check(kernels::SiluMulF32ToBf16(rows, inter, x, out, stream_), "kernels::SiluMulF32ToBf16");
}

void CudaBackend::GatherRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                             float* dst) {
  OpTimer timer(this, "GatherRows");
  Check(kernels::GatherRowsF32(rows, dim, src, idx, dst, stream_), "kernels::GatherRowsF32");
}

void CudaBackend::ScatterAddRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                                 const float* weight, float* dst) {
  OpTimer timer(this, "ScatterAddRows");
  Check(kernels::ScatterAddRowsF32(rows, dim, src, idx, weight, dst, stream_),
        "kernels::ScatterAddRowsF32");
}

}  // namespace deepinfer
