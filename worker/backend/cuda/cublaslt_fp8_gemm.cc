#include "worker/backend/cuda/cublaslt_fp8_gemm.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

absl::Status LtStatus(cublasStatus_t s, const char* call) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(call, ": cuBLAS status ", static_cast<int>(s)));
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

// The problem in cuBLASLt's column-major terms, as CudaBackend::GemmOnCublas has it: Dᵀ[n, m] =
// W·Qᵀ with W read as the column-major [k, n] matrix it is in memory (op T: cuBLASLt's "A", the
// 128 x 128 block scales) and Q as column-major [k, m] (op N: "B", the 1 x 128 scales). FP8 needs
// this "TN" form on Hopper.
struct CublasLtFp8Gemm::Shape {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t w = nullptr, q = nullptr, d = nullptr;
  bool has_algo = false;
  cublasStatus_t heuristic_status = CUBLAS_STATUS_NOT_INITIALIZED;
  cublasLtMatmulAlgo_t algo;
  // The candidates Run times at the shape's first launch outside capture (empty: none to time).
  std::vector<cublasLtMatmulAlgo_t> untimed;
  ~Shape() {
    if (d != nullptr) cublasLtMatrixLayoutDestroy(d);
    if (q != nullptr) cublasLtMatrixLayoutDestroy(q);
    if (w != nullptr) cublasLtMatrixLayoutDestroy(w);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

absl::StatusOr<std::unique_ptr<CublasLtFp8Gemm>> CublasLtFp8Gemm::Create(void* workspace,
                                                                         size_t workspace_bytes,
                                                                         bool time_large_shapes) {
  cublasLtHandle_t lt = nullptr;
  absl::Status st = LtStatus(cublasLtCreate(&lt), "cublasLtCreate");
  if (!st.ok()) return st;
  return std::unique_ptr<CublasLtFp8Gemm>(
      new CublasLtFp8Gemm(lt, workspace, workspace_bytes, time_large_shapes));
}

CublasLtFp8Gemm::CublasLtFp8Gemm(cublasLtHandle_t lt, void* workspace, size_t workspace_bytes,
                                 bool time_large_shapes)
    : lt_(lt),
      workspace_(workspace),
      workspace_bytes_(workspace_bytes),
      time_large_shapes_(time_large_shapes) {}

CublasLtFp8Gemm::~CublasLtFp8Gemm() {
  shapes_.clear();
  cublasLtDestroy(lt_);
}

bool CublasLtFp8Gemm::DeviceSupports(int device) {
  int major = 0, minor = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) == cudaSuccess &&
         major == 9 && minor == 0;
}

int64_t CublasLtFp8Gemm::SizeClass(int64_t m) {
  if (m <= kLargestPowerClass) {
    int64_t c = 4;
    while (c < m) c *= 2;
    return c;
  }
  return (m + kClassStep - 1) / kClassStep * kClassStep;
}

bool CublasLtFp8Gemm::TakesLayout(const Fp8LtGemm& g) {
  const int64_t d_elem = g.d_bf16 ? 2 : 4;
  const int64_t split = g.w.split_rows;
  const bool parts_ok = split == 0 || split % kernels::kFp8BlockSize == 0 ||
                        (split > 0 && split < g.n && split % 4 == 0 && (split * d_elem) % 16 == 0);
  return g.m >= 4 && g.m % 4 == 0 && g.n >= 4 && g.n % 4 == 0 && g.k >= 16 && g.k % 16 == 0 &&
         g.ldq >= g.k && g.ldq % 16 == 0 && g.w.ldw >= g.k && g.w.ldw % 16 == 0 &&
         g.w.scale_ld == kernels::Fp8ScaleLd(g.k) && g.ldd >= g.n && (g.ldd * d_elem) % 16 == 0 &&
         parts_ok;
}

bool CublasLtFp8Gemm::Takes(const Fp8LtGemm& g) {
  return TakesLayout(g) && g.q != nullptr && Aligned16(g.q) && g.q_scales != nullptr &&
         Aligned16(g.q_scales) && g.w.data != nullptr && Aligned16(g.w.data) &&
         g.w.scales != nullptr && Aligned16(g.w.scales) && g.d != nullptr && Aligned16(g.d) &&
         Aligned16(g.timing_d);
}

absl::StatusOr<CublasLtFp8Gemm::Shape*> CublasLtFp8Gemm::ShapeFor(const Fp8LtGemm& g) {
  const int64_t m = SizeClass(g.m);
  const Key key{m, g.n, g.k, g.ldq, g.w.ldw, g.ldd, g.d_bf16, g.accumulate};
  auto found = shapes_.find(key);
  if (found != shapes_.end()) return found->second.get();
  auto s = std::make_unique<Shape>();
  const cudaDataType_t d_type = g.d_bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const cublasOperation_t op_w = CUBLAS_OP_T, op_q = CUBLAS_OP_N;
  const cublasLtMatmulMatrixScale_t w_mode = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const cublasLtMatmulMatrixScale_t q_mode = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  absl::Status st = LtStatus(cublasLtMatmulDescCreate(&s->op, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                             "cublasLtMatmulDescCreate");
  auto set = [&](cublasLtMatmulDescAttributes_t attr, const void* v, size_t bytes,
                 const char* what) {
    if (st.ok()) st = LtStatus(cublasLtMatmulDescSetAttribute(s->op, attr, v, bytes), what);
  };
  set(CUBLASLT_MATMUL_DESC_TRANSA, &op_w, sizeof(op_w), "cublasLtMatmulDescSetAttribute(TRANSA)");
  set(CUBLASLT_MATMUL_DESC_TRANSB, &op_q, sizeof(op_q), "cublasLtMatmulDescSetAttribute(TRANSB)");
  set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &w_mode, sizeof(w_mode),
      "cublasLtMatmulDescSetAttribute(A_SCALE_MODE)");
  set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &q_mode, sizeof(q_mode),
      "cublasLtMatmulDescSetAttribute(B_SCALE_MODE)");
  // The heuristic refuses block scale modes without scale pointers (INVALID_VALUE); it does not
  // read them. Run sets the real ones before every launch; until then the weight's stand in
  // for the activations' where Ready has none yet.
  const float* w_scales = g.w.scales;
  const float* q_scales = g.q_scales != nullptr ? g.q_scales : g.w.scales;
  set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales),
      "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
  set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &q_scales, sizeof(q_scales),
      "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
  if (st.ok()) {
    st = LtStatus(cublasLtMatrixLayoutCreate(&s->w, CUDA_R_8F_E4M3, g.k, g.n, g.w.ldw),
                  "cublasLtMatrixLayoutCreate(W)");
  }
  if (st.ok()) {
    st = LtStatus(cublasLtMatrixLayoutCreate(&s->q, CUDA_R_8F_E4M3, g.k, m, g.ldq),
                  "cublasLtMatrixLayoutCreate(Q)");
  }
  if (st.ok()) {
    st = LtStatus(cublasLtMatrixLayoutCreate(&s->d, d_type, g.n, m, g.ldd),
                  "cublasLtMatrixLayoutCreate(D)");
  }
  if (!st.ok()) return st;
  const bool timed = time_large_shapes_ && m >= kTimedMinRows;
  auto pick = AskHeuristic(*s, timed ? kCandidates : 1);
  if (!pick.ok()) return pick.status();
  s->heuristic_status = pick->status;
  s->has_algo = pick->found;
  if (s->has_algo) s->algo = pick->algo;
  if (timed && pick->candidates.size() > 1) s->untimed = std::move(pick->candidates);
  Shape* out = s.get();
  shapes_.emplace(key, std::move(s));
  return out;
}

