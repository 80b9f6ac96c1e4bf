// CudaBackend's dense GEMMs: cuBLAS (fp32, bf16, the cuBLASLt tuner at prefill sizes), the small-m
// kernel and the staged GEMV at decode sizes, the norm folded into the staged GEMV
// (AddRmsNormGemms), the GEMM with a bf16 output and the bf16 gate_up with its SiLU-mul.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/activation/elementwise.h"
#include "kernels/gemm/staged_gemv.h"
#include "kernels/moe/expert_activation.h"
#include "kernels/norm/rms_norm.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/op_timer.h"

namespace deepinfer {

std::unique_ptr<DeviceBuffer> CudaBackend::RoundToBf16(const float* a, int64_t elements) {
  auto scratch = AllocateScratch(std::max<int64_t>(elements, 1) * sizeof(uint16_t));
  Check(kernels::RoundF32ToBf16(elements, a, scratch->as<uint16_t>(), stream_),
        "kernels::RoundF32ToBf16");
  return scratch;
}

void CudaBackend::GemmOnCublas(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                               WeightView w, int64_t ldw, float* c, int64_t ldc, bool accumulate) {
  // Row-major C[m,n] = A[m,k]·W[n,k]ᵀ is column-major Cᵀ[n,m] = W·Aᵀ, with W read as the
  // column-major [k,n] matrix it is in memory (hence op T) and A as column-major [k,m] (op N).
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  if (w.dtype == WeightDType::kFloat32) {
    CheckBlas(
        cublasSgemm(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                    static_cast<int>(k), &alpha, static_cast<const float*>(w.data),
                    static_cast<int>(ldw), static_cast<const float*>(a), static_cast<int>(lda),
                    &beta, c, static_cast<int>(ldc)),
        "cublasSgemm");
    return;
  }
  if (GemmOnCublasLt(m, n, k, a, lda, w, ldw, c, ldc, /*c_bf16=*/false, accumulate)) return;
  CheckBlas(
      cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                   static_cast<int>(k), &alpha, w.data, CUDA_R_16BF, static_cast<int>(ldw), a,
                   CUDA_R_16BF, static_cast<int>(lda), &beta, c, CUDA_R_32F, static_cast<int>(ldc),
                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      "cublasGemmEx(bf16)");
}

bool CudaBackend::GemmOnCublasLt(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda,
                                 WeightView w, int64_t ldw, void* c, int64_t ldc, bool c_bf16,
                                 bool accumulate) {
  if (!tuning_.gemm_autotune || m < kGemmAutotuneMinRows || w.dtype != WeightDType::kBFloat16) {
    return false;
  }
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream_, &capture) != cudaSuccess ||
      capture != cudaStreamCaptureStatusNone) {
    return false;
  }
  if (lt_tuner_ == nullptr) {
    auto made = CublasLtGemmTuner::Create(cublas_workspace_, kCublasWorkspaceBytes);
    if (!Record(made.status())) return false;
    lt_tuner_ = std::move(made).value();
  }
  LtGemm g;
  g.m = m, g.n = n, g.k = k, g.a = a, g.lda = lda, g.w = w.data, g.ldw = ldw, g.c = c;
  g.ldc = ldc, g.c_bf16 = c_bf16, g.accumulate = accumulate;
  std::unique_ptr<DeviceBuffer> timing_c;
  if (lt_tuner_->NeedsTiming(g)) {
    timing_c = AllocateScratch(static_cast<size_t>(m) * ldc * (c_bf16 ? 2 : 4));
  }
  auto ran = lt_tuner_->Run(g, stream_, timing_c != nullptr ? timing_c->data() : nullptr);
  if (!Record(ran.status())) return true;  // the error is recorded; nothing else to run
  return *ran;
}

