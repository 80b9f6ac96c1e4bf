// CudaBackend's device side: creation (stream, memory pool, cuBLAS and its workspace), buffers
// and copies, CUDA graph capture, error recording and op timing. The ops are in
// cuda_backend_gemm.cc, cuda_backend_elementwise.cc, cuda_backend_attention.cc,
// cuda_backend_moe.cc and cuda_backend_sampling.cc.
#include "worker/backend/cuda/cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <limits>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "kernels/common/capture_deps.h"
#include "kernels/common/pdl.h"
#include "kernels/moe/noaux_tc_router_fused.h"
#include "worker/backend/cuda/cuda_status.h"
#include "worker/backend/cuda/cuda_v4_ops.h"
#include "worker/backend/cuda/op_timer.h"

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
                                                                 WeightDType weight_dtype,
                                                                 const CudaTuning& tuning) {
  if (tuning.mla_decode_small_max_context < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaBackend: CudaTuning::mla_decode_small_max_context must be >= 1, got ",
                     tuning.mla_decode_small_max_context));
  }
  if (tuning.fp8_w8a8_min_rows < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaBackend: CudaTuning::fp8_w8a8_min_rows must be >= 1, got ", tuning.fp8_w8a8_min_rows));
  }
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
  if (!st.ok()) {
    if (cublas != nullptr) cublasDestroy(cublas);
    if (workspace != nullptr) cudaFree(workspace);
    if (counter != nullptr) cudaFree(counter);
    if (tile_counters != nullptr) cudaFree(tile_counters);
    cudaStreamDestroy(stream);
    return st;
  }
  return std::unique_ptr<CudaBackend>(new CudaBackend(device, weight_dtype, tuning, stream, cublas,
                                                      pool, workspace, counter,
                                                      static_cast<uint32_t*>(tile_counters)));
}

CudaBackend::CudaBackend(int device, WeightDType weight_dtype, const CudaTuning& tuning,
                         cudaStream_t stream, cublasHandle_t cublas, cudaMemPool_t pool,
                         void* cublas_workspace, unsigned int* staged_gemv_counter,
                         uint32_t* route_tile_counters)
    : device_(device),
      weight_dtype_(weight_dtype),
      tuning_(tuning),
      stream_(stream),
      cublas_(cublas),
      pool_(pool),
      cublas_workspace_(cublas_workspace),
      staged_gemv_counter_(staged_gemv_counter),
      route_tile_counters_(route_tile_counters),
      v4_ops_(std::make_unique<CudaV4Ops>(this)) {
  // Made here, never while a stream is captured; a device or cuBLASLt without it keeps the
  // other FP8 paths. Its prefill shapes are timed as the bf16 ones (CudaTuning::gemm_autotune).
  if (CublasLtFp8Gemm::DeviceSupports(device)) {
    auto made =
        CublasLtFp8Gemm::Create(cublas_workspace_, kCublasWorkspaceBytes, tuning_.gemm_autotune);
    if (made.ok()) lt_fp8_ = std::move(made).value();
  }
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(device_);
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  lt_tuner_.reset();
  lt_fp8_.reset();
  for (auto& [key, maps] : fp8_swap_maps_) cudaFree(maps.device);
  for (auto& [key, maps] : mxfp4_swap_maps_) cudaFree(maps.device);
  for (auto& [key, shared] : fp8_swap_shared_) cudaFree(shared.storage);
  cublasDestroy(cublas_);
  cudaFree(cublas_workspace_);
  cudaFree(staged_gemv_counter_);
  cudaFree(route_tile_counters_);
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
    capture_aside_ = options.tokens > 0 && options.tokens <= kAsideMaxTokens;
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

V4Ops* CudaBackend::v4_ops() { return v4_ops_.get(); }

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

namespace {

class PinnedStagingBuffer : public HostStagingBuffer {
 public:
  PinnedStagingBuffer(void* data, size_t bytes) : data_(data), bytes_(bytes) {}
  ~PinnedStagingBuffer() override {
    if (cudaError_t err = cudaFreeHost(data_); err != cudaSuccess) {
      LOG(ERROR) << CudaStatus(err, "cudaFreeHost");
    }
  }
  void* data() override { return data_; }
  size_t size_bytes() const override { return bytes_; }

 private:
  void* data_;
  size_t bytes_;
};

}  // namespace

std::unique_ptr<HostStagingBuffer> CudaBackend::AllocateHostStaging(size_t bytes) {
  cudaSetDevice(device_);
  void* ptr = nullptr;
  const cudaError_t err = cudaHostAlloc(&ptr, std::max<size_t>(bytes, 1), cudaHostAllocPortable);
  if (err == cudaSuccess) return std::make_unique<PinnedStagingBuffer>(ptr, bytes);
  cudaGetLastError();  // not sticky; the copy from pageable memory still works
  static std::once_flag logged;
  std::call_once(logged, [&] {
    LOG(WARNING) << "CudaBackend: page-locked staging unavailable, loading from pageable memory: "
                 << CudaStatus(err, "cudaHostAlloc");
  });
  return Backend::AllocateHostStaging(bytes);
}

void CudaBackend::CopyToDeviceAsync(const void* host, size_t bytes, void* device) {
  OpTimer timer(this, "CopyToDeviceAsync");
  if (bytes == 0) return;
  cudaSetDevice(device_);
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

void CudaBackend::UseOnThisThread() { Check(cudaSetDevice(device_), "cudaSetDevice"); }

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

}  // namespace deepinfer