absl::StatusOr<CublasLtFp8Gemm::HeuristicPick> CublasLtFp8Gemm::AskHeuristic(const Shape& s,
                                                                             int count) {
  cublasLtMatmulPreference_t pref = nullptr;
  absl::Status st =
      LtStatus(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  if (st.ok()) {
    st = LtStatus(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                             &workspace_bytes_, sizeof(workspace_bytes_)),
        "cublasLtMatmulPreferenceSetAttribute");
  }
  HeuristicPick pick;
  std::vector<cublasLtMatmulHeuristicResult_t> results(std::max(count, 1));
  int found_algos = 0;
  if (st.ok()) {
    // A refusal (NOT_SUPPORTED: no such kernels on this device or cuBLAS; INVALID_VALUE: a
    // layout it does not take) is an answer, not an error: the caller takes another path.
    pick.status = cublasLtMatmulAlgoGetHeuristic(lt_, s.op, s.w, s.q, s.d, s.d, pref,
                                                 static_cast<int>(results.size()), results.data(),
                                                 &found_algos);
  }
  if (pref != nullptr) cublasLtMatmulPreferenceDestroy(pref);
  if (!st.ok()) return st;
  if (pick.status == CUBLAS_STATUS_SUCCESS) {
    for (int i = 0; i < found_algos && i < static_cast<int>(results.size()); ++i) {
      if (results[i].state == CUBLAS_STATUS_SUCCESS &&
          results[i].workspaceSize <= workspace_bytes_) {
        pick.candidates.push_back(results[i].algo);
      }
    }
  }
  pick.found = !pick.candidates.empty();
  if (pick.found) pick.algo = pick.candidates.front();
  return pick;
}

