// CudaBackend: Backend ops mapped onto kernels/ and cuBLAS on one stream.
#include "worker/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "kernels/activation/elementwise.h"
#include "kernels/attention/mha_prefill.h"
#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mla_decode_small.h"
#include "kernels/attention/mla_prefill.h"
#include "kernels/common/capture_deps.h"
#include "kernels/common/pdl.h"
#include "kernels/embedding/rows.h"
#include "kernels/fill/dummy_fill.h"
#include "kernels/moe/expert_activation.h"
#include "kernels/moe/expert_counts.h"
#include "kernels/moe/expert_gemm_cublas.h"
#include "kernels/moe/expert_gemm_plan.h"
#include "kernels/moe/expert_gemm_planned.h"
#include "kernels/moe/grouped_gemm.h"
#include "kernels/moe/moe_decode_fused.h"
#include "kernels/moe/moe_permute.h"
#include "kernels/moe/noaux_tc_router.h"
#include "kernels/moe/noaux_tc_router_fused.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/rope/rope.h"
#include "kernels/sampling/argmax.h"
#include "kernels/sampling/sample.h"
#include "worker/backend/cuda/cuda_status.h"

namespace deepinfer {
namespace {

// cudaMallocAsync memory, freed on the same stream so later frees are ordered after the ops
// that used the buffer (aside: captured beside the kernel chain, kernels/common/capture_deps.h).
class CudaBuffer : public DeviceBuffer {
 public:
  CudaBuffer(void* ptr, size_t bytes, cudaStream_t stream, bool aside)
      : ptr_(ptr), bytes_(bytes), stream_(stream), aside_(aside) {}
  ~CudaBuffer() override {
    cudaError_t err =
        aside_ ? kernels::FreeAsideAsync(ptr_, stream_) : cudaFreeAsync(ptr_, stream_);
    if (err != cudaSuccess) LOG(ERROR) << CudaStatus(err, "cudaFreeAsync");
  }
  void* data() override { return ptr_; }
  const void* data() const override { return ptr_; }
  size_t size_bytes() const override { return bytes_; }

 private:
  void* ptr_;
  size_t bytes_;
  cudaStream_t stream_;
  bool aside_;
};

bool FitsInt(int64_t v) { return v >= 0 && v <= std::numeric_limits<int>::max(); }

// Rows per chunk of the kChunked expert GEMMs for `avg_rows` rows per expert on average: the
// padding (half a chunk per busy expert on average) against cuBLAS's tile efficiency. Measured
// on the H200 at the Moonlight shape (moe_prefill_bench, docs/kernels.md): 64 was fastest up to
// 48 rows per expert, 128 from 96 rows on (256 never clearly better).
int32_t ChunkRowsFor(int64_t avg_rows) { return avg_rows < 96 ? 64 : 128; }

const char* ExpertGemmAlgoName(kernels::ExpertGemmCublasAlgo algo) {
  switch (algo) {
    case kernels::ExpertGemmCublasAlgo::kChunked:
      return "chunked";
    case kernels::ExpertGemmCublasAlgo::kPerExpert:
      return "per expert";
    case kernels::ExpertGemmCublasAlgo::kGrouped:
      return "grouped";
  }
  return "?";
}

// An instantiated CUDA graph, launched on the backend's stream.
class CudaGraphOps : public CapturedOps {
 public:
  CudaGraphOps(cudaGraph_t graph, cudaGraphExec_t exec, cudaStream_t stream)
      : graph_(graph), exec_(exec), stream_(stream) {}
  ~CudaGraphOps() override {
    cudaGraphExecDestroy(exec_);
    cudaGraphDestroy(graph_);
  }
  absl::Status Replay() override {
    return CudaStatus(cudaGraphLaunch(exec_, stream_), "cudaGraphLaunch");
  }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  cudaStream_t stream_;
};

}  // namespace

class CudaBackend::OpTimer {
 public:
  OpTimer(CudaBackend* b, const char* name)
      : b_(b), name_(name), active_(b->op_timing_ && !b->in_timed_op_) {
    if (!active_) return;
    b_->in_timed_op_ = true;
    b_->Check(cudaStreamSynchronize(b_->stream_), "cudaStreamSynchronize");
    start_ = std::chrono::steady_clock::now();
  }
  ~OpTimer() {
    if (!active_) return;
    b_->Check(cudaStreamSynchronize(b_->stream_), "cudaStreamSynchronize");
    OpTotal& t = b_->op_totals_[name_];
    ++t.calls;
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    b_->in_timed_op_ = false;
  }

 private:
  CudaBackend* b_;
  const char* name_;
  bool active_;
  std::chrono::steady_clock::time_point start_;
};

// A phase inside a timed op (op timing on and `active`): synchronises around itself and adds
// its time under its own name ("Op/phase"), which the report lists apart from the op totals.
class CudaBackend::PhaseTimer {
 public:
  PhaseTimer(CudaBackend* b, const char* name, bool active)
      : b_(b), name_(name), active_(active && b->op_timing_) {
    if (!active_) return;
    b_->Check(cudaStreamSynchronize(b_->stream_), "cudaStreamSynchronize");
    start_ = std::chrono::steady_clock::now();
  }
  ~PhaseTimer() {
    if (!active_) return;
    b_->Check(cudaStreamSynchronize(b_->stream_), "cudaStreamSynchronize");
    OpTotal& t = b_->op_totals_[name_];
    ++t.calls;
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  CudaBackend* b_;
  const char* name_;
  bool active_;
  std::chrono::steady_clock::time_point start_;
};

void CudaBackend::SetOpTiming(bool on) { op_timing_ = on; }

std::string CudaBackend::TakeOpTimingReport() {
  // Ops, then the phases inside ops ("Op/phase", already counted in their op's time).
  std::vector<std::pair<std::string, OpTotal>> v, phases;
  for (const auto& e : op_totals_) {
    (e.first.find('/') == std::string::npos ? v : phases).push_back(e);
  }
  auto by_time = [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; };
  std::sort(v.begin(), v.end(), by_time);
  std::sort(phases.begin(), phases.end(), by_time);
  double total = 0;
  for (const auto& e : v) total += e.second.seconds;
  std::string out;
  for (const auto& e : v) {
    absl::StrAppendFormat(&out, "  %-18s %8d calls %10.3f ms %5.1f%%\n", e.first, e.second.calls,
                          e.second.seconds * 1e3, total > 0 ? 100 * e.second.seconds / total : 0);
  }
  for (const auto& e : phases) {
    absl::StrAppendFormat(&out, "    (phase) %-30s %6d calls %10.3f ms\n", e.first, e.second.calls,
                          e.second.seconds * 1e3);
  }
  absl::StrAppendFormat(&out, "  %-18s %8s       %10.3f ms\n", "total", "", total * 1e3);
  op_totals_.clear();
  return out;
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(int device,
                                                                 WeightDType weight_dtype) {
  int count = 0;
  cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("CudaBackend: no CUDA device (cudaGetDeviceCount: ",
                     err == cudaSuccess ? "0 devices" : cudaGetErrorString(err), ")"));
  }
  if (device < 0 || device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("CudaBackend: device ", device, " requested, ", count, " present"));
  }
  absl::Status st = CudaStatus(cudaSetDevice(device), "cudaSetDevice");
  if (!st.ok()) return st;
  cudaStream_t stream = nullptr;
  st = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  if (!st.ok()) return st;
  cudaMemPool_t pool = nullptr;
  st = CudaStatus(cudaDeviceGetDefaultMemPool(&pool, device), "cudaDeviceGetDefaultMemPool");
  if (st.ok()) {
    // Keep freed memory in the pool instead of returning it at every synchronisation: the model
    // allocates its activations afresh each step.
    uint64_t keep_all = std::numeric_limits<uint64_t>::max();
    st = CudaStatus(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_all),
                    "cudaMemPoolSetAttribute(ReleaseThreshold)");
  }
  cublasHandle_t cublas = nullptr;
  if (st.ok()) st = CublasStatus(cublasCreate(&cublas), "cublasCreate");
  if (st.ok()) st = CublasStatus(cublasSetStream(cublas, stream), "cublasSetStream");
  // Plain fp32 arithmetic: TF32 tensor cores would cost the 1e-3 parity with HF float32.
  if (st.ok())
    st = CublasStatus(cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
  // A workspace of our own: cuBLAS then never allocates while a graph is recorded, and eager
  // and recorded GEMMs see the same workspace size (the same algorithm choices).
  void* workspace = nullptr;
  if (st.ok()) st = CudaStatus(cudaMalloc(&workspace, kCublasWorkspaceBytes), "cudaMalloc");
  if (st.ok()) {
    st = CublasStatus(cublasSetWorkspace(cublas, workspace, kCublasWorkspaceBytes),
                      "cublasSetWorkspace");
  }
  unsigned int* counter = nullptr;
  if (st.ok()) {
    st = CudaStatus(cudaMalloc(reinterpret_cast<void**>(&counter), sizeof(unsigned int)),
                    "cudaMalloc");
  }
  if (st.ok()) st = CudaStatus(cudaMemset(counter, 0, sizeof(unsigned int)), "cudaMemset");
  void* tile_counters = nullptr;
  constexpr size_t kTileCounterBytes = kernels::kFusedRouterTileCounters * sizeof(uint32_t);
  if (st.ok()) st = CudaStatus(cudaMalloc(&tile_counters, kTileCounterBytes), "cudaMalloc");
  if (st.ok()) st = CudaStatus(cudaMemset(tile_counters, 0, kTileCounterBytes), "cudaMemset");
  void* resident = nullptr;
  if (st.ok()) {
    st = CudaStatus(cudaMalloc(&resident, kResidentLogitsBytes + kResidentActBytes), "cudaMalloc");
  }
  if (!st.ok()) {
    if (cublas != nullptr) cublasDestroy(cublas);
    if (workspace != nullptr) cudaFree(workspace);
    if (counter != nullptr) cudaFree(counter);
    if (tile_counters != nullptr) cudaFree(tile_counters);
    if (resident != nullptr) cudaFree(resident);
    cudaStreamDestroy(stream);
    return st;
  }
  return std::unique_ptr<CudaBackend>(
      new CudaBackend(device, weight_dtype, stream, cublas, pool, workspace, counter,
                      static_cast<uint32_t*>(tile_counters), resident));
}

