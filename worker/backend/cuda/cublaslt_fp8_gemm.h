// CublasLtFp8Gemm: W8A8 GEMMs on FP8 tensor cores through cuBLASLt's block-scaled FP8 matmul
// (cuBLAS 12.9+, compute capability 9.0 only): the weight's 128 x 128 fp32 block scales
// (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F, the checkpoint's own grid) and the activations
// quantised per row and 128-wide k block (VEC128_32F; kernels/gemm/fp8_quantize.h), fp32
// accumulation, fp32 or bf16 output. DeepSeek-V3's prefill scheme (DeepGEMM's), on Hopper's FP8
// wgmma through NVIDIA's kernels.
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_CUBLASLT_FP8_GEMM_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_CUBLASLT_FP8_GEMM_H_

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/gemm/fp8_block_gemm.h"

namespace deepinfer {

// Row-major d[i, j] (+)= sum_kb qs[kb][i] * ws(j, kb) * sum_{p in kb} q[i, p] * w[j, p], i < m,
// j < n: q the quantised activations [m, ldq] with scales qs [ceil(k / 128)][m]
// (Fp8QuantizeRows' layout, m_pad = m), w an Fp8BlockWeight.
struct Fp8LtGemm {
  int64_t m = 0, n = 0, k = 0;
  const uint8_t* q = nullptr;
  int64_t ldq = 0;
  const float* q_scales = nullptr;
  kernels::Fp8BlockWeight w;
  void* d = nullptr;  // fp32, or bf16 with d_bf16
  int64_t ldd = 0;
  bool d_bf16 = false;
  bool accumulate = false;  // d + the product (beta 1), in d's type
  // With accumulate, where Run times the shape's candidates (NeedsTimingBuffer): their launches
  // write here ([m, ldd] of d's type, d read as the addend) and leave d as it was; null: the
  // shape's candidates wait, the heuristic's first runs.
  void* timing_d = nullptr;
};

// Not thread-safe: one per CudaBackend, used from its stream's thread.
class CublasLtFp8Gemm {
 public:
  // `workspace` (device, workspace_bytes) is cuBLASLt's scratch; the caller keeps it alive and
  // uses it only in order on the streams it passes to Run. time_large_shapes false: every
  // shape runs the heuristic's first algorithm (no timing; run-to-run reproducible bits).
  static absl::StatusOr<std::unique_ptr<CublasLtFp8Gemm>> Create(void* workspace,
                                                                 size_t workspace_bytes,
                                                                 bool time_large_shapes = true);
  ~CublasLtFp8Gemm();
  CublasLtFp8Gemm(const CublasLtFp8Gemm&) = delete;
  CublasLtFp8Gemm& operator=(const CublasLtFp8Gemm&) = delete;

  // Whether `device` is one cuBLASLt runs these scale modes on (compute capability 9.0).
  static bool DeviceSupports(int device);
  // Whether the operands have the layout cuBLASLt needs: m a multiple of 4; k, ldq, w.ldw
  // multiples of 16 and d's row stride of 16 bytes; 16-byte aligned q, w.data, d, scales (and
  // timing_d where set); w.scale_ld == kernels::Fp8ScaleLd(k) (the 2D scales' column stride is
  // implied); a matrix stacked at split_rows takes one GEMM per part unless split_rows is a
  // multiple of 128, and needs split_rows * the output element size a multiple of 16 bytes.
  static bool Takes(const Fp8LtGemm& g);
  // Takes' conditions on sizes and strides only (no pointer looked at).
  static bool TakesLayout(const Fp8LtGemm& g);