cublasStatus_t CublasLtFp8Gemm::Matmul(const Shape& s, const Fp8LtGemm& g,
                                       const cublasLtMatmulAlgo_t* algo, void* d,
                                       cudaStream_t stream) {
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  return cublasLtMatmul(lt_, s.op, &alpha, g.w.data, s.w, g.q, s.q, &beta, g.d, s.d, d, s.d, algo,
                        workspace_, workspace_bytes_, stream);
}

absl::Status CublasLtFp8Gemm::TimeCandidates(Shape* s, const Fp8LtGemm& g, cudaStream_t stream) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(stream, &capture) != cudaSuccess) {
    return absl::InternalError("CublasLtFp8Gemm: cudaStreamIsCapturing failed");
  }
  if (capture != cudaStreamCaptureStatusNone) return absl::OkStatus();
  // With accumulate the candidates write timing_d (d read as the addend, left as it was).
  void* const out = g.accumulate ? g.timing_d : g.d;
  if (out == nullptr) return absl::OkStatus();
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    if (start != nullptr) cudaEventDestroy(start);
    return absl::InternalError("CublasLtFp8Gemm: cudaEventCreate failed");
  }
  absl::Status st;
  int best = -1;
  float best_ms = 0.0f;
  for (size_t c = 0; c < s->untimed.size() && st.ok(); ++c) {
    const cublasLtMatmulAlgo_t* algo = &s->untimed[c];
    cublasStatus_t status = Matmul(*s, g, algo, out, stream);  // warm-up
    if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
      continue;  // not at this m: another candidate
    }
    st = LtStatus(status, "cublasLtMatmul(FP8 block-scaled, timing)");
    if (st.ok() && cudaEventRecord(start, stream) != cudaSuccess) {
      st = absl::InternalError("CublasLtFp8Gemm: cudaEventRecord failed");
    }
    for (int r = 0; r < kTimedRuns && st.ok(); ++r) {
      st = LtStatus(Matmul(*s, g, algo, out, stream), "cublasLtMatmul(FP8 block-scaled, timing)");
    }
    float ms = 0.0f;
    if (st.ok() && (cudaEventRecord(stop, stream) != cudaSuccess ||
                    cudaEventSynchronize(stop) != cudaSuccess ||
                    cudaEventElapsedTime(&ms, start, stop) != cudaSuccess)) {
      st = absl::InternalError("CublasLtFp8Gemm: timing events failed");
    }
    if (st.ok() && (best < 0 || ms < best_ms)) {
      best = static_cast<int>(c);
      best_ms = ms;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  if (!st.ok()) return st;
  if (best >= 0) s->algo = s->untimed[best];
  s->untimed.clear();
  ++timed_shapes_;
  return absl::OkStatus();
}

absl::StatusOr<bool> CublasLtFp8Gemm::RunOne(const Fp8LtGemm& g, cudaStream_t stream) {
  auto shape = ShapeFor(g);
  if (!shape.ok()) return shape.status();
  Shape& s = **shape;
  if (!s.has_algo) return false;
  absl::Status st =
      LtStatus(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER,
                                              &g.w.scales, sizeof(g.w.scales)),
               "cublasLtMatmulDescSetAttribute(A_SCALE_POINTER)");
  if (st.ok()) {
    st = LtStatus(cublasLtMatmulDescSetAttribute(s.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER,
                                                 &g.q_scales, sizeof(g.q_scales)),
                  "cublasLtMatmulDescSetAttribute(B_SCALE_POINTER)");
  }
  // The size class's layouts take this call's m (the column count of Qᵀ and Dᵀ).
  const uint64_t cols = static_cast<uint64_t>(g.m);
  for (cublasLtMatrixLayout_t layout : {s.q, s.d}) {
    if (st.ok()) {
      st = LtStatus(cublasLtMatrixLayoutSetAttribute(layout, CUBLASLT_MATRIX_LAYOUT_COLS, &cols,
                                                     sizeof(cols)),
                    "cublasLtMatrixLayoutSetAttribute(COLS)");
    }
  }
  if (st.ok() && !s.untimed.empty()) st = TimeCandidates(&s, g, stream);
  if (!st.ok()) return st;
  cublasStatus_t status = Matmul(s, g, &s.algo, g.d, stream);
  if (status == CUBLAS_STATUS_NOT_SUPPORTED || status == CUBLAS_STATUS_INVALID_VALUE) {
    // The size class's algorithm does not take this m: the heuristic's first for m itself.
    auto pick = AskHeuristic(s, 1);
    if (!pick.ok()) return pick.status();
    if (!pick->found) return false;
    status = Matmul(s, g, &pick->algo, g.d, stream);
  }
  st = LtStatus(status, "cublasLtMatmul(FP8 block-scaled)");
  if (!st.ok()) return st;
  return true;
}