CudaBackend::CudaBackend(int device, WeightDType weight_dtype, cudaStream_t stream,
                         cublasHandle_t cublas, cudaMemPool_t pool, void* cublas_workspace,
                         unsigned int* staged_gemv_counter, uint32_t* route_tile_counters,
                         void* resident_workspace)
    : device_(device),
      weight_dtype_(weight_dtype),
      stream_(stream),
      cublas_(cublas),
      pool_(pool),
      cublas_workspace_(cublas_workspace),
      staged_gemv_counter_(staged_gemv_counter),
      route_tile_counters_(route_tile_counters),
      resident_workspace_(resident_workspace) {}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  lt_tuner_.reset();
  cublasDestroy(cublas_);
  cudaFree(cublas_workspace_);
  if (switch_stream_ != nullptr) cudaStreamDestroy(switch_stream_);
  cudaFree(staged_gemv_counter_);
  cudaFree(route_tile_counters_);
  cudaFree(resident_workspace_);
  cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<CapturedOps>> CudaBackend::Capture(
    const std::function<absl::Status()>& record, const CaptureOptions& options) {
  if (op_timing_) {
    return absl::FailedPreconditionError(
        "CudaBackend::Capture: op timing is on (it synchronises around every op)");
  }
  cudaSetDevice(device_);
  {
    absl::MutexLock lock(&mu_);
    capturing_ = true;
    capture_aside_ = allocations_aside_ ||
                     (options.tokens > 0 && options.tokens <= aside_max_tokens_);
    capture_error_ = absl::OkStatus();
  }
  absl::Status st = CudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                               "cudaStreamBeginCapture");
  absl::Status recorded = st.ok() ? record() : absl::OkStatus();
  cudaGraph_t graph = nullptr;
  if (st.ok()) st = CudaStatus(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
  absl::Status op_error;
  {
    absl::MutexLock lock(&mu_);
    capturing_ = false;
    op_error = capture_error_;
  }
  if (!recorded.ok() || !op_error.ok() || !st.ok()) {
    if (graph != nullptr) cudaGraphDestroy(graph);
    // An op refused while recording invalidates the capture; the stream itself stays usable.
    cudaGetLastError();
    if (!recorded.ok()) return recorded;
    return absl::FailedPreconditionError(
        absl::StrCat("CudaBackend::Capture: the ops could not be recorded: ",
                     (!op_error.ok() ? op_error : st).ToString()));
  }
  cudaGraphExec_t exec = nullptr;
  st = CudaStatus(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
  if (!st.ok()) {
    cudaGraphDestroy(graph);
    return st;
  }
  return std::unique_ptr<CapturedOps>(new CudaGraphOps(graph, exec, stream_));
}

absl::StatusOr<size_t> CudaBackend::GraphReservedBytes(bool high_water_mark) const {
  uint64_t v = 0;
  absl::Status st = CudaStatus(
      cudaDeviceGetGraphMemAttribute(
          device_,
          high_water_mark ? cudaGraphMemAttrReservedMemHigh : cudaGraphMemAttrReservedMemCurrent,
          &v),
      "cudaDeviceGetGraphMemAttribute");
  if (!st.ok()) return st;
  return static_cast<size_t>(v);
}

bool CudaBackend::Record(const absl::Status& st) {
  if (st.ok()) return true;
  absl::MutexLock lock(&mu_);
  if (capturing_) {
    if (capture_error_.ok()) capture_error_ = st;
    return false;
  }
  if (first_error_.ok()) {
    LOG(ERROR) << "CudaBackend: " << st;
    first_error_ = st;
  }
  return false;
}

bool CudaBackend::Check(cudaError_t err, const char* call) {
  return err == cudaSuccess || Record(CudaStatus(err, call));
}

bool CudaBackend::CheckBlas(cublasStatus_t st, const char* call) {
  return st == CUBLAS_STATUS_SUCCESS || Record(CublasStatus(st, call));
}

void CudaBackend::CheckKernelOrBlas(cudaError_t err, cublasStatus_t blas, const char* call) {
  if (blas != CUBLAS_STATUS_SUCCESS) {
    CheckBlas(blas, absl::StrCat(call, " (cuBLAS)").c_str());
  } else {
    Check(err, call);
  }
}

bool CudaBackend::SpansTileTheBatch(const char* op, const MlaSequenceSpan* spans, int32_t num_spans,
                                    int32_t num_tokens, int64_t max_context) {
  int32_t next = 0;
  for (int32_t i = 0; i < num_spans; ++i) {
    const MlaSequenceSpan& s = spans[i];
    if (s.first_token != next || s.num_tokens <= 0 || s.num_tokens > s.context_len ||
        (max_context >= 0 && s.context_len > max_context)) {
      Record(absl::InvalidArgumentError(absl::StrCat(
          op, ": sequence ", i, " has first token ", s.first_token, ", ", s.num_tokens,
          " tokens, context ", s.context_len, " (expected first token ", next,
          ", 1 <= tokens <= context",
          max_context >= 0 ? absl::StrCat(" <= the block table's ", max_context) : "", ")")));
      return false;
    }
    next += s.num_tokens;
  }
  if (next != num_tokens) {
    Record(absl::InvalidArgumentError(
        absl::StrCat(op, ": the sequences cover ", next, " tokens, the batch has ", num_tokens)));
    return false;
  }
  return true;
}

absl::Status CudaBackend::status() const {
  absl::MutexLock lock(&mu_);
  return first_error_;
}

absl::StatusOr<size_t> CudaBackend::ReservedBytes(bool high_water_mark) const {
  uint64_t v = 0;
  absl::Status st = CudaStatus(
      cudaMemPoolGetAttribute(
          pool_,
          high_water_mark ? cudaMemPoolAttrReservedMemHigh : cudaMemPoolAttrReservedMemCurrent, &v),
      "cudaMemPoolGetAttribute");
  if (!st.ok()) return st;
  return static_cast<size_t>(v);
}

std::unique_ptr<DeviceBuffer> CudaBackend::Allocate(size_t bytes) {
  return AllocateOnStream(bytes, /*zero=*/true);
}

std::unique_ptr<DeviceBuffer> CudaBackend::AllocateScratch(size_t bytes) {
  return AllocateOnStream(bytes, /*zero=*/false);
}

std::unique_ptr<DeviceBuffer> CudaBackend::AllocateOnStream(size_t bytes, bool zero) {
  OpTimer timer(this, "Allocate");
  cudaSetDevice(device_);
  // At least one 256-byte granule, so data() is never null even for empty tensors.
  const size_t rounded = ((std::max<size_t>(bytes, 1) + 255) / 256) * 256;
  void* ptr = nullptr;
  bool aside = false;
  if (!zero && rounded <= kMaxAsideAllocationBytes &&
      kernels::ProgrammaticDependentLaunchEnabled()) {
    absl::MutexLock lock(&mu_);
    aside = capturing_ && capture_aside_;
    if (aside) ++aside_allocations_;
  }
  absl::Status st = aside ? CudaStatus(kernels::MallocAsideAsync(&ptr, rounded, stream_),
                                       "kernels::MallocAsideAsync")
                          : CudaStatus(cudaMallocAsync(&ptr, rounded, stream_), "cudaMallocAsync");
  if (st.ok() && zero) {
    st = CudaStatus(cudaMemsetAsync(ptr, 0, rounded, stream_), "cudaMemsetAsync");
  }
  CHECK(st.ok()) << "CudaBackend: allocating " << bytes << " bytes: " << st;
  return std::make_unique<CudaBuffer>(ptr, bytes, stream_, aside);
}

void CudaBackend::CopyToDevice(const void* host, size_t bytes, void* device) {
  OpTimer timer(this, "CopyToDevice");
  if (bytes == 0) return;
  // From pageable memory the call returns once the data is staged, so the caller may reuse
  // or free `host` immediately.
  Check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync(HostToDevice)");
}

void CudaBackend::CopyToHost(const void* device, size_t bytes, void* host) {
  OpTimer timer(this, "CopyToHost");
  if (bytes == 0) return;
  if (Check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_),
            "cudaMemcpyAsync(DeviceToHost)")) {
    Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }
}

void CudaBackend::CopyDeviceToDevice(const void* src, size_t bytes, void* dst) {
  OpTimer timer(this, "CopyDeviceToDevice");
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpyAsync(DeviceToDevice)");
}

