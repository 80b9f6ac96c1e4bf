// NcclCommunicator: non-blocking NCCL communicator, a watchdog for deadlines and async errors.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "worker/comm/nccl_window.h"

namespace deepinfer::comm {
namespace {

// How often the watchdog and the waiting calls look at NCCL and the stream.
constexpr absl::Duration kWatchdogPeriod = absl::Milliseconds(5);
// Destroying a healthy communicator flushes its operations (ncclCommFinalize) for at most
// this long before falling back to ncclCommAbort.
constexpr absl::Duration kFinalizeBound = absl::Seconds(10);

// Sets the calling thread's current device for a scope and restores it: Abort() and the
// destructor may run on a thread that drives another GPU (RankGroup fails every local rank).
class ScopedDevice {
 public:
  explicit ScopedDevice(int device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    if (previous_ != device) (void)cudaSetDevice(device);
  }
  ~ScopedDevice() {
    int now = -1;
    if (previous_ >= 0 && cudaGetDevice(&now) == cudaSuccess && now != previous_) {
      (void)cudaSetDevice(previous_);
    }
  }
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

 private:
  int previous_ = -1;
};

// NVLink multicast must stay off on our machines (docs/communicator.md); NCCL reads the
// variable when it initialises, so it is set before any NCCL call of this process.
void ForceNvlsOff() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* was = std::getenv("NCCL_NVLS_ENABLE");
    if (was != nullptr && std::strcmp(was, "0") != 0) {
      LOG(WARNING) << "NCCL_NVLS_ENABLE=" << was << " overridden to 0 (NVLink multicast must stay "
                   << "off on these machines)";
    }
    setenv("NCCL_NVLS_ENABLE", "0", 1);
  });
}

absl::Status CudaError(const std::string& what, const char* call, cudaError_t err) {
  std::string msg =
      absl::StrCat(what, ": ", call, ": ", cudaGetErrorName(err), ": ", cudaGetErrorString(err));
  if (err == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  if (err == cudaErrorInvalidDevice || err == cudaErrorNoDevice) {
    return absl::FailedPreconditionError(msg);
  }
  return absl::InternalError(msg);
}

absl::Status NcclError(const std::string& what, const char* call, ncclResult_t r, ncclComm_t comm) {
  const char* last = ncclGetLastError(comm);
  std::string msg = absl::StrCat(
      what, ": ", call, ": ", ncclGetErrorString(r),
      (last != nullptr && *last != '\0') ? absl::StrCat(" (", last, ")") : std::string());
  switch (r) {
    case ncclRemoteError:
    case ncclSystemError:
      return absl::UnavailableError(msg);
    case ncclInvalidArgument:
    case ncclInvalidUsage:
      return absl::InvalidArgumentError(msg);
    default:
      return absl::InternalError(msg);
  }
}

ncclDataType_t NcclType(DataType type) {
  return type == DataType::kFloat32 ? ncclFloat32 : ncclInt64;
}

ncclRedOp_t NcclOp(ReduceOp op) { return op == ReduceOp::kSum ? ncclSum : ncclMax; }

// NCCL's device API (nccl_device.h: windows, LSA pointers) came with 2.28.
constexpr int kNcclDeviceApiVersion = 22800;

// Why a rank cannot use a symmetric window; exchanged so that every rank gives up together.
enum WindowCode : size_t { kWindowOk = 0, kWindowNoDeviceHandle = 1, kWindowBadPointers = 2 };

// A window's check part (after the user's bytes) and what rank r writes there.
constexpr size_t kWindowCheckBytes = 256;
uint64_t WindowCheckWord(int rank) { return 0x6465657077696e00ull + static_cast<uint64_t>(rank); }

}  // namespace

size_t NcclCommunicator::UniqueIdBytes() { return NCCL_UNIQUE_ID_BYTES; }