void CudaBackend::BatchInvariantGemm(const kernels::BatchInvariantGemmParams& p) {
  if (!p.w_bf16) {
    Check(kernels::BatchInvariantGemmWarp(p, stream_), "kernels::BatchInvariantGemmWarp");
    return;
  }
  // bf16 weights: an fp32 a is rounded to bf16 in one pass first, at every m (the kernels round
  // it the same way as they read it, so the same bits). Then the pipelined kernel, which takes
  // bf16 a only, wherever it takes the layout; else the tensor-core kernel; else the warp kernel.
  // None of the three choices depends on m, so each shape has one sum order for every m.
  kernels::BatchInvariantGemmParams r = p;
  std::unique_ptr<DeviceBuffer> a16;
  if (!p.a_bf16) {
    // Every element any product reads lies in the first (batch-1)*stride_a + (m-1)*lda + k.
    a16 = RoundToBf16(static_cast<const float*>(p.a),
                      (p.batch - 1) * p.stride_a + (p.m - 1) * p.lda + p.k);
    r.a = a16->data();
    r.a_bf16 = true;
  }
  if (kernels::BatchInvariantGemmPipelinedSupports(r)) {
    Check(kernels::BatchInvariantGemmPipelined(r, stream_), "kernels::BatchInvariantGemmPipelined");
    return;
  }
  if (kernels::BatchInvariantGemmTcSupports(r)) {
    Check(kernels::BatchInvariantGemmTc(r, stream_), "kernels::BatchInvariantGemmTc");
    return;
  }
  Check(kernels::BatchInvariantGemmWarp(p, stream_), "kernels::BatchInvariantGemmWarp");
}

bool CudaBackend::SmallMGemm(const kernels::SmallMGemmParams& p) {
  // Measured on the H200 (small_m_gemm_bench, docs/kernels.md): at m = 1 the kernel beat cuBLAS
  // at every decode shape; at m = 4 only up to n = 3072 (from n = 5632 cuBLAS was faster: each
  // weight chunk re-reads 4 activation rows from L1).
  if ((p.m > 1 && p.n > kSmallMGemmMaxColumnsAboveOneRow) || !kernels::SmallMGemmSupports(p)) {
    return false;
  }
  const bool staged_shape =
      p.batch > 1 ? p.m == 1 && kernels::StagedGemvPreferredBatchedAtOneRow(p.batch, p.n, p.k)
      : p.m == 1  ? kernels::StagedGemvPreferredAtOneRow(p.n, p.k)
      : p.m == 2  ? kernels::StagedGemvPreferredAtTwoRows(p.n, p.k)
                  : false;
  if (p.m <= kStagedGemvMaxRows && staged_shape) {
    kernels::StagedGemvParams s;
    s.m = p.m, s.k = p.k;
    s.prologue = kernels::StagedGemvPrologue::kCopy;
    s.a = p.a, s.a_bf16 = p.a_bf16, s.lda = p.lda;
    s.num_targets = 1;
    s.targets[0] = {p.n, p.w, p.ldw, p.c, p.ldc, p.accumulate};
    s.batch = p.batch, s.stride_a = p.stride_a, s.stride_w = p.stride_w, s.stride_c = p.stride_c;
    if (kernels::StagedGemvSupports(s)) {
      Check(kernels::StagedGemvBf16(s, stream_), "kernels::StagedGemvBf16");
      return true;
    }
  }
  Check(kernels::SmallMGemmBf16(p, stream_), "kernels::SmallMGemmBf16");
  return true;
}