  // The GEMM on `stream` with its shape's algorithm. A shape is its size class (SizeClass(m)
  // with the rest of the shape), asked of cuBLASLt's heuristic once, so a shape always runs the
  // same algorithm within a process; where cuBLASLt refuses that algorithm at this m, the
  // heuristic's first for m itself. The algorithm: for classes from kTimedMinRows rows
  // (prefill's GEMMs; with Create's time_large_shapes), the fastest of the heuristic's first
  // kCandidates, timed at the class's first Run outside stream capture (with accumulate: the first
  // that has g.timing_d); each candidate once to warm up, then kTimedRuns times between two events,
  // writing d (timing_d with accumulate), which the final launch overwrites; the stream is
  // synchronised. Otherwise, and while the stream is captured into a CUDA graph (nothing is timed
  // then, nothing synchronises), the heuristic's first. false (nothing launched): Takes is false,
  // or cuBLASLt has no algorithm for the shape (not compute capability 9.0, a cuBLASLt without
  // these scale modes, or a layout its heuristic refuses). Errors: cuBLASLt failures other than the
  // refusals, CUDA event failures while timing.
  absl::StatusOr<bool> Run(const Fp8LtGemm& g, cudaStream_t stream);
  // Whether Run would launch g given pointers Takes accepts (TakesLayout, and an algorithm for
  // each part): asks cuBLASLt's heuristic the first time a shape is seen, launches nothing; g's
  // activation and output pointers may still be null. Errors: cuBLASLt failures.
  absl::StatusOr<bool> Ready(const Fp8LtGemm& g);
  // Whether Run would time g's candidates into g.timing_d: accumulate, and a part's shape
  // (asked by Ready) still untimed.
  bool NeedsTimingBuffer(const Fp8LtGemm& g) const;
  // Why Ready / Run said no for g (for messages): each part's heuristic status.
  std::string Refusal(const Fp8LtGemm& g) const;
  // The shapes asked of the heuristic so far (one per size class and the rest of the shape).
  size_t shapes() const { return shapes_.size(); }

  // The m that stands for m in the heuristic's question: powers of two up to
  // kLargestPowerClass, then multiples of kClassStep. Prefill's expert GEMMs have a new m at
  // nearly every call (each expert's share of the step's tokens), and a heuristic question
  // costs host time while the device waits (RoutedExpertsFp8W8A8 asks before it launches); the
  // classes bound the questions (and the cached descriptors) per shape.
  static int64_t SizeClass(int64_t m);
  static constexpr int64_t kLargestPowerClass = 256;
  static constexpr int64_t kClassStep = 256;
  // Run's timed choice: classes from this many rows, this many candidates, launches timed each.
  static constexpr int64_t kTimedMinRows = 1024;
  static constexpr int kCandidates = 8;
  static constexpr int kTimedRuns = 3;
  // The shapes whose algorithm was chosen by timing so far.
  size_t timed_shapes() const { return timed_shapes_; }

 private:
  // SizeClass(m), n, k, ldq, ldw, ldd, d_bf16, accumulate.
  using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, bool, bool>;
  struct Shape;  // descriptors + algorithm of one shape (null algorithm: none offered)

  CublasLtFp8Gemm(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes,
                  bool time_large_shapes);
  absl::StatusOr<Shape*> ShapeFor(const Fp8LtGemm& g);
  // The heuristic's first `count` algorithms for s's descriptors as they stand (their current
  // m), within the workspace, best first; found false where it offers none. Errors: cuBLASLt
  // failures.
  struct HeuristicPick {
    cublasStatus_t status = CUBLAS_STATUS_NOT_INITIALIZED;
    bool found = false;
    cublasLtMatmulAlgo_t algo;  // the first
    std::vector<cublasLtMatmulAlgo_t> candidates;
  };
  absl::StatusOr<HeuristicPick> AskHeuristic(const Shape& s, int count);
  // One cublasLtMatmul of g into d (g.d, or a timing buffer of its layout; g.d the addend) with
  // s's descriptors (their scale pointers and m set for g).
  cublasStatus_t Matmul(const Shape& s, const Fp8LtGemm& g, const cublasLtMatmulAlgo_t* algo,
                        void* d, cudaStream_t stream);
  // s's algorithm chosen among its untimed candidates by timing them on g (see Run); nothing
  // done while `stream` is being captured.
  absl::Status TimeCandidates(Shape* s, const Fp8LtGemm& g, cudaStream_t stream);
  // g's one or two single-grid parts (Run's split at split_rows); returns how many.
  static int Parts(const Fp8LtGemm& g, Fp8LtGemm parts[2]);
  // One matmul of rows [0, g.n) of g.w (its scale grid from its first row).
  absl::StatusOr<bool> RunOne(const Fp8LtGemm& g, cudaStream_t stream);

  cublasLtHandle_t lt_;
  void* workspace_;
  size_t workspace_bytes_;
  bool time_large_shapes_;
  std::map<Key, std::unique_ptr<Shape>> shapes_;
  size_t timed_shapes_ = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_CUBLASLT_FP8_GEMM_H_