absl::StatusOr<std::string> NcclCommunicator::NewUniqueId() {
  ForceNvlsOff();
  ncclUniqueId id;
  if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
    return NcclError("NCCL unique id", "ncclGetUniqueId", r, nullptr);
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    const NcclCommunicatorSpec& spec) {
  if (spec.world_size < 1 || spec.rank < 0 || spec.rank >= spec.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL group: rank ", spec.rank,
                                                   " is not in a world of size ", spec.world_size));
  }
  if (spec.unique_id.size() != NCCL_UNIQUE_ID_BYTES) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL group: unique id has ",
                                                   spec.unique_id.size(), " bytes, NCCL wants ",
                                                   NCCL_UNIQUE_ID_BYTES));
  }
  if (spec.device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("NCCL group: device ", spec.device, " is negative"));
  }
  if (spec.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("NCCL group: timeout must be positive");
  }
  std::unique_ptr<NcclCommunicator> c(new NcclCommunicator(spec));
  if (absl::Status s = c->Init(); !s.ok()) return s;
  return c;
}

NcclCommunicator::NcclCommunicator(const NcclCommunicatorSpec& spec) : spec_(spec) {}

absl::Status NcclCommunicator::Init() {
  ForceNvlsOff();
  const std::string what = absl::StrCat("NCCL init of rank ", spec_.rank, " of ", spec_.world_size,
                                        " on GPU ", spec_.device);
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    return CudaError(what, "cudaGetDeviceCount", e);
  }
  if (spec_.device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": this machine has ", count, " CUDA device(s)"));
  }
  ScopedDevice device(spec_.device);
  if (spec_.default_stream == nullptr) {
    cudaStream_t s = nullptr;
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
      return CudaError(what, "cudaStreamCreateWithFlags", e);
    }
    own_stream_ = s;
    default_stream_ = s;
  } else {
    default_stream_ = spec_.default_stream;
  }
  cudaEvent_t event = nullptr;
  if (cudaError_t e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming); e != cudaSuccess) {
    return CudaError(what, "cudaEventCreateWithFlags", e);
  }
  done_event_ = event;
  const size_t sizes_bytes = 2 * spec_.world_size * sizeof(int64_t);
  if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&sizes_device_), sizes_bytes);
      e != cudaSuccess) {
    return CudaError(what, "cudaMalloc", e);
  }
  if (cudaError_t e = cudaMallocHost(reinterpret_cast<void**>(&sizes_host_), sizes_bytes);
      e != cudaSuccess) {
    return CudaError(what, "cudaMallocHost", e);
  }
  if (cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&barrier_device_), sizeof(int32_t));
      e != cudaSuccess) {
    return CudaError(what, "cudaMalloc", e);
  }
  if (cudaError_t e = cudaMemset(barrier_device_, 0, sizeof(int32_t)); e != cudaSuccess) {
    return CudaError(what, "cudaMemset", e);
  }

  ncclUniqueId id;
  std::memcpy(id.internal, spec_.unique_id.data(), NCCL_UNIQUE_ID_BYTES);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const absl::Time deadline = absl::Now() + spec_.timeout;
  absl::Status status;
  {
    absl::MutexLock lock(&op_mu_);
    ncclComm_t comm = nullptr;
    ncclResult_t r = ncclCommInitRankConfig(&comm, spec_.world_size, id, spec_.rank, &config);
    comm_ = comm;
    if (r != ncclSuccess && r != ncclInProgress) {
      status = NcclError(what, "ncclCommInitRankConfig", r, comm);
    } else {
      status = AwaitNotInProgressLocked(what, deadline);
      if (absl::IsDeadlineExceeded(status)) {
        status = absl::DeadlineExceededError(
            absl::StrCat(what, ": the group did not complete within ",
                         absl::FormatDuration(spec_.timeout), " (a rank is missing)"));
      }
    }
    if (!status.ok() && comm_ != nullptr) {
      (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
  }
  if (!status.ok()) {
    absl::MutexLock lock(&state_mu_);
    broken_ = status;
    return status;
  }
  watchdog_ = std::thread([this] { Watchdog(); });
  return absl::OkStatus();
}

NcclCommunicator::~NcclCommunicator() {
  {
    absl::MutexLock lock(&state_mu_);
    stop_watchdog_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  ScopedDevice device(spec_.device);
  {
    absl::MutexLock lock(&op_mu_);
    if (comm_ != nullptr) {
      bool destroyed = false;
      if (BrokenStatus().ok()) {
        for (const auto& [window, memory] : windows_) {
          (void)ncclCommWindowDeregister(comm_, static_cast<ncclWindow_t>(window));
        }
      }
      if (BrokenStatus().ok() && ncclCommFinalize(comm_) != ncclInternalError) {
        const absl::Time deadline = absl::Now() + std::min(spec_.timeout, kFinalizeBound);
        if (AwaitNotInProgressLocked("NCCL finalize", deadline).ok()) {
          destroyed = ncclCommDestroy(comm_) == ncclSuccess;
        }
      }
      if (!destroyed) (void)ncclCommAbort(comm_);
      comm_ = nullptr;
    }
    for (const auto& [window, memory] : windows_) (void)ncclMemFree(memory);
    windows_.clear();
  }
  if (default_stream_ != nullptr)
    (void)cudaStreamSynchronize(static_cast<cudaStream_t>(default_stream_));
  if (sizes_device_ != nullptr) (void)cudaFree(sizes_device_);
  if (sizes_host_ != nullptr) (void)cudaFreeHost(sizes_host_);
  if (barrier_device_ != nullptr) (void)cudaFree(barrier_device_);
  if (done_event_ != nullptr) (void)cudaEventDestroy(static_cast<cudaEvent_t>(done_event_));
  if (own_stream_ != nullptr) (void)cudaStreamDestroy(static_cast<cudaStream_t>(own_stream_));
}

uint64_t NcclCommunicator::collectives_run() const {
  absl::MutexLock lock(&op_mu_);
  return sequence_;
}

absl::Status NcclCommunicator::BrokenStatus() const {
  absl::MutexLock lock(&state_mu_);
  return broken_;
}

absl::Status NcclCommunicator::Fail(const absl::Status& error) {
  absl::Status first;
  {
    absl::MutexLock lock(&state_mu_);
    if (broken_.ok()) {
      broken_ = error;
      LOG(WARNING) << "NCCL communicator rank " << spec_.rank << " of " << spec_.world_size
                   << " broken: " << error;
    }
    first = broken_;
  }
  absl::MutexLock lock(&op_mu_);
  if (comm_ != nullptr) {
    ScopedDevice device(spec_.device);
    // Also ends kernels of this communicator that wait for a peer.
    (void)ncclCommAbort(comm_);
    comm_ = nullptr;
    pending_ = false;
  }
  return first;
}

absl::StatusOr<SymmetricWindow> NcclCommunicator::RegisterSymmetricWindow(size_t bytes) {
  if (absl::Status b = BrokenStatus(); !b.ok()) return b;
  const std::string what = absl::StrCat("NCCL symmetric window of ", bytes, " bytes on rank ",
                                        spec_.rank, " of ", spec_.world_size);
  if (bytes == 0) return absl::InvalidArgumentError(absl::StrCat(what, ": empty"));
  ScopedDevice device(spec_.device);
  // The user's bytes, then the check word (CheckWindow) in a part of its own, so that checking
  // never touches what the peers write.
  const size_t total = bytes + kWindowCheckBytes;
  void* memory = nullptr;
  ncclWindow_t window = nullptr;
  absl::Status registered;
  {
    absl::MutexLock lock(&op_mu_);
    if (comm_ == nullptr) return absl::FailedPreconditionError(absl::StrCat(what, ": no group"));
    // What every rank sees alike (one NCCL version per group, one topology): refused before
    // registering, on every rank.
    int version = 0;
    if (ncclGetVersion(&version) != ncclSuccess || version < kNcclDeviceApiVersion) {
      return absl::UnimplementedError(absl::StrCat(
          what, ": the NCCL library loaded (version code ", version,
          ") predates the device API (2.28, version code ", kNcclDeviceApiVersion, ")"));
    }
    const int lsa = LsaTeamSize(comm_);
    if (lsa != spec_.world_size) {
      return absl::UnimplementedError(
          absl::StrCat(what, ": only ", lsa, " of the ", spec_.world_size,
                       " ranks share NVLink load/store (the group spans hosts)"));
    }
    if (ncclResult_t r = ncclMemAlloc(&memory, total); r != ncclSuccess) {
      return NcclError(what, "ncclMemAlloc", r, comm_);
    }
    if (cudaError_t e = cudaMemset(memory, 0, total); e != cudaSuccess) {
      (void)ncclMemFree(memory);
      return CudaError(what, "cudaMemset", e);
    }
    ncclResult_t r = ncclCommWindowRegister(comm_, memory, total, &window, NCCL_WIN_COLL_SYMMETRIC);
    if (r != ncclSuccess && r != ncclInProgress) {
      (void)ncclMemFree(memory);
      return NcclError(what, "ncclCommWindowRegister", r, comm_);
    }
    registered = AwaitNotInProgressLocked(what, absl::Now() + spec_.timeout);
    // Freed after the NCCL communicator (the destructor) if the registration did not complete.
    if (!registered.ok()) windows_.push_back({window, memory});
  }
  // A registration that did not complete leaves the group in an unknown state.
  if (!registered.ok()) return Fail(registered);
  SymmetricWindow out;
  out.local = memory;
  out.bytes = bytes;
  absl::Status checked = CheckWindow(what, window, memory, bytes, &out.peers);
  absl::MutexLock lock(&op_mu_);
  if (!checked.ok()) {
    if (comm_ != nullptr && window != nullptr) (void)ncclCommWindowDeregister(comm_, window);
    (void)ncclMemFree(memory);
    return checked;
  }
  windows_.push_back({window, memory});
  return out;
}

absl::Status NcclCommunicator::CheckWindow(const std::string& what, ncclWindow_vidmem* window,
                                           void* memory, size_t bytes, std::vector<void*>* peers) {
  const int n = spec_.world_size;
  const cudaStream_t stream = static_cast<cudaStream_t>(default_stream_);
  // 1. The handle, before any kernel reads it. NCCL gives a host or null handle where the
  //    communicator has no symmetric memory (nccl_window.h); a kernel reading that faults, and
  //    the fault would end every later CUDA call of the process.
  std::string detail;
  size_t code = kWindowOk;
  int version = 0;
  (void)ncclGetVersion(&version);
  if (!IsDeviceWindowHandle(window, spec_.device, &detail)) {
    code = kWindowNoDeviceHandle;
    detail = absl::StrCat(
        "NCCL (version code ", version, ") gave no device window handle (", detail,
        "): this communicator has no symmetric memory; NCCL needs cuMem (NCCL_CUMEM_ENABLE), "
        "NCCL_WIN_ENABLE and CUDA P2P between all ranks (nccl_window_probe says which NCCL calls "
        "work here)");
  }
  // 2. Every rank's LSA pointer (a one-thread kernel), and this rank's check word written
  //    through its own pointer.
  const uint64_t mine = WindowCheckWord(spec_.rank);
  if (code == kWindowOk) {
    peers->assign(n, nullptr);
    void** table = nullptr;
    cudaError_t e = cudaMalloc(reinterpret_cast<void**>(&table), n * sizeof(void*));
    if (e == cudaSuccess) e = LsaPointersOfWindow(window, n, table, stream);
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(peers->data(), table, n * sizeof(void*), cudaMemcpyDeviceToHost, stream);
    }
    if (e == cudaSuccess) {
      e = cudaMemcpyAsync(static_cast<char*>(memory) + bytes, &mine, sizeof(mine),
                          cudaMemcpyHostToDevice, stream);
    }
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (table != nullptr) (void)cudaFree(table);
    // The handle is device memory, so this is no bad handle: an error here is the GPU's.
    if (e != cudaSuccess) return Fail(CudaError(what, "resolving the peers' pointers", e));
    for (int r = 0; r < n && code == kWindowOk; ++r) {
      if ((*peers)[r] == nullptr) {
        code = kWindowBadPointers;
        detail = absl::StrCat("NCCL's LSA pointer of rank ", r, " is null");
      }
    }
  }
  if (absl::Status agreed = AgreeOnWindow(what, code, detail); !agreed.ok()) return agreed;
  // 3. Every rank's check word read through the pointers (every rank wrote its own before the
  //    agreement above): the pointers address the ranks' windows.
  std::vector<uint64_t> words(n, 0);
  for (int r = 0; r < n && code == kWindowOk; ++r) {
    cudaError_t e = cudaMemcpyAsync(&words[r], static_cast<char*>((*peers)[r]) + bytes,
                                    sizeof(uint64_t), cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      code = kWindowBadPointers;
      detail = absl::StrCat("reading rank ", r,
                            "'s window through its LSA pointer: ", cudaGetErrorName(e));
    } else if (words[r] != WindowCheckWord(r)) {
      code = kWindowBadPointers;
      detail =
          absl::StrCat("rank ", r, "'s window read through its LSA pointer holds ",
                       absl::Hex(words[r]), ", not its check word ", absl::Hex(WindowCheckWord(r)));
    }
  }
  return AgreeOnWindow(what, code, detail);
}

absl::Status NcclCommunicator::AgreeOnWindow(const std::string& what, size_t code,
                                             const std::string& detail) {
  absl::StatusOr<std::vector<size_t>> codes =
      AllToAllSizes(std::vector<size_t>(spec_.world_size, code));
  if (!codes.ok()) return codes.status();
  if (code != kWindowOk) return absl::UnimplementedError(absl::StrCat(what, ": ", detail));
  for (int r = 0; r < spec_.world_size; ++r) {
    if ((*codes)[r] == kWindowOk) continue;
    return absl::UnimplementedError(absl::StrCat(
        what, ": rank ", r, " cannot use it (",
        (*codes)[r] == kWindowNoDeviceHandle ? "NCCL gave it no device window handle"
                                             : "its LSA pointers do not address the windows",
        ")"));
  }
  return absl::OkStatus();
}

void NcclCommunicator::Abort(const absl::Status& reason) {
  (void)Fail(
      absl::AbortedError(absl::StrCat("rank ", spec_.rank, " aborted: ", reason.ToString())));
}

absl::Status NcclCommunicator::AwaitNotInProgressLocked(const std::string& what,
                                                        absl::Time deadline) {
  while (true) {
    ncclResult_t state = ncclSuccess;
    if (ncclResult_t r = ncclCommGetAsyncError(comm_, &state); r != ncclSuccess) {
      return NcclError(what, "ncclCommGetAsyncError", r, comm_);
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(what, "NCCL", state, comm_);
    if (absl::Status b = BrokenStatus(); !b.ok()) return b;
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, ": NCCL still in progress after ",
                                                      absl::FormatDuration(spec_.timeout)));
    }
    absl::SleepFor(absl::Microseconds(50));
  }
}