void CudaBackend::Synchronize() { Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

absl::StatusOr<DeviceMemoryInfo> CudaBackend::MemoryInfo() const {
  cudaSetDevice(device_);
  size_t free_bytes = 0, total_bytes = 0;
  absl::Status st = CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  if (!st.ok()) return st;
  DeviceMemoryInfo info;
  info.total_bytes = total_bytes;
  info.free_bytes = free_bytes;
  return info;
}

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
  if (!gemm_autotune_ || m < kGemmAutotuneMinRows || w.dtype != WeightDType::kBFloat16) {
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

bool CudaBackend::SmallMGemm(const kernels::SmallMGemmParams& p) {
  // Measured on the H200 (small_m_gemm_bench, docs/kernels.md): at m = 1 the kernel beat cuBLAS
  // at every decode shape; at m = 4 only up to n = 3072 (from n = 5632 cuBLAS was faster: each
  // weight chunk re-reads 4 activation rows from L1).
  if (!small_m_gemm_ || (p.m > 1 && p.n > kSmallMGemmMaxColumnsAboveOneRow) ||
      !kernels::SmallMGemmSupports(p)) {
    return false;
  }
  const bool staged_shape = p.m == 1   ? kernels::StagedGemvPreferredAtOneRow(p.n, p.k)
                            : p.m == 2 ? kernels::StagedGemvPreferredAtTwoRows(p.n, p.k)
                                       : false;
  if (staged_gemv_ == StagedGemv::kAll && small_m_gemm_algo_ == kernels::SmallMGemmAlgo::kAuto &&
      p.m <= staged_gemv_max_rows_ && p.batch == 1 && staged_shape) {
    kernels::StagedGemvParams s;
    s.m = p.m, s.k = p.k;
    s.prologue = kernels::StagedGemvPrologue::kCopy;
    s.a = p.a, s.a_bf16 = p.a_bf16, s.lda = p.lda;
    s.num_targets = 1;
    s.targets[0] = {p.n, p.w, p.ldw, p.c, p.ldc, p.accumulate};
    if (kernels::StagedGemvSupports(s)) {
      Check(kernels::StagedGemvBf16(s, stream_), "kernels::StagedGemvBf16");
      return true;
    }
  }
  kernels::SmallMGemmParams q = p;
  q.algo = small_m_gemm_algo_;
  Check(kernels::SmallMGemmBf16(q, stream_), "kernels::SmallMGemmBf16");
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
    GemmOnCublas(m, n, k, a.data, lda, w, ldw, c, ldc, accumulate);
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

void CudaBackend::BatchedGemm(int64_t batch, int64_t m, int64_t n, int64_t k, const float* a,
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
  if (w.dtype == WeightDType::kFloat32) {
    CheckBlas(cublasSgemmStridedBatched(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n),
                                        static_cast<int>(m), static_cast<int>(k), &alpha,
                                        static_cast<const float*>(w.data), static_cast<int>(ldw),
                                        stride_w, a, static_cast<int>(lda), stride_a, &beta, c,
                                        static_cast<int>(ldc), stride_c, static_cast<int>(batch)),
              "cublasSgemmStridedBatched");
    return;
  }
  kernels::SmallMGemmParams p;
  p.m = m, p.n = n, p.k = k, p.a = a, p.lda = lda;
  p.w = static_cast<const uint16_t*>(w.data), p.ldw = ldw, p.c = c, p.ldc = ldc;
  p.batch = batch, p.stride_a = stride_a, p.stride_w = stride_w, p.stride_c = stride_c;
  if (SmallMGemm(p)) return;
  // Every element any product reads lies in the first (batch-1)*stride_a + (m-1)*lda + k.
  auto a16 = RoundToBf16(a, (batch - 1) * stride_a + (m - 1) * lda + k);
  CheckBlas(cublasGemmStridedBatchedEx(
                cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(n), static_cast<int>(m),
                static_cast<int>(k), &alpha, w.data, CUDA_R_16BF, static_cast<int>(ldw), stride_w,
                a16->data(), CUDA_R_16BF, static_cast<int>(lda), stride_a, &beta, c, CUDA_R_32F,
                static_cast<int>(ldc), stride_c, static_cast<int>(batch), CUBLAS_COMPUTE_32F,
                CUBLAS_GEMM_DEFAULT),
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
  bool any_bf16 = false;
  for (const WeightView& w : weights) any_bf16 |= w.dtype == WeightDType::kBFloat16;
  std::unique_ptr<DeviceBuffer> a16;
  if (any_bf16) a16 = RoundToBf16(a + offsets.front() * k, rows * k);
  for (size_t g = 0; g < weights.size(); ++g) {
    const int64_t group_rows = offsets[g + 1] - offsets[g];
    if (group_rows == 0) continue;
    const void* ag =
        weights[g].dtype == WeightDType::kFloat32
            ? static_cast<const void*>(a + offsets[g] * k)
            : static_cast<const void*>(a16->as<uint16_t>() + (offsets[g] - offsets.front()) * k);
    GemmOnCublas(group_rows, n, k, ag, k, weights[g], k, c + offsets[g] * n, n, false);
  }
}

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

void CudaBackend::AddRmsNormGemms(int64_t rows, int64_t dim, float* x, const float* y,
                                  const float* weight, float eps, float* normed,
                                  uint16_t* normed_bf16, const std::vector<NormedGemm>& gemms) {
  OpTimer timer(this, "AddRmsNormGemms");
  kernels::StagedGemvParams p;
  p.m = rows, p.k = dim;
  p.prologue = kernels::StagedGemvPrologue::kAddRmsNorm;
  p.x = x, p.y = y, p.norm_weight = weight, p.eps = eps, p.counter = staged_gemv_counter_;
  p.num_targets = static_cast<int>(gemms.size());
  // The norm fused at one row only: at 2 and 4 rows the prologue's block reductions in every
  // block measured slower than AddRmsNorm + the GEMMs (small_m_gemm_bench: 4 rows 17.18 vs
  // 10.74 us; 2 rows 10.14 vs 9.56; 1 row: 8.28 vs 8.79 us). At two rows: AddRmsNorm,
  // then one staged launch for all targets (q + kv_a: 6.97 vs 10.01 us for two small-m launches).
  bool staged =
      staged_gemv_ != StagedGemv::kOff && small_m_gemm_ &&
      (rows == 1 || (rows == 2 && staged_gemv_max_rows_ >= 2 && normed_bf16 != nullptr)) &&
      gemms.size() <= static_cast<size_t>(kernels::kStagedGemvMaxTargets);
  int64_t columns = 0;
  for (size_t t = 0; staged && t < gemms.size(); ++t) {
    const NormedGemm& g = gemms[t];
    staged = g.w.dtype == WeightDType::kBFloat16;
    p.targets[t] = {g.n, static_cast<const uint16_t*>(g.w.data), g.ldw, g.c, g.ldc, false};
    columns += g.n;
  }
  if (staged && rows == 2) {
    staged = kernels::StagedGemvPreferredAtTwoRows(columns, dim);
    p.prologue = kernels::StagedGemvPrologue::kCopy;
    p.a = normed_bf16, p.a_bf16 = true, p.lda = dim;
  }
  if (staged && kernels::StagedGemvSupports(p)) {
    if (rows == 2) {
      Check(kernels::AddRmsNormF32(rows, dim, x, y, weight, eps, nullptr, normed_bf16, stream_),
            "kernels::AddRmsNormF32");
    }
    Check(kernels::StagedGemvBf16(p, stream_), "kernels::StagedGemvBf16");
    return;
  }
  Backend::AddRmsNormGemms(rows, dim, x, y, weight, eps, normed, normed_bf16, gemms);
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

void CudaBackend::ApplyRope(int64_t tokens, int64_t heads, float* x, int64_t token_stride,
                            int64_t head_stride, int64_t rope_dim, const int32_t* positions,
                            const float* inv_freq, float attention_factor, bool interleaved) {
  OpTimer timer(this, "ApplyRope");
  Check(kernels::ApplyRopeF32(tokens, heads, x, token_stride, head_stride, rope_dim, positions,
                              inv_freq, attention_factor, interleaved, stream_),
        "kernels::ApplyRopeF32");
}

namespace {

kernels::PagedLatentCache KernelCache(const PagedLatentCacheView& v) {
  return {v.cache, v.block_size, v.latent_dim, v.rope_dim,
          v.dtype == WeightDType::kBFloat16 ? kernels::LatentCacheType::kBFloat16
                                            : kernels::LatentCacheType::kFloat32};
}

}  // namespace

void CudaBackend::WriteLatentCache(int64_t tokens, const float* latent, int64_t ld_latent,
                                   const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                   const PagedLatentCacheView& cache) {
  OpTimer timer(this, "WriteLatentCache");
  const kernels::PagedLatentCache c = KernelCache(cache);
  Check(
      kernels::WriteLatentCacheF32(tokens, latent, ld_latent, rope_key, ld_rope, slots, c, stream_),
      "kernels::WriteLatentCacheF32");
}

bool CudaBackend::GateUpSiluMulBf16(int64_t rows, int64_t inter, int64_t k, ActivationView a,
                                    int64_t lda, WeightView w, int64_t ldw, uint16_t* out) {
  if (!bf16_gate_up_ || rows < kBf16GateUpMinRows || w.dtype != WeightDType::kBFloat16 ||
      inter <= 0 || !FitsInt(rows) || !FitsInt(2 * inter) || !FitsInt(k) || !FitsInt(lda) ||
      !FitsInt(ldw)) {
    return false;
  }
  OpTimer timer(this, "GateUpSiluMulBf16");
  std::unique_ptr<DeviceBuffer> a16;
  const void* a_bf16 = a.data;
  if (a.dtype != WeightDType::kBFloat16) {
    a16 = RoundToBf16(static_cast<const float*>(a.data), (rows - 1) * lda + k);
    a_bf16 = a16->data();
  }
  auto gate_up = AllocateScratch(static_cast<size_t>(rows) * 2 * inter * sizeof(uint16_t));
  // GemmOnCublas's layout (column-major Cᵀ = W·Aᵀ), with a bf16 C.
  const float alpha = 1.0f, beta = 0.0f;
  const int n = static_cast<int>(2 * inter);
  if (!GemmOnCublasLt(rows, n, k, a_bf16, lda, w, ldw, gate_up->data(), n, /*c_bf16=*/true,
                      /*accumulate=*/false)) {
    CheckBlas(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, static_cast<int>(rows),
                           static_cast<int>(k), &alpha, w.data, CUDA_R_16BF, static_cast<int>(ldw),
                           a_bf16, CUDA_R_16BF, static_cast<int>(lda), &beta, gate_up->data(),
                           CUDA_R_16BF, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              "cublasGemmEx(bf16 out)");
  }
  Check(kernels::SiluMulBf16(rows, inter, gate_up->as<uint16_t>(), out, stream_),
        "kernels::SiluMulBf16");
  return true;
}

namespace {

kernels::NormRopeCacheParams NormRopeCacheParamsFor(const NormRopeCacheArgs& a) {
  kernels::NormRopeCacheParams p;
  p.tokens = a.tokens;
  p.kv = a.kv;
  p.ld_kv = a.ld_kv;
  p.norm_weight = a.norm_weight;
  p.eps = a.eps;
  p.latent_dim = a.cache.latent_dim;
  p.rope_dim = a.cache.rope_dim;
  p.q = a.q;
  p.q_heads = a.q_heads;
  p.q_token_stride = a.q_token_stride;
  p.q_head_stride = a.q_head_stride;
  p.positions = a.positions;
  p.inv_freq = a.inv_freq;
  p.attention_factor = a.attention_factor;
  p.interleaved = a.interleaved;
  p.slots = a.slots;
  p.cache = a.cache.cache;
  p.cache_bf16 = a.cache.dtype == WeightDType::kBFloat16;
  return p;
}

}  // namespace

void CudaBackend::NormRopeWriteLatentCache(const NormRopeCacheArgs& a) {
  OpTimer timer(this, "NormRopeWriteLatentCache");
  Check(kernels::NormRopeWriteLatentCacheF32(NormRopeCacheParamsFor(a), stream_),
        "kernels::NormRopeWriteLatentCacheF32");
}

void CudaBackend::NormRopeCacheAbsorbQuery(const NormRopeCacheArgs& nr, const AbsorbQueryArgs& aq) {
  // With SetSmallMGemm(false) (cuBLAS GEMMs, for comparisons) the product stays on cuBLAS too.
  if (norm_rope_cache_absorb_fused_ && small_m_gemm_ && nr.tokens >= 1 &&
      nr.tokens <= kNormRopeCacheAbsorbMaxTokens && aq.w_uk.dtype == WeightDType::kBFloat16) {
    const kernels::NormRopeCacheParams p = NormRopeCacheParamsFor(nr);
    kernels::AbsorbQueryParams a;
    a.heads = aq.heads;
    a.nope_dim = aq.nope_dim;
    a.latent_dim = aq.latent_dim;
    a.q_nope = aq.q_nope;
    a.q_token_stride = aq.q_token_stride;
    a.q_head_stride = aq.q_head_stride;
    a.w = static_cast<const uint16_t*>(aq.w_uk.data);
    a.out = aq.q_latent;
    if (kernels::NormRopeCacheAbsorbQuerySupported(p, a)) {
      OpTimer timer(this, "NormRopeCacheAbsorbQuery");
      Check(kernels::NormRopeCacheAbsorbQueryF32(p, a, stream_),
            "kernels::NormRopeCacheAbsorbQueryF32");
      return;
    }
  }
  Backend::NormRopeCacheAbsorbQuery(nr, aq);
}

bool CudaBackend::UsesTensorCoreAttention(const MlaSequenceSpan& s) const {
  return weight_dtype_ == WeightDType::kBFloat16 && mla_prefill_min_tokens_ > 0 &&
         s.num_tokens >= mla_prefill_min_tokens_ &&
         static_cast<int64_t>(s.num_tokens) * s.context_len >= kMlaPrefillMinWork;
}

absl::Status CudaBackend::SetMlaDecodeVariant(int32_t variant) {
  if (!kernels::MlaMmaVariantIsValid(variant)) {
    return absl::InvalidArgumentError(absl::StrCat("CudaBackend::SetMlaDecodeVariant: variant ",
                                                   variant, " is not one of ",
                                                   kernels::kMlaMmaVariantList));
  }
  mla_decode_variant_ = variant;
  return absl::OkStatus();
}

absl::Status CudaBackend::SetMlaDecodeSmallMaxContext(int32_t max_context) {
  if (max_context < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaBackend::SetMlaDecodeSmallMaxContext: max_context ", max_context, " is below 1"));
  }
  mla_decode_small_max_context_ = max_context;
  return absl::OkStatus();
}

int32_t CudaBackend::MlaDecodeContextBreak(int32_t num_tokens) const {
  return mla_decode_small_ && num_tokens >= 1 && num_tokens <= kMlaDecodeSmallMaxTokens
             ? mla_decode_small_max_context_
             : 0;
}

void CudaBackend::MlaAttention(const MlaAttentionArgs& a) {
  OpTimer timer(this, "MlaAttention");
  kernels::MlaAttentionParams p;
  p.mma_variant = mla_decode_variant_;
  p.num_tokens = a.num_tokens;
  p.num_heads = a.num_heads;
  p.q_latent = a.q_latent;
  p.q_rope = a.q_rope;
  p.q_rope_token_stride = a.q_rope_token_stride;
  p.q_rope_head_stride = a.q_rope_head_stride;
  p.cache = KernelCache(a.cache);
  p.block_tables = a.block_tables;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.token_seq = a.token_seq;
  p.context_len = a.context_len;
  p.softmax_scale = a.softmax_scale;
  p.out_latent = a.out_latent;
  std::vector<kernels::MlaPrefillSequence> prefill;
  if (a.sequences != nullptr) {
    if (!SpansTileTheBatch("CudaBackend::MlaAttention", a.sequences, a.num_sequences, a.num_tokens,
                           /*max_context=*/-1)) {
      return;
    }
    for (int32_t i = 0; i < a.num_sequences; ++i) {
      const MlaSequenceSpan& s = a.sequences[i];
      if (UsesTensorCoreAttention(s)) {
        prefill.push_back({i, s.first_token, s.num_tokens, s.context_len});
      }
    }
  }
  if (prefill.empty()) {
    // One decode token at a short context: one launch of the cluster kernel where it takes the
    // shape (bf16 cache, latent 512 + rope 64, sm_90); a device that cannot schedule its
    // clusters falls back.
    int32_t max_context = a.max_context_hint;
    if (a.sequences != nullptr) {
      max_context = 0;
      for (int32_t i = 0; i < a.num_sequences; ++i) {
        max_context = std::max(max_context, a.sequences[i].context_len);
      }
    }
    if (mla_decode_small_ && a.num_tokens <= kMlaDecodeSmallMaxTokens && max_context > 0 &&
        max_context <= mla_decode_small_max_context_ && kernels::MlaDecodeSmallSupported(p)) {
      kernels::MlaDecodeSmallOptions options;
      options.early_dependents = mla_decode_small_early_dependents_;
      const cudaError_t e = kernels::MlaDecodeSmall(p, options, stream_);
      if (e != cudaErrorNotSupported) {
        Check(e, "kernels::MlaDecodeSmall");
        return;
      }
    }
    Check(kernels::MlaAttentionF32(p, stream_), "kernels::MlaAttentionF32");
    return;
  }
  // The other sequences' tokens go through the fp32 kernel, one launch per run of consecutive
  // tokens between prefill sequences.
  int32_t run_begin = 0;
  auto flush = [&](int32_t run_end) {
    if (run_end > run_begin) {
      kernels::MlaAttentionParams r = p;
      const int64_t t0 = run_begin;
      r.num_tokens = run_end - run_begin;
      r.q_latent = p.q_latent + t0 * a.num_heads * a.cache.latent_dim;
      r.q_rope = p.q_rope + t0 * a.q_rope_token_stride;
      r.token_seq = p.token_seq + t0;
      r.context_len = p.context_len + t0;
      r.out_latent = p.out_latent + t0 * a.num_heads * a.cache.latent_dim;
      Check(kernels::MlaAttentionF32(r, stream_), "kernels::MlaAttentionF32");
    }
  };
  for (const kernels::MlaPrefillSequence& s : prefill) {
    flush(s.first_token);
    run_begin = s.first_token + s.num_tokens;
  }
  flush(a.num_tokens);

  kernels::MlaPrefillParams f;
  f.num_heads = a.num_heads;
  f.q_latent = a.q_latent;
  f.q_rope = a.q_rope;
  f.q_rope_token_stride = a.q_rope_token_stride;
  f.q_rope_head_stride = a.q_rope_head_stride;
  f.cache = a.cache.cache;
  f.cache_dtype = a.cache.dtype == WeightDType::kBFloat16 ? kernels::MlaCacheDType::kBFloat16
                                                          : kernels::MlaCacheDType::kFloat32;
  f.block_size = a.cache.block_size;
  f.latent_dim = a.cache.latent_dim;
  f.rope_dim = a.cache.rope_dim;
  f.block_tables = a.block_tables;
  f.max_blocks_per_seq = a.max_blocks_per_seq;
  f.sequences = prefill.data();
  f.num_sequences = static_cast<int32_t>(prefill.size());
  f.softmax_scale = a.softmax_scale;
  f.out_latent = a.out_latent;
  f.workspace_bytes = kernels::MlaPrefillWorkspaceBytes(f);
  auto workspace = AllocateScratch(std::max<size_t>(f.workspace_bytes, 1));
  f.workspace = workspace->data();
  cublasStatus_t blas = CUBLAS_STATUS_SUCCESS;
  const cudaError_t e = kernels::MlaPrefillBf16(f, cublas_, stream_, &blas);
  CheckKernelOrBlas(e, blas, "kernels::MlaPrefillBf16");
}

bool CudaBackend::MhaPrefillAttention(const MhaPrefillArgs& a) {
  if (a.kv_b.dtype != WeightDType::kBFloat16 || a.sequences == nullptr) return false;
  if (!SpansTileTheBatch("CudaBackend::MhaPrefillAttention", a.sequences, a.num_sequences,
                         a.num_tokens,
                         static_cast<int64_t>(a.max_blocks_per_seq) * a.cache.block_size)) {
    return true;
  }
  std::vector<kernels::MhaPrefillSequence> seqs;
  for (int32_t i = 0; i < a.num_sequences; ++i) {
    const MlaSequenceSpan& s = a.sequences[i];
    seqs.push_back({i, s.first_token, s.num_tokens, s.context_len});
  }
  kernels::MhaPrefillParams p;
  p.num_heads = a.num_heads;
  p.nope_dim = a.nope_dim;
  p.v_dim = a.v_dim;
  p.q = a.q;
  p.q_token_stride = a.q_token_stride;
  p.q_head_stride = a.q_head_stride;
  p.cache = a.cache.cache;
  p.cache_bf16 = a.cache.dtype == WeightDType::kBFloat16;
  p.block_size = a.cache.block_size;
  p.latent_dim = a.cache.latent_dim;
  p.rope_dim = a.cache.rope_dim;
  p.block_tables = a.block_tables;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.kv_b = static_cast<const uint16_t*>(a.kv_b.data);
  p.sequences = seqs.data();
  p.num_sequences = static_cast<int32_t>(seqs.size());
  p.softmax_scale = a.softmax_scale;
  p.out = a.out;
  p.out_bf16 = a.out_bf16;
  p.out_token_stride = static_cast<int64_t>(a.num_heads) * a.v_dim;
  p.flash = mha_flash_kernel_;
  p.flash_pair_group = mha_flash_pair_group_;
  p.workspace_budget = mha_workspace_budget_;
  if (mha_fast_expand_) {
    p.gather = kernels::MhaGather::kOneLaunch;
    p.expand_gemm = [this](const kernels::MhaExpandGemm& g, cudaStream_t) {
      const bool ran =
          GemmOnCublasLt(g.keys, g.kv_width, g.latent_dim, g.entries, g.entries_stride,
                         WeightView(g.kv_b, WeightDType::kBFloat16), g.latent_dim, g.kv, g.kv_width,
                         /*c_bf16=*/true, /*accumulate=*/false);
      if (!status().ok()) return cudaErrorUnknown;  // recorded by GemmOnCublasLt
      return ran ? cudaSuccess : cudaErrorNotSupported;
    };
  } else {
    p.gather = kernels::MhaGather::kPerSequence;
  }
  if (!kernels::MhaPrefillSupported(p)) return false;
  OpTimer timer(this, "MhaPrefillAttention");
  p.workspace_bytes = kernels::MhaPrefillWorkspaceBytes(p);
  auto workspace = AllocateScratch(std::max<size_t>(p.workspace_bytes, 1));
  p.workspace = workspace->data();
  cublasStatus_t blas = CUBLAS_STATUS_SUCCESS;
  const cudaError_t e = kernels::MhaPrefillBf16(p, cublas_, stream_, &blas);
  CheckKernelOrBlas(e, blas, "kernels::MhaPrefillBf16");
  return true;
}

namespace {

// The routing fields NoauxTcRouteParams and RouteTokensParams share, from the backend's args
// (router_logits aside: RouteTokens makes its own).
template <typename Params>
void SetRouting(const NoauxTcRouteArgs& a, Params* p) {
  p->num_tokens = a.num_tokens;
  p->num_experts = a.num_experts;
  p->correction_bias = a.correction_bias;
  p->num_groups = a.num_groups;
  p->topk_groups = a.topk_groups;
  p->top_k = a.top_k;
  p->normalize = a.normalize;
  p->scaling_factor = a.scaling_factor;
  p->topk_ids = a.topk_ids;
  p->topk_weights = a.topk_weights;
}

}  // namespace

void CudaBackend::NoauxTcRoute(const NoauxTcRouteArgs& a) {
  OpTimer timer(this, "NoauxTcRoute");
  kernels::NoauxTcRouteParams p;
  SetRouting(a, &p);
  p.router_logits = a.router_logits;
  Check(kernels::NoauxTcRouteF32(p, stream_), "kernels::NoauxTcRouteF32");
}

void CudaBackend::RouteTokens(const RouteTokensArgs& a) {
  const NoauxTcRouteArgs& r = a.route;
  if (!fused_router_ || r.num_tokens <= 0 || r.num_tokens > kFusedRouterMaxTokens ||
      r.num_experts <= 0 || r.num_experts > kernels::kMaxFusedRouterExperts) {
    Backend::RouteTokens(a);
    return;
  }
  kernels::RouteTokensParams p;
  SetRouting(r, &p);
  p.hidden_size = FitsInt(a.hidden_size) ? static_cast<int32_t>(a.hidden_size) : -1;
  p.hidden = a.norm.weight != nullptr ? a.norm.out : a.hidden;
  p.router_weight = a.router_weight;
  p.tile_counters = route_tile_counters_;
  p.expert_counts = a.expert_counts;
  p.count_limit = a.count_limit;
  // The logits: resident (SetDecodeMoeResidentWorkspaces: no graph memory nodes around the
  // router, so the edge from it to the MoE block's gate_up is programmatic) or scratch. r.num_tokens <= kFusedRouterMaxTokens
  // and r.num_experts <= kMaxFusedRouterExperts (above): they fit kResidentLogitsBytes.
  std::unique_ptr<DeviceBuffer> logits;
  if (decode_moe_resident_workspaces_) {
    p.router_logits = static_cast<float*>(resident_workspace_);
  } else {
    logits = AllocateScratch(static_cast<size_t>(r.num_tokens) * r.num_experts * sizeof(float));
    p.router_logits = logits->as<float>();
  }
  if (!kernels::RouteTokensSupported(p)) {
    Backend::RouteTokens(a);
    return;
  }
  if (a.norm.weight != nullptr) {
    if (router_norm_ && a.norm.out != nullptr) {
      kernels::RouteTokensParams with_norm = p;
      with_norm.norm_x = a.norm.x;
      with_norm.norm_y = a.norm.y;
      with_norm.norm_weight = a.norm.weight;
      with_norm.norm_eps = a.norm.eps;
      with_norm.normed = a.norm.out;
      with_norm.normed_bf16 = a.norm.out_bf16;
      if (kernels::RouteTokensSupported(with_norm)) {
        OpTimer timer(this, "RouteTokens");
        Check(kernels::RouteTokensF32(with_norm, stream_), "kernels::RouteTokensF32");
        return;
      }
    }
    AddRmsNorm(r.num_tokens, a.hidden_size, a.norm.x, a.norm.y, a.norm.weight, a.norm.eps,
               a.norm.out, a.norm.out_bf16);
  }
  OpTimer timer(this, "RouteTokens");
  Check(kernels::RouteTokensF32(p, stream_), "kernels::RouteTokensF32");
}

void CudaBackend::AccumulateExpertCounts(int64_t n, const int32_t* ids, int64_t num_experts,
                                         const int32_t* count_limit, int64_t* counts) {
  OpTimer timer(this, "AccumulateExpertCounts");
  Check(kernels::AccumulateExpertCounts(n, ids, num_experts, count_limit, counts, stream_),
        "kernels::AccumulateExpertCounts");
}

void CudaBackend::ArgmaxRows(int64_t rows, int64_t vocab, const float* logits, int32_t* out) {
  OpTimer timer(this, "ArgmaxRows");
  auto workspace = AllocateScratch(kernels::ArgmaxWorkspaceBytes(rows, vocab));
  Check(kernels::ArgmaxRowsF32(rows, vocab, logits, workspace->data(), out, stream_),
        "kernels::ArgmaxRowsF32");
}

void CudaBackend::GreedySampleRows(int64_t rows, int64_t vocab, const float* logits, int32_t* token,
                                   float* logprob) {
  OpTimer timer(this, "GreedySampleRows");
  auto workspace = AllocateScratch(kernels::ArgmaxWorkspaceBytes(rows, vocab));
  Check(
      kernels::GreedySampleRowsF32(rows, vocab, logits, workspace->data(), token, logprob, stream_),
      "kernels::GreedySampleRowsF32");
}

void CudaBackend::SampleRows(int64_t rows, int64_t vocab, const float* logits,
                             const RowSamplingParams* params, int32_t* token, float* logprob) {
  OpTimer timer(this, "SampleRows");
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max()) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("SampleRows: vocab must be in [1, 2^31), got ", vocab)));
    return;
  }
  Check(kernels::SampleRowsF32(rows, vocab, logits, params, token, logprob, stream_),
        "kernels::SampleRowsF32");
}

