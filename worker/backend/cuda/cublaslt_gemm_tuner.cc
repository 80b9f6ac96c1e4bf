#include "worker/backend/cuda/cublaslt_gemm_tuner.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

absl::Status LtStatus(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": cuBLAS status ", static_cast<int>(s)));
}

absl::Status CudaOk(cudaError_t e, const char* call) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": ", cudaGetErrorString(e)));
}

}  // namespace

// The problem in cuBLASLt's column-major terms: Cᵀ[n, m] = W·Aᵀ, with W read as the
// column-major [k, n] matrix it is in memory (op T) and A as column-major [k, m] (op N), as
// CudaBackend::GemmOnCublas does it.
struct CublasLtGemmTuner::Shape {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, a = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo;
  ~Shape() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (w != nullptr) cublasLtMatrixLayoutDestroy(w);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

absl::StatusOr<std::unique_ptr<CublasLtGemmTuner>> CublasLtGemmTuner::Create(
    void* workspace, size_t workspace_bytes) {
  cublasLtHandle_t lt = nullptr;
  absl::Status st = LtStatus(cublasLtCreate(&lt), "cublasLtCreate");
  if (!st.ok()) return st;
  return std::unique_ptr<CublasLtGemmTuner>(new CublasLtGemmTuner(lt, workspace, workspace_bytes));
}

CublasLtGemmTuner::CublasLtGemmTuner(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes)
    : lt_(lt), workspace_(workspace), workspace_bytes_(workspace_bytes) {}

CublasLtGemmTuner::~CublasLtGemmTuner() {
  shapes_.clear();
  cublasLtDestroy(lt_);
}

CublasLtGemmTuner::Key CublasLtGemmTuner::KeyOf(const LtGemm& g, int64_t m) {
  return Key{m, g.n, g.k, g.lda, g.ldw, g.ldc, g.c_bf16, g.accumulate};
}

bool CublasLtGemmTuner::NeedsTiming(const LtGemm& g) const {
  if (!g.accumulate || shapes_.count(KeyOf(g, g.m)) > 0) return false;
  const int64_t bucket = (g.m + kRowBucket - 1) / kRowBucket * kRowBucket;
  return buckets_.count(KeyOf(g, bucket)) == 0;
}

absl::StatusOr<std::unique_ptr<CublasLtGemmTuner::Shape>> CublasLtGemmTuner::Describe(
    const LtGemm& g) const {
  auto s = std::make_unique<Shape>();
  const cudaDataType_t c_type = g.c_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasOperation_t op_w = CUBLAS_OP_T, op_a = CUBLAS_OP_N;
  absl::Status st = LtStatus(cublasLtMatmulDescCreate(&s->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                             "cublasLtMatmulDescCreate");
  if (st.ok()) {
    st = LtStatus(
        cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSA, &op_w, sizeof(op_w)),
        "cublasLtMatmulDescSetAttribute(TRANSA)");
  }
  if (st.ok()) {
    st = LtStatus(
        cublasLtMatmulDescSetAttribute(s->op, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof(op_a)),
        "cublasLtMatmulDescSetAttribute(TRANSB)");
  }
  if (st.ok()) {
    st = LtStatus(cublasLtMatrixLayoutCreate(&s->w, CUDA_R_16BF, g.k, g.n, g.ldw),
                  "cublasLtMatrixLayoutCreate(W)");
  }
  if (st.ok()) {
    st = LtStatus(cublasLtMatrixLayoutCreate(&s->a, CUDA_R_16BF, g.k, g.m, g.lda),
                  "cublasLtMatrixLayoutCreate(A)");
  }
  if (st.ok()) {
    st = LtStatus(cublasLtMatrixLayoutCreate(&s->c, c_type, g.n, g.m, g.ldc),
                  "cublasLtMatrixLayoutCreate(C)");
  }
  if (!st.ok()) return st;
  return s;
}

absl::Status CublasLtGemmTuner::Launch(const Shape& s, const cublasLtMatmulAlgo_t& algo,
                                       const LtGemm& g, void* c, cudaStream_t stream) const {
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  return LtStatus(cublasLtMatmul(lt_, s.op, &alpha, g.w, s.w, g.a, s.a, &beta, c, s.c, c, s.c,
                                 &algo, workspace_, workspace_bytes_, stream),
                  "cublasLtMatmul");
}

absl::StatusOr<bool> CublasLtGemmTuner::Run(const LtGemm& g, cudaStream_t stream, void* timing_c) {
  const Key key = KeyOf(g, g.m);
  auto found = shapes_.find(key);
  if (found != shapes_.end()) {
    absl::Status st = Launch(*found->second, found->second->algo, g, g.c, stream);
    if (!st.ok()) return st;
    return true;
  }
  auto described = Describe(g);
  if (!described.ok()) return described.status();
  std::unique_ptr<Shape> s = std::move(described).value();

  // The bucket's algorithm, if one was timed and cuBLASLt accepts it for this m.
  const int64_t bucket_m = (g.m + kRowBucket - 1) / kRowBucket * kRowBucket;
  const Key bucket = KeyOf(g, bucket_m);
  auto timed = buckets_.find(bucket);
  if (timed != buckets_.end()) {
    cublasLtMatmulHeuristicResult_t check;
    if (cublasLtMatmulAlgoCheck(lt_, s->op, s->w, s->a, s->c, s->c, &timed->second, &check) ==
            CUBLAS_STATUS_SUCCESS &&
        check.workspaceSize <= workspace_bytes_) {
      s->algo = timed->second;
      absl::Status st = Launch(*s, s->algo, g, g.c, stream);
      if (!st.ok()) return st;
      shapes_.emplace(key, std::move(s));
      return true;
    }
  }

  // Without accumulate c is no input, and the final call overwrites what timing wrote there.
  if (timing_c == nullptr && !g.accumulate) timing_c = g.c;
  if (timing_c == nullptr) {
    // NeedsTiming said no (the bucket was timed) but its algorithm does not fit this m: take
    // cublasGemmEx this time rather than time without a buffer.
    if (timed != buckets_.end()) return false;
    return absl::InvalidArgumentError("CublasLtGemmTuner::Run: a new shape needs timing_c");
  }
  cublasLtMatmulPreference_t pref = nullptr;
  absl::Status st =
      LtStatus(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  if (st.ok()) {
    st = LtStatus(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes_, sizeof(workspace_bytes_)),
        "cublasLtMatmulPreferenceSetAttribute");
  }
  cublasLtMatmulHeuristicResult_t candidates[kCandidates];
  int num_candidates = 0;
  if (st.ok()) {
    st = LtStatus(cublasLtMatmulAlgoGetHeuristic(lt_, s->op, s->w, s->a, s->c, s->c, pref,
                                                 kCandidates, candidates, &num_candidates),
                  "cublasLtMatmulAlgoGetHeuristic");
  }
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  if (!st.ok() || num_candidates == 0) {
    // NOT_SUPPORTED: no algorithm for this problem; the caller takes cublasGemmEx.
    return false;
  }
  cudaEvent_t start = nullptr, stop = nullptr;
  st = CudaOk(cudaEventCreate(&start), "cudaEventCreate");
  if (st.ok()) st = CudaOk(cudaEventCreate(&stop), "cudaEventCreate");
  float best_ms = 0.0f;
  int best = -1;
  for (int i = 0; st.ok() && i < num_candidates; ++i) {
    if (candidates[i].state != CUBLAS_STATUS_SUCCESS ||
        candidates[i].workspaceSize > workspace_bytes_) {
      continue;
    }
    // A candidate that refuses to launch is skipped, not an error.
    if (!Launch(*s, candidates[i].algo, g, timing_c, stream).ok()) continue;
    st = CudaOk(cudaEventRecord(start, stream), "cudaEventRecord");
    for (int r = 0; st.ok() && r < 3; ++r) st = Launch(*s, candidates[i].algo, g, timing_c, stream);
    if (st.ok()) st = CudaOk(cudaEventRecord(stop, stream), "cudaEventRecord");
    if (st.ok()) st = CudaOk(cudaEventSynchronize(stop), "cudaEventSynchronize");
    float ms = 0.0f;
    if (st.ok()) st = CudaOk(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
    if (st.ok() && (best < 0 || ms < best_ms)) best = i, best_ms = ms;
  }
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  if (!st.ok()) return st;
  if (best < 0) return false;
  s->algo = candidates[best].algo;
  buckets_[bucket] = s->algo;
  st = Launch(*s, s->algo, g, g.c, stream);
  if (!st.ok()) return st;
  shapes_.emplace(key, std::move(s));
  return true;
}

}  // namespace deepinfer