void* NcclCommunicator::StreamOrDefault(StreamHandle stream) const {
  return stream != nullptr ? stream : default_stream_;
}

template <typename Issue>
absl::Status NcclCommunicator::Enqueue(const char* what, void* stream, Issue issue) {
  absl::Status status;
  {
    absl::MutexLock lock(&op_mu_);
    if (absl::Status b = BrokenStatus(); !b.ok()) return b;
    if (comm_ == nullptr) return absl::FailedPreconditionError("NCCL communicator is closed");
    ScopedDevice device(spec_.device);
    const std::string name = absl::StrCat(what, " #", ++sequence_, " on rank ", spec_.rank, " of ",
                                          spec_.world_size, " (GPU ", spec_.device, ")");
    const absl::Time deadline = absl::Now() + spec_.timeout;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (ncclResult_t r = ncclGroupStart(); r != ncclSuccess) {
      status = NcclError(name, "ncclGroupStart", r, comm_);
    } else {
      absl::Status issued = issue(comm_, s, name);
      // Always balanced, also when issuing failed half way.
      const ncclResult_t end = ncclGroupEnd();
      if (!issued.ok()) {
        status = issued;
      } else if (end == ncclInProgress) {
        status = AwaitNotInProgressLocked(name, deadline);
      } else if (end != ncclSuccess) {
        status = NcclError(name, "ncclGroupEnd", end, comm_);
      }
    }
    if (status.ok()) {
      if (cudaError_t e = cudaEventRecord(static_cast<cudaEvent_t>(done_event_), s);
          e != cudaSuccess) {
        status = CudaError(name, "cudaEventRecord", e);
      } else {
        pending_ = true;
        pending_since_ = absl::Now();
        pending_what_ = name;
      }
    }
  }
  if (!status.ok()) return Fail(status);
  return absl::OkStatus();
}