void CudaBackend::TopLogprobsRows(int64_t rows, int64_t vocab, const float* logits, int32_t n,
                                  int32_t* ids, float* logprobs) {
  OpTimer timer(this, "TopLogprobsRows");
  if (n < 1 || n > kMaxTopLogprobs) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("TopLogprobsRows: n must be in [1, ", kMaxTopLogprobs, "], got ", n)));
    return;
  }
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max()) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("TopLogprobsRows: vocab must be in [1, 2^31), got ", vocab)));
    return;
  }
  Check(kernels::TopLogprobsF32(rows, vocab, logits, n, ids, logprobs, stream_),
        "kernels::TopLogprobsF32");
}

bool CudaBackend::RoutedExperts(const RoutedExpertsArgs& a) {
  if (a.num_experts < 1 || a.num_experts > kernels::kMaxMoeSlots || a.hidden_size % 8 != 0 ||
      a.inter % 8 != 0 || a.num_tokens < 0 || a.top_k < 1) {
    return false;
  }
  // Decode and small prefills: everything stays on the device (no host synchronisation, so the
  // step can be captured in a CUDA graph). Larger batches: cuBLAS tensor-core GEMMs per expert,
  // fed with the group sizes through one small device-to-host copy.
  // While the stream is being captured into a CUDA graph, the host copy of the cuBLAS path
  // would fail the capture: take the device path then, at any size (correct, only slower).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  Check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
  const bool device_grouped =
      a.dtype == WeightDType::kBFloat16 &&
      (a.num_tokens <= kMaxFusedMoeTokens || capture != cudaStreamCaptureStatusNone ||
       decode_moe_algo_ != DecodeMoeAlgo::kAuto);
  const DecodeMoeAlgo decode_algo = DecodeMoeAlgoFor(a.num_tokens);
  OpTimer timer(this, device_grouped ? "RoutedExperts" : "RoutedExpertsCublas");
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  const int32_t E = a.num_experts;
  const bool chunked =
      !device_grouped && expert_gemm_algo_ == kernels::ExpertGemmCublasAlgo::kChunked;
  const bool planned = device_grouped && decode_algo == DecodeMoeAlgo::kPlannedCublas;
  const int32_t row_align = chunked ? ChunkRowsFor(T * K / E) : planned ? PlannedChunkRows(T) : 1;
  const int64_t rows =
      std::max<int64_t>(1, kernels::MoePermutedRowsBound(static_cast<int32_t>(T),
                                                         static_cast<int32_t>(K), E, row_align));
  if (!FitsInt(rows * std::max(H, 2 * I))) {
    Record(
        absl::InvalidArgumentError(absl::StrCat("CudaBackend::RoutedExperts: ", T, " tokens x top-",
                                                K, " is beyond int range for the expert GEMMs")));
    return true;
  }
  // Counts then offsets in one buffer, so the cuBLAS path copies both back at once.
  auto plan = Allocate((2 * E + 1) * sizeof(int32_t));
  auto choice_row = AllocateScratch(std::max<int64_t>(1, T * K) * sizeof(int32_t));
  auto row_token = AllocateScratch(rows * sizeof(int32_t));
  // bf16 weights gather the rows straight into bf16 (the GEMM operand), except for the device
  // path's fp32-activation kernel.
  const bool gather_bf16 = a.dtype == WeightDType::kBFloat16 &&
                           !(device_grouped && decode_algo == DecodeMoeAlgo::kGroupedF32);
  auto permuted = AllocateScratch(rows * H * (gather_bf16 ? sizeof(uint16_t) : sizeof(float)));
  kernels::MoePermuteParams p;
  p.num_tokens = static_cast<int32_t>(T);
  p.top_k = static_cast<int32_t>(K);
  p.num_experts = E;
  p.num_slots = E;
  p.topk_ids = a.topk_ids;
  p.slot_of_expert = a.slot_of_expert;
  p.hidden_size = H;
  p.hidden = a.hidden;
  p.slot_counts = plan->as<int32_t>();
  p.slot_offsets = plan->as<int32_t>() + E;
  p.choice_row = choice_row->as<int32_t>();
  p.row_token = row_token->as<int32_t>();
  if (gather_bf16) {
    p.permuted_hidden_bf16 = permuted->as<uint16_t>();
  } else {
    p.permuted_hidden = permuted->as<float>();
  }
  p.row_align = row_align;
  // Prefill sizes plan with many blocks (kernels::MoePermutePlanWorkspaceBytes: 0 at decode).
  const int64_t plan_workspace_bytes =
      kernels::MoePermutePlanWorkspaceBytes(static_cast<int32_t>(T), static_cast<int32_t>(K), E);
  std::unique_ptr<DeviceBuffer> plan_workspace;
  if (plan_workspace_bytes > 0) {
    plan_workspace = AllocateScratch(plan_workspace_bytes);
    p.plan_workspace = plan_workspace->data();
  }
  {
    PhaseTimer phase(this, "RoutedExpertsCublas/permute", !device_grouped);
    Check(kernels::MoePermuteF32(p, stream_), "kernels::MoePermuteF32");
  }

  // The cuBLAS path with bf16 weights: gate_up and down write bf16 (as a bf16 PyTorch model
  // rounds each Linear's output), halving the GEMMs' output bytes and the SiLU-mul and combine
  // passes over them. The device path's GEMMs write fp32.
  const bool expert_out_bf16 = gather_bf16 && !device_grouped;
  auto expert_out =
      AllocateScratch(rows * H * (expert_out_bf16 ? sizeof(uint16_t) : sizeof(float)));
  if (device_grouped) {
    ExpertGemmsOnDevice(a, decode_algo, plan->as<int32_t>(), choice_row->as<int32_t>(), rows,
                        permuted->data(), expert_out->as<float>());
  } else if (!ExpertGemmsOnCublas(a, plan->as<int32_t>(), row_align, rows, permuted->data(),
                                  expert_out->data())) {
    return true;  // the error is recorded; the output is meaningless, as after any failed op
  }

  PhaseTimer phase(this, "RoutedExpertsCublas/combine", !device_grouped);
  // The combine overwrites out (no memset pass; the same bits as adding into zeros), except
  // on the device path with SetDecodeMoeSparseEpilogue(false) (the previous memset + add).
  const bool accumulate = device_grouped && !decode_moe_sparse_epilogue_;
  if (accumulate) {
    Check(cudaMemsetAsync(a.out, 0, T * H * sizeof(float), stream_), "cudaMemsetAsync");
  }
  kernels::MoeCombineParams c;
  c.num_tokens = static_cast<int32_t>(T);
  c.top_k = static_cast<int32_t>(K);
  c.hidden_size = H;
  c.choice_row = choice_row->as<int32_t>();
  c.topk_weights = a.topk_weights;
  if (expert_out_bf16) {
    c.expert_out_bf16 = expert_out->as<uint16_t>();
  } else {
    c.expert_out = expert_out->as<float>();
  }
  c.accumulate = accumulate;
  c.out = a.out;
  Check(kernels::MoeCombineF32(c, stream_), "kernels::MoeCombineF32");
  return true;
}

