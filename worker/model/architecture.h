// Architecture: what the registry (model_registry.h) knows of one model architecture: how to
// build it from a weight source, and how big its parts are from the config alone, so that the
// memory plan can run before anything is loaded. Each architecture defines its entry beside its
// model class.
#ifndef DEEPINFER_WORKER_MODEL_ARCHITECTURE_H_
#define DEEPINFER_WORKER_MODEL_ARCHITECTURE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_cache_spec.h"
#include "worker/model/causal_lm.h"
#include "worker/model/expert_dispatcher.h"
#include "worker/model/model_config.h"
#include "worker/model/model_weights.h"
#include "worker/model/weight_source.h"

namespace deepinfer {

// Builds the ExpertDispatcher of a model once its config and weights are loaded (an
// expert-parallel rank wires its communicator in here).
using ExpertDispatcherFactory = std::function<absl::StatusOr<std::unique_ptr<ExpertDispatcher>>(
    const ModelConfig& config, const ModelWeights& weights, Backend* backend)>;

// What building a model takes. `source` and `backend` must outlive the call; the model keeps
// `backend`.
struct ModelBuildArgs {
  const ModelConfig* config = nullptr;
  WeightSource* source = nullptr;
  Backend* backend = nullptr;
  LoadOptions load;  // which routed experts this rank hosts
  // Called once for a model with routed experts.
  ExpertDispatcherFactory make_dispatcher;
};

struct Architecture {
  std::string name;                      // e.g. "DeepseekV3ForCausalLM"
  std::vector<std::string> model_types;  // taken when config.json names no architecture
  // Loads the weights `args.load` selects from `args.source` and makes the model.
  std::function<absl::StatusOr<std::unique_ptr<CausalLm>>(const ModelBuildArgs& args)> build;
  // Device bytes of the weights a rank with `load` hosts, with matrices in `matrix_dtype`.
  std::function<int64_t(const ModelConfig&, WeightDType matrix_dtype, const LoadOptions& load)>
      weight_bytes;
  // fp32 values live at once per new token in the largest part of a step (the memory plan's
  // activation reserve is this times the step's tokens; memory_plan.h).
  std::function<int64_t(const ModelConfig&)> activation_floats_per_token;
  // The KV cache the model will declare (CausalLm::CacheSpec), entries in `dtype`.
  std::function<KvCacheSpec(const ModelConfig&, WeightDType dtype)> cache_spec;
  // Whether `build` honours LoadOptions::keep_fp8 (FP8 matrices kept as stored where the backend
  // runs them); false: every weight is read dequantised, whatever the backend.
  bool keeps_fp8 = false;
  // Whether `build` honours LoadOptions::mxfp4_experts (routed experts kept MXFP4).
  bool keeps_mxfp4_experts = false;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_ARCHITECTURE_H_