absl::Status NcclCommunicator::WaitStream(const std::string& what, void* stream) {
  const absl::Time deadline = absl::Now() + spec_.timeout;
  ScopedDevice device(spec_.device);
  absl::Duration nap = absl::Microseconds(5);
  while (true) {
    const cudaError_t e = cudaStreamQuery(static_cast<cudaStream_t>(stream));
    if (absl::Status b = BrokenStatus(); !b.ok()) return b;
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return Fail(CudaError(what, "cudaStreamQuery", e));
    if (absl::Now() > deadline) {
      return Fail(absl::DeadlineExceededError(
          absl::StrCat(what, " on rank ", spec_.rank, " of ", spec_.world_size,
                       ": not complete after ", absl::FormatDuration(spec_.timeout),
                       " (a peer is missing, stalled, or ran another collective)")));
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(1));
  }
}

void NcclCommunicator::Watchdog() {
  // This thread's device, for the event queries.
  (void)cudaSetDevice(spec_.device);
  while (true) {
    {
      absl::MutexLock lock(&state_mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(state_mu_) { return stop_watchdog_; };
      if (state_mu_.AwaitWithTimeout(absl::Condition(&stop), kWatchdogPeriod)) return;
      if (!broken_.ok()) continue;
    }
    absl::Status error;
    {
      absl::MutexLock lock(&op_mu_);
      if (comm_ == nullptr) continue;
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state != ncclSuccess &&
          state != ncclInProgress) {
        error = NcclError(absl::StrCat("rank ", spec_.rank, " of ", spec_.world_size,
                                       pending_ ? absl::StrCat(" in ", pending_what_) : ""),
                          "NCCL async error", state, comm_);
      } else if (pending_) {
        const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(done_event_));
        if (e == cudaSuccess) {
          pending_ = false;
        } else if (e != cudaErrorNotReady) {
          error = CudaError(pending_what_, "cudaEventQuery", e);
        } else if (absl::Now() - pending_since_ > spec_.timeout) {
          error = absl::DeadlineExceededError(absl::StrCat(
              pending_what_, ": not complete after ", absl::FormatDuration(spec_.timeout),
              " (a peer is missing, stalled, or ran another collective)"));
        }
      }
    }
    if (!error.ok()) (void)Fail(error);
  }
}