bool CudaBackend::DecodeMoeFusedFor(int64_t tokens, int64_t hidden_size) const {
  switch (decode_moe_fused_) {
    case DecodeMoeFused::kOff:
      return false;
    case DecodeMoeFused::kOn:
      return tokens >= 1 && tokens <= kernels::kMoeDecodeFusedMaxTokens;
    case DecodeMoeFused::kAuto:
      break;
  }
  // moe_block_decode_bench (4 layers in a CUDA graph, H200), µs a layer, the op sequence ->
  // fused, a warp-per-row pair (removed) / kPersistent: Moonlight 1 token 63.6 -> 58.0 / 50.2,
  // 2 tokens 77.6 -> 97.2 / 75.3; V3 1 token 220.7 -> 232.7 / 209.1, 2 tokens 353.3 -> 499.2 /
  // 405.3. kPipelined: Moonlight 2 tokens 68.5, V3 2 tokens 350.6 (the op sequence 351.8: no
  // faster, not taken). kStationary: Moonlight 1 token 39.9, V3 1 token 200.2; at 2 tokens it is
  // kPipelined.
  return tokens == 1 || (tokens == 2 && hidden_size <= kMaxAutoFusedMoeHidden);
}

kernels::MoeDecodeFusedKernels CudaBackend::DecodeMoeFusedKernelsFor(int64_t hidden_size) const {
  (void)hidden_size;  // one choice at every width measured (Moonlight, V3)
  if (!decode_moe_fused_kernels_auto_) return decode_moe_fused_kernels_;
  return kernels::MoeDecodeFusedKernels::kStationary;
}