void CudaBackend::Gemm(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda, WeightView w,
                       int64_t ldw, float* c, int64_t ldc, bool accumulate) {
  OpTimer timer(this, "Gemm");
  if (m <= 0 || n <= 0) return;
  if (!FitsInt(m) || !FitsInt(n) || !FitsInt(k) || !FitsInt(lda) || !FitsInt(ldw) ||
      !FitsInt(ldc)) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("CudaBackend::Gemm: sizes beyond int range (m ", m, " n ", n, " k ", k, ")")));
    return;
  }
  const bool a_bf16 = a.dtype == WeightDType::kBFloat16;
  if (w.dtype == WeightDType::kFloat32) {
    if (a_bf16) {
      Record(absl::InvalidArgumentError(
          "CudaBackend::Gemm: a bf16 activation operand needs bf16 weights, these are fp32"));
      return;
    }
    if (tuning_.batch_invariant) {
      kernels::BatchInvariantGemmParams p;
      p.m = m, p.n = n, p.k = k, p.a = a.data, p.lda = lda;
      p.w = w.data, p.w_bf16 = false, p.ldw = ldw, p.c = c, p.ldc = ldc;
      p.accumulate = accumulate;
      BatchInvariantGemm(p);
      return;
    }
    GemmOnCublas(m, n, k, a.data, lda, w, ldw, c, ldc, accumulate);
    return;
  }
  if (w.dtype == WeightDType::kFp8E4M3) {
    GemmFp8(m, n, k, a, lda, w, ldw, c, ldc, accumulate);
    return;
  }
  if (tuning_.batch_invariant) {
    kernels::BatchInvariantGemmParams p;
    p.m = m, p.n = n, p.k = k, p.a = a.data, p.a_bf16 = a_bf16, p.lda = lda;
    p.w = w.data, p.ldw = ldw, p.c = c, p.ldc = ldc, p.accumulate = accumulate;
    BatchInvariantGemm(p);
    return;
  }
  kernels::SmallMGemmParams p;
  p.m = m, p.n = n, p.k = k, p.a = a.data, p.a_bf16 = a_bf16, p.lda = lda;
  p.w = static_cast<const uint16_t*>(w.data), p.ldw = ldw, p.c = c, p.ldc = ldc;
  p.accumulate = accumulate;
  if (SmallMGemm(p)) return;
  if (a_bf16) {
    GemmOnCublas(m, n, k, a.data, lda, w, ldw, c, ldc, accumulate);
    return;
  }
  // Rounded with a's row stride kept, so lda stays valid (the gaps are rounded too, unused).
  auto a16 = RoundToBf16(static_cast<const float*>(a.data), (m - 1) * lda + k);
  GemmOnCublas(m, n, k, a16->data(), lda, w, ldw, c, ldc, accumulate);
}