absl::Status NcclCommunicator::DoAllToAllV(const void* send, const std::vector<size_t>& send_bytes,
                                           void* recv, const std::vector<size_t>& recv_bytes,
                                           StreamHandle stream) {
  const int me = spec_.rank;
  if (send_bytes[me] != recv_bytes[me]) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("AllToAllV on rank ", me, ": sends ", send_bytes[me],
                     " bytes to itself but expects ", recv_bytes[me])));
  }
  const int n = spec_.world_size;
  std::vector<size_t> send_off(n, 0), recv_off(n, 0);
  for (int r = 1; r < n; ++r) {
    send_off[r] = send_off[r - 1] + send_bytes[r - 1];
    recv_off[r] = recv_off[r - 1] + recv_bytes[r - 1];
  }
  const char* s = static_cast<const char*>(send);
  char* d = static_cast<char*>(recv);
  return Enqueue(
      "AllToAllV", StreamOrDefault(stream),
      [&](ncclComm_t comm, cudaStream_t st, const std::string& name) -> absl::Status {
        if (send_bytes[me] > 0) {
          if (cudaError_t e = cudaMemcpyAsync(d + recv_off[me], s + send_off[me], send_bytes[me],
                                              cudaMemcpyDeviceToDevice, st);
              e != cudaSuccess) {
            return CudaError(name, "cudaMemcpyAsync", e);
          }
        }
        for (int r = 0; r < n; ++r) {
          if (r == me) continue;
          if (send_bytes[r] > 0) {
            if (ncclResult_t e = ncclSend(s + send_off[r], send_bytes[r], ncclUint8, r, comm, st);
                e != ncclSuccess) {
              return NcclError(absl::StrCat(name, ", to rank ", r), "ncclSend", e, comm);
            }
          }
          if (recv_bytes[r] > 0) {
            if (ncclResult_t e = ncclRecv(d + recv_off[r], recv_bytes[r], ncclUint8, r, comm, st);
                e != ncclSuccess) {
              return NcclError(absl::StrCat(name, ", from rank ", r), "ncclRecv", e, comm);
            }
          }
        }
        return absl::OkStatus();
      });
}