bool CudaBackend::RoutedAndSharedExperts(const RoutedExpertsArgs& a) {
  if (!DecodeMoeFusedFor(a.num_tokens, a.hidden_size) || a.dtype != WeightDType::kBFloat16 ||
      DecodeMoeAlgoFor(a.num_tokens) != DecodeMoeAlgo::kGroupedF32 || a.top_k < 1 ||
      a.num_experts < 1 || a.inter <= 0 || a.inter % 8 != 0 || a.hidden_size % 8 != 0 ||
      !FitsInt(a.hidden_size) || !FitsInt(a.inter) || a.shared_inter <= 0 ||
      a.shared_inter % a.inter != 0 || a.shared_gate_up == nullptr || a.shared_down == nullptr ||
      a.top_k + a.shared_inter / a.inter > kernels::kMoeDecodeFusedMaxParts ||
      reinterpret_cast<uintptr_t>(a.hidden) % 16 != 0) {
    return false;
  }
  OpTimer timer(this, "RoutedAndSharedExperts");
  kernels::MoeDecodeFusedParams p;
  p.num_tokens = a.num_tokens;
  p.top_k = a.top_k;
  p.num_experts = a.num_experts;
  p.hidden_size = static_cast<int32_t>(a.hidden_size);
  p.inter = static_cast<int32_t>(a.inter);
  p.hidden = a.hidden;
  p.topk_ids = a.topk_ids;
  p.topk_weights = a.topk_weights;
  p.slot_of_expert = a.slot_of_expert;
  p.gate_up = reinterpret_cast<const uint16_t* const*>(a.gate_up);
  p.down = reinterpret_cast<const uint16_t* const*>(a.down);
  p.shared_parts = static_cast<int32_t>(a.shared_inter / a.inter);
  p.shared_gate_up = static_cast<const uint16_t*>(a.shared_gate_up);
  p.shared_down = static_cast<const uint16_t*>(a.shared_down);
  p.out = a.out;
  LaunchMoeDecodeFused(p);
  return true;
}

void CudaBackend::LaunchMoeDecodeFused(kernels::MoeDecodeFusedParams p) {
  const size_t act_bytes =
      kernels::MoeDecodeFusedActFloats(p.num_tokens, p.top_k, p.shared_parts, p.inter) *
      sizeof(float);
  // Resident (SetDecodeMoeResidentWorkspaces) where it fits: no graph memory nodes between the
  // kernel before (the router) and gate_up, or after down. Reused by every call: each call's
  // gate_up writes act only after its PDL wait, which returns when every earlier grid (the
  // previous call's down among them) has completed.
  std::unique_ptr<DeviceBuffer> act;
  if (decode_moe_resident_workspaces_ && act_bytes <= kResidentActBytes) {
    p.act = reinterpret_cast<float*>(static_cast<char*>(resident_workspace_) +
                                     kResidentLogitsBytes);
  } else {
    act = AllocateScratch(act_bytes);
    p.act = act->as<float>();
  }
  p.kernels = DecodeMoeFusedKernelsFor(p.hidden_size);
  p.gate_up_blocks_per_sm = decode_moe_fused_gate_up_blocks_per_sm_;
  p.down_blocks_per_sm = decode_moe_fused_down_blocks_per_sm_;
  Check(kernels::MoeDecodeFusedF32(p, stream_), "kernels::MoeDecodeFusedF32");
}

