// CublasLtGemmTuner: the prefill's large bf16 GEMMs through cuBLASLt with an algorithm chosen per
// shape by timing. cublasGemmEx's default algorithm was 5-25% slower than the best of cuBLASLt's
// heuristic candidates for most of the Moonlight shapes at 32768 rows on the H200
// (gemm_shapes_bench, docs/cuda/prefill.md), and no single candidate was best for all shapes.
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_CUBLASLT_GEMM_TUNER_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_CUBLASLT_GEMM_TUNER_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/statusor.h"

namespace deepinfer {

// Row-major C[m, n] = A[m, k] · W[n, k]ᵀ (+ C with accumulate): A and W bf16, C fp32 or bf16
// (c_bf16), fp32 accumulation. Strides in elements.
struct LtGemm {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* w = nullptr;
  int64_t ldw = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  bool c_bf16 = false;
  bool accumulate = false;
};

// Not thread-safe: one per CudaBackend, used from its stream's thread.
class CublasLtGemmTuner {
 public:
  // Candidates timed per shape (cublasLtMatmulAlgoGetHeuristic's first ones).
  static constexpr int kCandidates = 8;
  // Shapes whose m rounds up to the same multiple of kRowBucket share the choice of the first
  // one timed (checked with cublasLtMatmulAlgoCheck for each new m; timed anew if it fails).
  static constexpr int64_t kRowBucket = 2048;

  // `workspace` (device, workspace_bytes) is cuBLASLt's scratch; the caller keeps it alive and
  // uses it only in order on the streams it passes here.
  static absl::StatusOr<std::unique_ptr<CublasLtGemmTuner>> Create(void* workspace,
                                                                   size_t workspace_bytes);
  ~CublasLtGemmTuner();
  CublasLtGemmTuner(const CublasLtGemmTuner&) = delete;
  CublasLtGemmTuner& operator=(const CublasLtGemmTuner&) = delete;

  // Whether Run needs timing_c for g: with accumulate, where its bucket has not been timed.
  bool NeedsTiming(const LtGemm& g) const;
  // One cublasLtMatmul on `stream` with the shape's algorithm. The first call of a bucket first
  // times every candidate (each once to warm up, then 3 times between two events, synchronising
  // the stream) writing `timing_c` (a [m, ldc] buffer of C's type, not c; null without
  // accumulate: then c itself, which the final call overwrites), and keeps the fastest; later calls
  // reuse it, so a shape always runs the same algorithm (the same bits) within a process. false
  // (nothing launched): cuBLASLt offers no algorithm for this shape, or the bucket's algorithm does
  // not fit this m and timing_c is null. Errors: cuBLASLt or CUDA failures while choosing or
  // launching, a null timing_c where NeedsTiming.
  absl::StatusOr<bool> Run(const LtGemm& g, cudaStream_t stream, void* timing_c);
  // Shapes (exact m) with an algorithm, and how many buckets were timed.
  size_t shapes() const { return shapes_.size(); }
  size_t timed_buckets() const { return buckets_.size(); }

 private:
  // m, n, k, lda, ldw, ldc, c_bf16, accumulate.
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;
  struct Shape;  // descriptors + algorithm of one exact shape

  CublasLtGemmTuner(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes);
  static Key KeyOf(const LtGemm& g, int64_t m);
  absl::StatusOr<std::unique_ptr<Shape>> Describe(const LtGemm& g) const;
  absl::Status Launch(const Shape& s, const cublasLtMatmulAlgo_t& algo, const LtGemm& g, void* c,
                      cudaStream_t stream) const;

  cublasLtHandle_t lt_;
  void* workspace_;
  size_t workspace_bytes_;
  std::map<Key, std::unique_ptr<Shape>> shapes_;
  std::map<Key, cublasLtMatmulAlgo_t> buckets_;  // key with m = the bucket's rounded m
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_CUBLASLT_GEMM_TUNER_H_
