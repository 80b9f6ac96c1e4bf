// MakeBackend: builds the Backend a worker runs on from its name, so binaries choose the device
// with a flag (`--backend cpu|cuda`) without depending on CUDA themselves: the CUDA backend is
// linked in only when the build has CUDA (`--config=cpu` builds return UNIMPLEMENTED for it).
#ifndef DEEPINFER_WORKER_BACKEND_BACKEND_FACTORY_H_
#define DEEPINFER_WORKER_BACKEND_BACKEND_FACTORY_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"

namespace deepinfer {

struct BackendOptions {
  std::string kind = "cpu";  // "cpu" or "cuda"
  int cpu_threads = 0;       // cpu: <= 0 means one per hardware thread
  int cuda_device = 0;       // cuda: device ordinal
  // Storage of matrix weights: "bfloat16" or "float32"; empty: the kind's default
  // (DefaultWeightDType); "auto": the checkpoint's precision (kStoredPrecisionDType). From a
  // --dtype flag.
  std::string dtype;
  // cuda: CudaTuning::gemm_autotune (prefill GEMMs of >= 1024 rows take the fastest of
  // cuBLASLt's suggested algorithms, timed once per shape; the choice can differ between
  // processes, so bits may too: false for run-to-run reproducible prefill GEMMs). The CUDA
  // backend's other tuning keeps its defaults here.
  bool gemm_autotune = true;
  // cuda: CudaTuning::batch_invariant (every row computed the same way at any batch size; the
  // CPU backend always is). From --batch-invariant or DEEPINFER_BATCH_INVARIANT.
  bool batch_invariant = false;
};

// The environment variable that turns the batch-invariant mode on where a binary's
// --batch-invariant flag is not given: "1" or "true" on, "0", "false" or unset off.
inline constexpr char kBatchInvariantEnv[] = "DEEPINFER_BATCH_INVARIANT";
// Parses kBatchInvariantEnv's value (nullptr: unset); INVALID_ARGUMENT naming the variable and
// the value for anything else.
absl::StatusOr<bool> ParseBatchInvariantEnv(const char* value);

// bfloat16 on "cuda", float32 on "cpu" (the reference; it accepts bfloat16 too, for tests).
WeightDType DefaultWeightDType(const std::string& kind);

// BackendOptions::dtype "auto" (--dtype auto): a checkpoint served in its stored precision. Its
// FP8 matrices (e4m3, 128 x 128 block scales) stay FP8 on a backend that computes with them
// (CUDA: KeepsCheckpointFp8); everything else is stored in the kind's default dtype.
inline constexpr char kStoredPrecisionDType[] = "auto";
// The backend's weight_dtype() for options.dtype: DefaultWeightDType(kind) for "" and "auto",
// bfloat16 for "mxfp4" on "cuda" (INVALID_ARGUMENT on another kind), else ParseWeightDType's.
absl::StatusOr<WeightDType> ResolveWeightDType(const BackendOptions& options);
// BackendOptions::dtype "mxfp4" (--dtype mxfp4, CUDA only): the routed experts kept in MXFP4
// (quantised at load where the checkpoint stores them otherwise; LoadOptions::mxfp4_experts),
// everything else as with "auto" (FP8 matrices stay FP8, the rest bfloat16): the precision
// `deepinfer-admin memory-plan --precision mxfp4` plans for.
inline constexpr char kMxfp4ExpertsDType[] = "mxfp4";
// Whether a model on the backend made from `options` keeps its checkpoint's FP8 matrices FP8
// (LoadOptions::keep_fp8): dtype "auto" or "mxfp4" on "cuda".
bool KeepsCheckpointFp8(const BackendOptions& options);
// Whether it keeps the routed experts in MXFP4 (LoadOptions::mxfp4_experts): dtype "mxfp4" on
// "cuda".
bool KeepsExpertsMxfp4(const BackendOptions& options);

// INVALID_ARGUMENT for an unknown kind or dtype; UNIMPLEMENTED for "cuda" in a build without CUDA
// and for "ascend" (a design only: CheckBackendBuilt); FAILED_PRECONDITION for "cuda" on a
// machine without that GPU.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendOptions& options);

// The kinds this build can make ("cpu", and "cuda" when built with CUDA).
std::vector<std::string> AvailableBackends();

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_BACKEND_FACTORY_H_
