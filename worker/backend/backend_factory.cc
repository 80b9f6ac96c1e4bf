// MakeBackend: name -> Backend.
#include "worker/backend/backend_factory.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/backend/backend_kind.h"
#include "worker/backend/cpu/cpu_backend.h"
#ifdef DEEPINFER_WITH_CUDA
#include "worker/backend/cuda/cuda_backend.h"
#endif

namespace deepinfer {

std::vector<std::string> AvailableBackends() {
#ifdef DEEPINFER_WITH_CUDA
  return {"cpu", "cuda"};
#else
  return {"cpu"};
#endif
}

WeightDType DefaultWeightDType(const std::string& kind) {
  return kind == "cuda" ? WeightDType::kBFloat16 : WeightDType::kFloat32;
}

absl::StatusOr<WeightDType> ResolveWeightDType(const BackendOptions& options) {
  if (options.dtype.empty() || options.dtype == kStoredPrecisionDType) {
    return DefaultWeightDType(options.kind);
  }
  if (options.dtype == kMxfp4ExpertsDType) {
    if (options.kind != "cuda") {
      return absl::InvalidArgumentError(
          absl::StrCat("dtype 'mxfp4' (routed experts in MXFP4) needs the cuda backend, not '",
                       options.kind, "'"));
    }
    return WeightDType::kBFloat16;
  }
  return ParseWeightDType(options.dtype);
}

absl::StatusOr<bool> ParseBatchInvariantEnv(const char* value) {
  if (value == nullptr) return false;
  const absl::string_view v(value);
  if (v == "1" || v == "true") return true;
  if (v.empty() || v == "0" || v == "false") return false;
  return absl::InvalidArgumentError(
      absl::StrCat(kBatchInvariantEnv, "='", v, "': expected 1, true, 0 or false"));
}

bool KeepsCheckpointFp8(const BackendOptions& options) {
  return options.kind == "cuda" &&
         (options.dtype == kStoredPrecisionDType || options.dtype == kMxfp4ExpertsDType);
}

bool KeepsExpertsMxfp4(const BackendOptions& options) {
  return options.kind == "cuda" && options.dtype == kMxfp4ExpertsDType;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const BackendOptions& options) {
  if (absl::Status built = CheckBackendBuilt(options.kind); !built.ok()) return built;
  absl::StatusOr<WeightDType> resolved = ResolveWeightDType(options);
  if (!resolved.ok()) return resolved.status();
  const WeightDType dtype = *resolved;
  if (options.kind == "cpu") return std::make_unique<CpuBackend>(options.cpu_threads, dtype);
  if (options.kind == "cuda") {
#ifdef DEEPINFER_WITH_CUDA
    CudaTuning tuning;
    tuning.gemm_autotune = options.gemm_autotune;
    tuning.batch_invariant = options.batch_invariant;
    auto cuda = CudaBackend::Create(options.cuda_device, dtype, tuning);
    if (!cuda.ok()) return cuda.status();
    return std::unique_ptr<Backend>(std::move(*cuda));
#else
    return absl::UnimplementedError(
        "backend 'cuda': this binary was built without CUDA (--config=cpu or no nvcc)");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend '", options.kind,
                   "' (available: ", absl::StrJoin(AvailableBackends(), ", "), ")"));
}

}  // namespace deepinfer