int CublasLtFp8Gemm::Parts(const Fp8LtGemm& g, Fp8LtGemm parts[2]) {
  const int64_t split = g.w.split_rows;
  parts[0] = g;
  parts[0].w.split_rows = 0;  // a stacked grid split at a multiple of 128 is the plain one
  if (split == 0 || split % kernels::kFp8BlockSize == 0) return 1;
  // Two checkpoint tensors with their own block grids: one GEMM each, into d's columns.
  const int64_t d_elem = g.d_bf16 ? 2 : 4;
  parts[1] = parts[0];
  parts[0].n = split;
  parts[1].n = g.n - split;
  if (g.w.data != nullptr) parts[1].w.data = g.w.data + split * g.w.ldw;
  if (g.w.scales != nullptr) {
    parts[1].w.scales = g.w.scales + kernels::Fp8ScaleRow(split, split) * g.w.scale_ld;
  }
  if (g.d != nullptr) parts[1].d = static_cast<char*>(g.d) + split * d_elem;
  if (g.timing_d != nullptr) parts[1].timing_d = static_cast<char*>(g.timing_d) + split * d_elem;
  return 2;
}

std::string CublasLtFp8Gemm::Refusal(const Fp8LtGemm& g) const {
  if (!TakesLayout(g)) return "a layout CublasLtFp8Gemm::TakesLayout refuses";
  Fp8LtGemm parts[2];
  const int count = Parts(g, parts);
  std::string out;
  for (int i = 0; i < count; ++i) {
    const Fp8LtGemm& p = parts[i];
    auto found =
        shapes_.find(Key{SizeClass(p.m), p.n, p.k, p.ldq, p.w.ldw, p.ldd, p.d_bf16, p.accumulate});
    absl::StrAppend(
        &out, i > 0 ? "; " : "", "part ", i, " (n ", p.n, "): ",
        found == shapes_.end()
            ? std::string("not asked yet")
            : absl::StrCat("heuristic status ", static_cast<int>(found->second->heuristic_status),
                           found->second->has_algo ? ", an algorithm" : ", no algorithm"));
  }
  return out;
}

absl::StatusOr<bool> CublasLtFp8Gemm::Ready(const Fp8LtGemm& g) {
  if (!TakesLayout(g)) return false;
  Fp8LtGemm parts[2];
  const int count = Parts(g, parts);
  for (int i = 0; i < count; ++i) {
    auto shape = ShapeFor(parts[i]);
    if (!shape.ok()) return shape.status();
    if (!(*shape)->has_algo) return false;
  }
  return true;
}

bool CublasLtFp8Gemm::NeedsTimingBuffer(const Fp8LtGemm& g) const {
  if (!g.accumulate || !TakesLayout(g)) return false;
  Fp8LtGemm parts[2];
  const int count = Parts(g, parts);
  for (int i = 0; i < count; ++i) {
    const Fp8LtGemm& p = parts[i];
    auto found =
        shapes_.find(Key{SizeClass(p.m), p.n, p.k, p.ldq, p.w.ldw, p.ldd, p.d_bf16, p.accumulate});
    if (found != shapes_.end() && !found->second->untimed.empty()) return true;
  }
  return false;
}

absl::StatusOr<bool> CublasLtFp8Gemm::Run(const Fp8LtGemm& g, cudaStream_t stream) {
  if (!Takes(g)) return false;
  // Every part must have an algorithm before any runs (nothing half done).
  auto ready = Ready(g);
  if (!ready.ok() || !*ready) return ready;
  Fp8LtGemm parts[2];
  const int count = Parts(g, parts);
  for (int i = 0; i < count; ++i) {
    auto ran = RunOne(parts[i], stream);
    if (!ran.ok() || !*ran) return ran;
  }
  return true;
}

}  // namespace deepinfer