void CudaBackend::BatchedGemm(int64_t batch, int64_t m, int64_t n, int64_t k, ActivationView a,
                              int64_t lda, int64_t stride_a, WeightView w, int64_t ldw,
                              int64_t stride_w, float* c, int64_t ldc, int64_t stride_c) {
  OpTimer timer(this, "BatchedGemm");
  if (batch <= 0 || m <= 0 || n <= 0) return;
  if (!FitsInt(batch) || !FitsInt(m) || !FitsInt(n) || !FitsInt(k) || !FitsInt(lda) ||
      !FitsInt(ldw) || !FitsInt(ldc)) {
    Record(absl::InvalidArgumentError(absl::StrCat(
        "CudaBackend::BatchedGemm: sizes beyond int range (batch ", batch, " m ", m, ")")));
    return;
  }
  const float alpha = 1.0f, beta = 0.0f;
  if (w.dtype == WeightDType::kFp8E4M3) {
    Record(absl::InvalidArgumentError("CudaBackend::BatchedGemm: FP8 weights are not taken"));
    return;
  }
  const bool a_bf16 = a.dtype == WeightDType::kBFloat16;
  if (a_bf16 && w.dtype != WeightDType::kBFloat16) {
    Record(
        absl::InvalidArgumentError("CudaBackend::BatchedGemm: a bf16 operand needs bf16 weights"));
    return;
  }
  if (tuning_.batch_invariant) {
    kernels::BatchInvariantGemmParams p;
    p.m = m, p.n = n, p.k = k, p.a = a.data, p.a_bf16 = a_bf16, p.lda = lda;
    p.w = w.data, p.w_bf16 = w.dtype == WeightDType::kBFloat16, p.ldw = ldw, p.c = c, p.ldc = ldc;
    p.batch = batch, p.stride_a = stride_a, p.stride_w = stride_w, p.stride_c = stride_c;
    BatchInvariantGemm(p);
    return;
  }
  if (w.dtype == WeightDType::kFloat32) {
    CheckBlas(cublasSgemmStridedBatched(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                                        static_cast<int>(m), static_cast<int>(k), &alpha,
                                        static_cast<const float*>(w.data), static_cast<int>(ldw),
                                        stride_w, static_cast<const float*>(a.data),
                                        static_cast<int>(lda), stride_a, &beta, c,
                                        static_cast<int>(ldc), stride_c, static_cast<int>(batch)),
              "cublasSgemmStridedBatched");
    return;
  }
  kernels::SmallMGemmParams p;
  p.m = m, p.n = n, p.k = k, p.a = a.data, p.a_bf16 = a_bf16, p.lda = lda;
  p.w = static_cast<const uint16_t*>(w.data), p.ldw = ldw, p.c = c, p.ldc = ldc;
  p.batch = batch, p.stride_a = stride_a, p.stride_w = stride_w, p.stride_c = stride_c;
  if (SmallMGemm(p)) return;
  // A bf16 a goes as it is; an fp32 a is rounded first. Every element any product reads lies in
  // the first (batch-1)*stride_a + (m-1)*lda + k.
  std::unique_ptr<DeviceBuffer> a16;
  if (!a_bf16) {
    a16 =
        RoundToBf16(static_cast<const float*>(a.data), (batch - 1) * stride_a + (m - 1) * lda + k);
  }
  CheckBlas(cublasGemmStridedBatchedEx(
                cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                static_cast<int>(k), &alpha, w.data, CUDA_R_16BF, static_cast<int>(ldw), stride_w,
                a_bf16 ? a.data : a16->data(), CUDA_R_16BF, static_cast<int>(lda), stride_a, &beta,
                c, CUDA_R_32F, static_cast<int>(ldc), stride_c, static_cast<int>(batch),
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx(bf16)");
}

void CudaBackend::GroupedGemm(const std::vector<int64_t>& offsets,
                              const std::vector<WeightView>& weights, int64_t n, int64_t k,
                              const float* a, float* c) {
  OpTimer timer(this, "GroupedGemm");
  if (offsets.size() != weights.size() + 1) {
    Record(absl::InvalidArgumentError("CudaBackend::GroupedGemm: offsets.size() != groups + 1"));
    return;
  }
  const int64_t rows = offsets.back() - offsets.front();
  if (rows <= 0 || n <= 0) return;
  if (!FitsInt(rows) || !FitsInt(n) || !FitsInt(k)) {
    Record(absl::InvalidArgumentError(absl::StrCat(
        "CudaBackend::GroupedGemm: sizes beyond int range (rows ", rows, " n ", n, ")")));
    return;
  }
  if (tuning_.batch_invariant) {
    for (size_t g = 0; g < weights.size(); ++g) {
      const int64_t group_rows = offsets[g + 1] - offsets[g];
      if (group_rows == 0) continue;
      Gemm(group_rows, n, k, a + offsets[g] * k, k, weights[g], k, c + offsets[g] * n, n, false);
    }
    return;
  }
  bool any_bf16 = false;
  for (const WeightView& w : weights) any_bf16 |= w.dtype == WeightDType::kBFloat16;
  std::unique_ptr<DeviceBuffer> a16;
  if (any_bf16) a16 = RoundToBf16(a + offsets.front() * k, rows * k);
  for (size_t g = 0; g < weights.size(); ++g) {
    const int64_t group_rows = offsets[g + 1] - offsets[g];
    if (group_rows == 0) continue;
    if (weights[g].dtype == WeightDType::kFp8E4M3) {
      GemmFp8(group_rows, n, k, a + offsets[g] * k, k, weights[g], k, c + offsets[g] * n, n, false);
      continue;
    }
    const void* ag =
        weights[g].dtype == WeightDType::kFloat32
            ? static_cast<const void*>(a + offsets[g] * k)
            : static_cast<const void*>(a16->as<uint16_t>() + (offsets[g] - offsets.front()) * k);
    GemmOnCublas(group_rows, n, k, ag, k, weights[g], k, c + offsets[g] * n, n, false);
  }
}

void CudaBackend::AddRmsNormGemms(int64_t rows, int64_t dim, float* x, const float* y,
                                  const float* weight, float eps, float* normed,
                                  uint16_t* normed_bf16, const std::vector<NormedGemm>& gemms) {
  if (tuning_.batch_invariant) {
    Backend::AddRmsNormGemms(rows, dim, x, y, weight, eps, normed, normed_bf16, gemms);
    return;
  }
  OpTimer timer(this, "AddRmsNormGemms");
  // The norm fused at one row only: at 2 and 4 rows the prologue's block reductions in every
  // block measured slower than AddRmsNorm + the GEMMs (small_m_gemm_bench: 4 rows 17.18 vs
  // 10.74 us; 2 rows 10.14 vs 9.56; 1 row: 8.28 vs 8.79 us). At two rows: AddRmsNorm, then one
  // staged launch for all targets (q + kv_a: 6.97 vs 10.01 us for two small-m launches).
  static_assert(kStagedGemvMaxRows == 2, "the staged AddRmsNormGemms takes one or two rows");
  bool staged =
      (rows == 1 || (rows == 2 && normed_bf16 != nullptr &&
                     gemms.size() <= static_cast<size_t>(kernels::kStagedGemvMaxTargets)));
  // All targets bf16, or (at one row) all FP8: the staged GEMV's FP8 weights.
  const bool fp8 = !gemms.empty() && gemms.front().w.dtype == WeightDType::kFp8E4M3;
  staged = staged && (!fp8 || rows == 1);
  int64_t columns = 0;
  for (size_t t = 0; staged && t < gemms.size(); ++t) {
    staged = gemms[t].w.dtype == (fp8 ? WeightDType::kFp8E4M3 : WeightDType::kBFloat16);
    columns += gemms[t].n;
  }
  // The launches: at one row up to kStagedGemvMaxTargets GEMMs each (x += y in the first only;
  // the later ones norm the updated x), at two rows one.
  std::vector<kernels::StagedGemvParams> launches;
  for (size_t first = 0; staged && first < gemms.size(); first += kernels::kStagedGemvMaxTargets) {
    kernels::StagedGemvParams p;
    p.m = rows, p.k = dim;
    p.prologue = kernels::StagedGemvPrologue::kAddRmsNorm;
    p.x = x, p.y = first == 0 ? y : nullptr, p.norm_weight = weight, p.eps = eps;
    p.counter = staged_gemv_counter_;
    p.fp8 = fp8;
    if (rows == 2) {
      p.prologue = kernels::StagedGemvPrologue::kCopy;
      p.a = normed_bf16, p.a_bf16 = true, p.lda = dim;
    }
    const size_t end =
        std::min(gemms.size(), first + static_cast<size_t>(kernels::kStagedGemvMaxTargets));
    p.num_targets = static_cast<int>(end - first);
    for (size_t t = first; t < end; ++t) {
      const NormedGemm& g = gemms[t];
      kernels::StagedGemvTarget& target = p.targets[t - first];
      target = {g.n, static_cast<const uint16_t*>(g.w.data), g.ldw, g.c, g.ldc, false};
      if (fp8) {
        target.w = nullptr;
        target.w8 = static_cast<const uint8_t*>(g.w.data);
        target.scales = g.w.fp8.scales;
        target.scale_ld = g.w.fp8.scale_ld;
        target.split_rows = g.w.fp8.split_rows;
      }
    }
    staged = kernels::StagedGemvSupports(p);
    launches.push_back(p);
  }
  if (staged && rows == 2) staged = kernels::StagedGemvPreferredAtTwoRows(columns, dim);
  if (staged && !launches.empty()) {
    if (rows == 2) {
      Check(kernels::AddRmsNormF32(rows, dim, x, y, weight, eps, nullptr, normed_bf16, stream_),
            "kernels::AddRmsNormF32");
    }
    PhaseTimer phase(this, "AddRmsNormGemms/staged-fp8", fp8);
    for (const kernels::StagedGemvParams& p : launches) {
      Check(kernels::StagedGemvBf16(p, stream_), "kernels::StagedGemvBf16");
    }
    return;
  }
  if (AddRmsNormGemmsW8A8(rows, dim, x, y, weight, eps, normed, normed_bf16, gemms)) return;
  Backend::AddRmsNormGemms(rows, dim, x, y, weight, eps, normed, normed_bf16, gemms);
}

bool CudaBackend::GemmToBf16(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda,
                             WeightView w, int64_t ldw, uint16_t* c, int64_t ldc) {
  if (tuning_.batch_invariant || m < kBf16GateUpMinRows || n <= 0 ||
      w.dtype != WeightDType::kBFloat16 || !FitsInt(m) || !FitsInt(n) || !FitsInt(k) ||
      !FitsInt(lda) || !FitsInt(ldw) || !FitsInt(ldc)) {
    return false;
  }
  OpTimer timer(this, "GemmToBf16");
  std::unique_ptr<DeviceBuffer> a16;
  const void* a_bf16 = a.data;
  if (a.dtype != WeightDType::kBFloat16) {
    a16 = RoundToBf16(static_cast<const float*>(a.data), (m - 1) * lda + k);
    a_bf16 = a16->data();
  }
  // GemmOnCublas's layout (column-major Cᵀ = W·Aᵀ), with a bf16 C.
  if (!GemmOnCublasLt(m, n, k, a_bf16, lda, w, ldw, c, ldc, /*c_bf16=*/true,
                      /*accumulate=*/false)) {
    const float alpha = 1.0f, beta = 0.0f;
    CheckBlas(
        cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                     static_cast<int>(k), &alpha, w.data, CUDA_R_16BF, static_cast<int>(ldw),
                     a_bf16, CUDA_R_16BF, static_cast<int>(lda), &beta, c, CUDA_R_16BF,
                     static_cast<int>(ldc), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx(bf16 out)");
  }
  return true;
}

bool CudaBackend::BatchedGemmToBf16(int64_t batch, int64_t m, int64_t n, int64_t k,
                                    ActivationView a, int64_t lda, int64_t stride_a, WeightView w,
                                    int64_t ldw, int64_t stride_w, uint16_t* c, int64_t ldc,
                                    int64_t stride_c) {
  if (tuning_.batch_invariant || batch <= 0 || m < kBf16GateUpMinRows || n <= 0 ||
      w.dtype != WeightDType::kBFloat16 || !FitsInt(batch) || !FitsInt(m) || !FitsInt(n) ||
      !FitsInt(k) || !FitsInt(lda) || !FitsInt(ldw) || !FitsInt(ldc)) {
    return false;
  }
  OpTimer timer(this, "BatchedGemmToBf16");
  // An fp32 a is rounded first (as BatchedGemm rounds it): every element any product reads lies
  // in the first (batch-1)*stride_a + (m-1)*lda + k.
  std::unique_ptr<DeviceBuffer> a16;
  if (a.dtype != WeightDType::kBFloat16) {
    a16 =
        RoundToBf16(static_cast<const float*>(a.data), (batch - 1) * stride_a + (m - 1) * lda + k);
  }
  const float alpha = 1.0f, beta = 0.0f;
  CheckBlas(cublasGemmStridedBatchedEx(
                cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                static_cast<int>(k), &alpha, w.data, CUDA_R_16BF, static_cast<int>(ldw), stride_w,
                a16 != nullptr ? a16->data() : a.data, CUDA_R_16BF, static_cast<int>(lda), stride_a,
                &beta, c, CUDA_R_16BF, static_cast<int>(ldc), stride_c, static_cast<int>(batch),
                CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "cublasGemmStridedBatchedEx(bf16 out)");
  return true;
}

bool CudaBackend::GateUpSiluMulBf16(int64_t rows, int64_t inter, int64_t k, ActivationView a,
                                    int64_t lda, WeightView w, int64_t ldw, float swiglu_limit,
                                    uint16_t* out) {
  if (tuning_.batch_invariant) return false;
  if (w.dtype == WeightDType::kFp8E4M3 && swiglu_limit > 0.0f) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("CudaBackend::GateUpSiluMulBf16: FP8 weights with swiglu_limit ", swiglu_limit,
                     " (the clamped SwiGLU is taken with bf16 weights only)")));
    return false;
  }
  if (w.dtype == WeightDType::kFp8E4M3 && rows >= kBf16GateUpMinRows && inter > 0) {
    return GateUpSiluMulFp8(rows, inter, k, a, lda, w, ldw, out);
  }
  if (rows < kBf16GateUpMinRows || w.dtype != WeightDType::kBFloat16 || inter <= 0 ||
      !FitsInt(rows) || !FitsInt(2 * inter) || !FitsInt(k) || !FitsInt(lda) || !FitsInt(ldw)) {
    return false;
  }
  OpTimer timer(this, "GateUpSiluMulBf16");
  // The gate / up values in bf16 (GemmToBf16 takes every shape the checks above let through; the
  // outer timer keeps the op's time under this name).
  auto gate_up = AllocateScratch(static_cast<size_t>(rows) * 2 * inter * sizeof(uint16_t));
  if (!GemmToBf16(rows, 2 * inter, k, a, lda, w, ldw, gate_up->as<uint16_t>(), 2 * inter)) {
    return false;
  }
  Check(kernels::SiluMulBf16(rows, inter, gate_up->as<uint16_t>(), out, stream_,
                             /*device_rows=*/nullptr, swiglu_limit),
        "kernels::SiluMulBf16");
  return true;
}

}  // namespace deepinfer