bool CudaBackend::NormedDenseMlp(const DenseMlpArgs& a) {
  if (!decode_dense_mlp_fused_ || a.rows != 1 || a.gate_up.dtype != WeightDType::kBFloat16 ||
      a.down.dtype != WeightDType::kBFloat16 || a.hidden_size <= 0 || a.hidden_size % 8 != 0 ||
      a.inter <= 0 || a.inter % 8 != 0 || !FitsInt(a.hidden_size) || !FitsInt(a.inter) ||
      a.x == nullptr || a.norm_weight == nullptr || a.normed == nullptr || a.out == nullptr ||
      a.gate_up.data == nullptr || a.down.data == nullptr ||
      reinterpret_cast<uintptr_t>(a.normed) % 16 != 0) {
    return false;
  }
  OpTimer timer(this, "NormedDenseMlp");
  Check(kernels::AddRmsNormF32(a.rows, a.hidden_size, a.x, a.y, a.norm_weight, a.eps, a.normed,
                               nullptr, stream_),
        "kernels::AddRmsNormF32");
  // The MLP is the fused MoE block's shared MLP alone (top_k 0), as one part: a part split
  // changes neither the work nor (kStationary, kPipelined) the order of the sums.
  kernels::MoeDecodeFusedParams p;
  p.num_tokens = 1;
  p.top_k = 0;
  p.hidden_size = static_cast<int32_t>(a.hidden_size);
  p.inter = static_cast<int32_t>(a.inter);
  p.hidden = a.normed;
  p.shared_parts = 1;
  p.shared_gate_up = static_cast<const uint16_t*>(a.gate_up.data);
  p.shared_down = static_cast<const uint16_t*>(a.down.data);
  p.out = a.out;
  LaunchMoeDecodeFused(p);
  return true;
}

CudaBackend::DecodeMoeAlgo CudaBackend::DecodeMoeAlgoFor(int64_t tokens) const {
  if (decode_moe_algo_ != DecodeMoeAlgo::kAuto) return decode_moe_algo_;
  // Fastest per size (grouped_gemm_bench at 1 and 8 tokens; moe_decode_bench, a whole layer in
  // a CUDA graph, at 64-256 tokens, where the planned chunks beat the streaming kernel by 8 %
  // (Moonlight) and 2 % (V3) at 64 tokens; the thresholds between the sizes are not measured):
  // the CUDA-core kernel for 1-2 rows per expert, the planned cuBLAS chunks above.
  if (tokens <= 2) return DecodeMoeAlgo::kGroupedF32;
  return DecodeMoeAlgo::kPlannedCublas;
}

int32_t CudaBackend::PlannedChunkRows(int64_t tokens) const {
  if (planned_chunk_rows_ > 0) return planned_chunk_rows_;
  return tokens <= 32 ? 8 : 48;
}

absl::Status CudaBackend::SetPlannedChunkRows(int32_t rows) {
  if (rows < 0 || rows > kMaxPlannedChunkRows) {
    return absl::InvalidArgumentError(absl::StrCat("SetPlannedChunkRows: rows must be in [0, ",
                                                   kMaxPlannedChunkRows, "], got ", rows));
  }
  planned_chunk_rows_ = rows;
  return absl::OkStatus();
}

void CudaBackend::ExpertGemmsOnDevice(const RoutedExpertsArgs& a, DecodeMoeAlgo algo,
                                      const int32_t* plan, const int32_t* choice_row, int64_t rows,
                                      const void* permuted, float* expert_out) {
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  const int32_t E = a.num_experts;
  const int32_t* offsets = plan + E;
  // The planned cuBLAS GEMMs write gate_up in bf16 (as the prefill path), the kernels fp32.
  const bool gate_up_bf16 = algo == DecodeMoeAlgo::kPlannedCublas;
  auto gate_up = AllocateScratch(rows * 2 * I * (gate_up_bf16 ? sizeof(uint16_t) : sizeof(float)));
  // The own kernels' parameters (GroupedGemmBf16Params / GroupedGemmBf16StreamParams share
  // these fields): the slots, then gate_up's or down's shape and weights.
  auto grouped = [&](auto& g) {
    g.num_slots = E;
    g.max_rows = static_cast<int32_t>(T * K);
    g.slot_offsets = offsets;
    g.rows_per_slot_hint = static_cast<int32_t>(T);  // a token's top-k experts are distinct
  };
  auto gate_up_shape = [&](auto& g) {
    g.n = static_cast<int32_t>(2 * I);
    g.k = static_cast<int32_t>(H);
    g.weights = reinterpret_cast<const uint16_t* const*>(a.gate_up);
  };
  auto down_shape = [&](auto& g) {
    g.n = static_cast<int32_t>(H);
    g.k = static_cast<int32_t>(I);
    g.weights = reinterpret_cast<const uint16_t* const*>(a.down);
  };
  if (algo == DecodeMoeAlgo::kGroupedF32) {
    kernels::GroupedGemmBf16Params g;
    grouped(g);
    gate_up_shape(g);
    g.x = static_cast<const float*>(permuted);
    g.y = gate_up->as<float>();
    Check(kernels::GroupedGemmBf16(g, stream_), "kernels::GroupedGemmBf16(gate_up)");
    auto act = AllocateScratch(rows * I * sizeof(float));
    Check(kernels::SiluMulF32(T * K, I, gate_up->as<float>(), act->as<float>(), stream_),
          "kernels::SiluMulF32");
    down_shape(g);
    g.x = act->as<float>();
    g.y = expert_out;
    Check(kernels::GroupedGemmBf16(g, stream_), "kernels::GroupedGemmBf16(down)");
    return;
  }
  auto act = AllocateScratch(rows * I * sizeof(uint16_t));
  if (algo == DecodeMoeAlgo::kStream) {
    kernels::GroupedGemmBf16StreamParams g;
    grouped(g);
    gate_up_shape(g);
    g.x = static_cast<const uint16_t*>(permuted);
    g.y = gate_up->as<float>();
    Check(kernels::GroupedGemmBf16Stream(g, stream_), "kernels::GroupedGemmBf16Stream(gate_up)");
    Check(kernels::SiluMulF32ToBf16(T * K, I, gate_up->as<float>(), act->as<uint16_t>(), stream_),
          "kernels::SiluMulF32ToBf16");
    down_shape(g);
    g.x = act->as<uint16_t>();
    g.y = expert_out;
    Check(kernels::GroupedGemmBf16Stream(g, stream_), "kernels::GroupedGemmBf16Stream(down)");
    return;
  }
  // kPlannedCublas: the pointer arrays of both GEMMs from the device counts, then one batched
  // call each over a fixed number of chunks (the dummies, spread between the real chunks and
  // reading their weights, compute garbage into dummy_y).
  const int32_t C = PlannedChunkRows(T);
  const int32_t batch = kernels::ExpertGemmBatchBound(T * K, E, C);
  auto pointers = AllocateScratch(2 * 3 * static_cast<size_t>(batch) * sizeof(void*));
  auto dummy_x = AllocateScratch(C * std::max(H, I) * sizeof(uint16_t));
  auto dummy_y = AllocateScratch(C * std::max(2 * I, H) * sizeof(float));
  kernels::ExpertGemmPlanParams p;
  p.num_slots = E;
  p.slot_counts = plan;
  p.slot_offsets = offsets;
  p.chunk_rows = C;
  p.batch = batch;
  p.num_gemms = 2;
  p.interleave_dummies = true;
  void** ptrs = static_cast<void**>(pointers->data());
  // gate_up: permuted [rows, H] bf16 -> gate_up [rows, 2I] bf16; down: act [rows, I] bf16 ->
  // expert_out [rows, H] fp32.
  const struct {
    const void* const* weights;
    const void* x;
    int64_t x_row_bytes;
    void* y;
    int64_t y_row_bytes;
  } gemms[2] = {{a.gate_up, permuted, H * 2, gate_up->data(), 2 * I * 2},
                {a.down, act->data(), I * 2, expert_out, H * 4}};
  for (int i = 0; i < 2; ++i) {
    kernels::ExpertGemmPlanGemm& g = p.gemm[i];
    g.weights = gemms[i].weights;
    g.x = gemms[i].x;
    g.x_row_bytes = gemms[i].x_row_bytes;
    g.y = gemms[i].y;
    g.y_row_bytes = gemms[i].y_row_bytes;
    g.dummy_x = dummy_x->data();
    g.dummy_y = dummy_y->data();
    g.pointers = ptrs + 3 * batch * i;
  }
  // Inside a CUDA graph, above kMaxFixedBatchGraphMoeTokens: each GEMM behind a switch node
  // over batch sizes, the planner picking the smallest that holds the step's real chunks (so
  // most dummies are never launched). Eagerly, at fewer tokens (where the switches' few µs
  // were not measured against the dummies they save), or if the graph refuses the handles:
  // the one fixed batch.
  cudaGraph_t graph = nullptr;
  int32_t num_buckets = 0;
  if (decode_moe_graph_buckets_ && T > kMaxFixedBatchGraphMoeTokens) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    if (cudaStreamGetCaptureInfo(stream_, &capture, nullptr, &graph) == cudaSuccess &&
        capture == cudaStreamCaptureStatusActive) {
      num_buckets = kernels::ExpertGemmBatchBuckets(
          T * K, E, C, kernels::kMaxExpertGemmBatchBuckets, p.bucket_batch);
      for (int i = 0; i < 2 && num_buckets > 0; ++i) {
        if (cudaGraphConditionalHandleCreate(&p.bucket_handle[i], graph, num_buckets - 1,
                                             cudaGraphCondAssignDefault) != cudaSuccess) {
          (void)cudaGetLastError();
          num_buckets = 0;
        }
      }
      p.num_buckets = num_buckets;
    }
  }
  Check(kernels::PlanExpertGemmBatches(p, stream_), "kernels::PlanExpertGemmBatches");
  // gemm 0 (gate_up) or 1 (down) at batch b, on the cuBLAS handle's stream.
  auto run_gemm = [&](int gi, int32_t b) {
    if (gi == 0) {
      CheckBlas(kernels::PlannedExpertGemmsBf16(cublas_, ptrs, b, static_cast<int32_t>(2 * I),
                                                static_cast<int32_t>(H), C, /*out_bf16=*/true),
                "PlannedExpertGemmsBf16(gate_up)");
    } else {
      CheckBlas(
          kernels::PlannedExpertGemmsBf16(cublas_, ptrs + 3 * batch, b, static_cast<int32_t>(H),
                                          static_cast<int32_t>(I), C, /*out_bf16=*/false),
          "PlannedExpertGemmsBf16(down)");
    }
  };
  auto gemm = [&](int gi) {
    if (num_buckets == 0) {
      run_gemm(gi, batch);
      return;
    }
    CaptureSwitch(graph, p.bucket_handle[gi], num_buckets,
                  [&](int32_t i) { run_gemm(gi, p.bucket_batch[i]); });
  };
  gemm(0);
  // The real rows only (choice_row: T * K entries, each real row once): the chunks' padding
  // rows (most of the rows in use: about 12 real rows per 32-row chunk at Moonlight's 128
  // tokens) keep garbage that the down GEMM turns into output rows nobody reads. Without the sparse
  // epilogue: every row of the padded layout in use (offsets[E], known on the device only).
  if (decode_moe_sparse_epilogue_) {
    Check(kernels::SiluMulBf16ListedRows(T * K, choice_row, I, gate_up->as<uint16_t>(),
                                         act->as<uint16_t>(), stream_),
          "kernels::SiluMulBf16ListedRows");
  } else {
    Check(kernels::SiluMulBf16(rows, I, gate_up->as<uint16_t>(), act->as<uint16_t>(), stream_,
                               offsets + E),
          "kernels::SiluMulBf16");
  }
  gemm(1);
}