absl::StatusOr<std::vector<size_t>> NcclCommunicator::DoAllToAllSizes(
    const std::vector<size_t>& send_bytes) {
  // A device round trip through pinned host memory (so the copies are truly asynchronous and
  // the wait below keeps its deadline), on the default stream.
  const int n = spec_.world_size;
  const int me = spec_.rank;
  for (int r = 0; r < n; ++r) sizes_host_[r] = static_cast<int64_t>(send_bytes[r]);
  void* stream = default_stream_;
  absl::Status st =
      Enqueue("AllToAllSizes", stream,
              [&](ncclComm_t comm, cudaStream_t s, const std::string& name) -> absl::Status {
                if (cudaError_t e = cudaMemcpyAsync(sizes_device_, sizes_host_, n * sizeof(int64_t),
                                                    cudaMemcpyHostToDevice, s);
                    e != cudaSuccess) {
                  return CudaError(name, "cudaMemcpyAsync", e);
                }
                for (int r = 0; r < n; ++r) {
                  if (r == me) continue;
                  if (ncclResult_t e = ncclSend(sizes_device_ + r, 1, ncclInt64, r, comm, s);
                      e != ncclSuccess) {
                    return NcclError(absl::StrCat(name, ", to rank ", r), "ncclSend", e, comm);
                  }
                  if (ncclResult_t e = ncclRecv(sizes_device_ + n + r, 1, ncclInt64, r, comm, s);
                      e != ncclSuccess) {
                    return NcclError(absl::StrCat(name, ", from rank ", r), "ncclRecv", e, comm);
                  }
                }
                return absl::OkStatus();
              });
  if (!st.ok()) return st;
  // The copy back is issued after the group has ended: CUDA calls made inside a group run at
  // once, while the group's sends and receives are launched by ncclGroupEnd, so a copy issued
  // inside it would read the receive buffer before anything arrived.
  {
    ScopedDevice device(spec_.device);
    if (cudaError_t e = cudaMemcpyAsync(sizes_host_ + n, sizes_device_ + n, n * sizeof(int64_t),
                                        cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream));
        e != cudaSuccess) {
      return Fail(CudaError("AllToAllSizes", "cudaMemcpyAsync", e));
    }
  }
  if (absl::Status w = WaitStream("AllToAllSizes", stream); !w.ok()) return w;
  std::vector<size_t> recv(n);
  for (int r = 0; r < n; ++r) {
    const int64_t v = r == me ? sizes_host_[r] : sizes_host_[n + r];
    if (v < 0) {
      return Fail(absl::FailedPreconditionError(
          absl::StrCat("AllToAllSizes on rank ", me, ": rank ", r, " sends a negative size ", v)));
    }
    recv[r] = static_cast<size_t>(v);
  }
  return recv;
}