void CudaBackend::CaptureSwitch(cudaGraph_t graph, cudaGraphConditionalHandle handle, int32_t size,
                                const std::function<void(int32_t)>& body) {
  const cudaGraphNode_t* deps = nullptr;
  const cudaGraphEdgeData* edges = nullptr;
  size_t num_deps = 0;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  if (!Check(
          cudaStreamGetCaptureInfo(stream_, &capture, nullptr, nullptr, &deps, &edges, &num_deps),
          "cudaStreamGetCaptureInfo")) {
    return;
  }
  // Plain edges into the switch (programmatic ones join kernels only).
  std::vector<cudaGraphNode_t> dep_nodes(deps, deps + num_deps);
  cudaGraphNodeParams params = {};
  params.type = cudaGraphNodeTypeConditional;
  params.conditional.handle = handle;
  params.conditional.type = cudaGraphCondTypeSwitch;
  params.conditional.size = static_cast<unsigned>(size);
  cudaGraphNode_t node = nullptr;
  if (!Check(cudaGraphAddNode(&node, graph, dep_nodes.data(), nullptr, dep_nodes.size(), &params),
             "cudaGraphAddNode(switch)")) {
    return;
  }
  if (switch_stream_ == nullptr &&
      !Check(cudaStreamCreateWithFlags(&switch_stream_, cudaStreamNonBlocking),
             "cudaStreamCreate(switch)")) {
    return;
  }
  // Each body recorded from switch_stream_ (the cuBLAS handle moved there meanwhile; setting a
  // stream resets cuBLAS's workspace, so ours is set again each time).
  for (int32_t i = 0; i < size; ++i) {
    if (!Check(cudaStreamBeginCaptureToGraph(switch_stream_, params.conditional.phGraph_out[i],
                                             nullptr, nullptr, 0, cudaStreamCaptureModeThreadLocal),
               "cudaStreamBeginCaptureToGraph")) {
      break;
    }
    CheckBlas(cublasSetStream(cublas_, switch_stream_), "cublasSetStream");
    CheckBlas(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes),
              "cublasSetWorkspace");
    body(i);
    cudaGraph_t recorded = nullptr;
    Check(cudaStreamEndCapture(switch_stream_, &recorded), "cudaStreamEndCapture(switch body)");
    CheckBlas(cublasSetStream(cublas_, stream_), "cublasSetStream");
    CheckBlas(cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspaceBytes),
              "cublasSetWorkspace");
  }
  Check(cudaStreamUpdateCaptureDependencies(stream_, &node, nullptr, 1,
                                            cudaStreamSetCaptureDependencies),
        "cudaStreamUpdateCaptureDependencies");
}

bool CudaBackend::ExpertGemmsOnCublas(const RoutedExpertsArgs& a, const int32_t* plan,
                                      int32_t chunk_rows, int64_t rows, const void* permuted,
                                      void* expert_out) {
  const int64_t E = a.num_experts, H = a.hidden_size, I = a.inter;
  // The one host synchronisation of this path: cuBLAS takes the group sizes on the host.
  std::vector<int32_t> host_plan(2 * E + 1);  // counts [E] | offsets [E + 1]
  {
    PhaseTimer phase(this, "RoutedExpertsCublas/plan_to_host", true);
    if (!Check(cudaMemcpyAsync(host_plan.data(), plan, host_plan.size() * sizeof(int32_t),
                               cudaMemcpyDeviceToHost, stream_),
               "cudaMemcpyAsync(expert counts)") ||
        !Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize")) {
      return false;
    }
  }
  std::vector<const void*> gate_up(E), down(E);
  if (a.gate_up_host != nullptr && a.down_host != nullptr) {
    gate_up.assign(a.gate_up_host, a.gate_up_host + E);
    down.assign(a.down_host, a.down_host + E);
  } else if (!Check(cudaMemcpyAsync(gate_up.data(), a.gate_up, E * sizeof(void*),
                                    cudaMemcpyDeviceToHost, stream_),
                    "cudaMemcpyAsync(gate_up table)") ||
             !Check(cudaMemcpyAsync(down.data(), a.down, E * sizeof(void*), cudaMemcpyDeviceToHost,
                                    stream_),
                    "cudaMemcpyAsync(down table)") ||
             !Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize")) {
    return false;
  }
  // bf16 weights: the activation operands are rounded to bf16 (the permutation did it for the
  // hidden rows), as every bf16 GEMM of the backend, and both GEMMs write bf16.
  const bool bf16 = a.dtype == WeightDType::kBFloat16;
  const int64_t pointer_count =
      std::max(kernels::ExpertGemmPointerCount(rows, chunk_rows),
               kernels::ExpertGemmGroupedPointerCount(static_cast<int32_t>(E)));
  auto pointers = AllocateScratch(pointer_count * sizeof(void*));
  auto gate_up_out = AllocateScratch(rows * 2 * I * (bf16 ? sizeof(uint16_t) : sizeof(float)));
  kernels::ExpertGemmCublasParams g;
  g.num_slots = static_cast<int32_t>(E);
  g.host_counts = host_plan.data();
  g.host_offsets = host_plan.data() + E;
  g.host_weights = gate_up.data();
  g.weight_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  g.n = static_cast<int32_t>(2 * I);
  g.k = static_cast<int32_t>(H);
  g.x = permuted;
  g.y = gate_up_out->data();
  g.output_type = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  g.chunk_rows = chunk_rows;
  g.device_pointers = static_cast<void**>(pointers->data());
  g.device_pointers_size = pointer_count;
  {
    PhaseTimer phase(this, "RoutedExpertsCublas/gate_up", true);
    if (!ExpertGemms(g, "gate_up")) return false;
  }
  // Padding rows (kChunked) go through SiLU-mul too: meaningless values nobody reads.
  auto act = AllocateScratch(rows * I * (bf16 ? sizeof(uint16_t) : sizeof(float)));
  {
    PhaseTimer phase(this, "RoutedExpertsCublas/silu_mul", true);
    const int64_t act_rows = host_plan[2 * E];  // padded total
    if (bf16) {
      Check(kernels::SiluMulBf16(act_rows, I, gate_up_out->as<uint16_t>(), act->as<uint16_t>(),
                                 stream_),
            "kernels::SiluMulBf16");
    } else {
      Check(kernels::SiluMulF32(act_rows, I, gate_up_out->as<float>(), act->as<float>(), stream_),
            "kernels::SiluMulF32");
    }
  }
  g.host_weights = down.data();
  g.n = static_cast<int32_t>(H);
  g.k = static_cast<int32_t>(I);
  g.x = act->data();
  g.y = expert_out;
  PhaseTimer phase(this, "RoutedExpertsCublas/down", true);
  return ExpertGemms(g, "down");
}

bool CudaBackend::ExpertGemms(const kernels::ExpertGemmCublasParams& g, const char* which) {
  cublasStatus_t st = kernels::ExpertGemmsCublas(cublas_, g, expert_gemm_algo_);
  if (st == CUBLAS_STATUS_NOT_SUPPORTED &&
      expert_gemm_algo_ != kernels::ExpertGemmCublasAlgo::kPerExpert) {
    // A cuBLAS without this batched / grouped type combination: per expert from now on (it
    // takes any layout, the padded one of kChunked included).
    LOG(WARNING) << "CudaBackend: cuBLAS refused the " << ExpertGemmAlgoName(expert_gemm_algo_)
                 << " expert GEMM; using one cuBLAS GEMM per expert";
    expert_gemm_algo_ = kernels::ExpertGemmCublasAlgo::kPerExpert;
    st = kernels::ExpertGemmsCublas(cublas_, g, expert_gemm_algo_);
  }
  const std::string call = absl::StrCat("kernels::ExpertGemmsCublas(", which, ", ",
                                        ExpertGemmAlgoName(expert_gemm_algo_), ")");
  return CheckBlas(st, call.c_str());
}

}  // namespace deepinfer