absl::Status NcclCommunicator::DoAllGather(const void* send, size_t bytes_per_rank, void* recv,
                                           StreamHandle stream) {
  if (bytes_per_rank == 0) return BrokenStatus();
  return Enqueue(
      "AllGather", StreamOrDefault(stream),
      [&](ncclComm_t comm, cudaStream_t s, const std::string& name) -> absl::Status {
        if (ncclResult_t e = ncclAllGather(send, recv, bytes_per_rank, ncclUint8, comm, s);
            e != ncclSuccess) {
          return NcclError(name, "ncclAllGather", e, comm);
        }
        return absl::OkStatus();
      });
}

absl::Status NcclCommunicator::DoAllReduce(const void* send, void* recv, size_t count,
                                           DataType type, ReduceOp op, StreamHandle stream) {
  if (count == 0) return BrokenStatus();
  return Enqueue(
      "AllReduce", StreamOrDefault(stream),
      [&](ncclComm_t comm, cudaStream_t s, const std::string& name) -> absl::Status {
        if (ncclResult_t e = ncclAllReduce(send, recv, count, NcclType(type), NcclOp(op), comm, s);
            e != ncclSuccess) {
          return NcclError(name, "ncclAllReduce", e, comm);
        }
        return absl::OkStatus();
      });
}

absl::Status NcclCommunicator::DoBarrier(StreamHandle stream) {
  void* s = StreamOrDefault(stream);
  // NCCL has no barrier: an all-reduce of one element (max, so the value never grows), then
  // the wait for it.
  absl::Status st =
      Enqueue("Barrier", s, [&](ncclComm_t comm, cudaStream_t cs, const std::string& name) {
        if (ncclResult_t e =
                ncclAllReduce(barrier_device_, barrier_device_, 1, ncclInt32, ncclMax, comm, cs);
            e != ncclSuccess) {
          return NcclError(name, "ncclAllReduce", e, comm);
        }
        return absl::OkStatus();
      });
  if (!st.ok()) return st;
  return WaitStream("Barrier", s);
}

}  // namespace deepinfer::comm
