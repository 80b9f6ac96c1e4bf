// LoadModel: builds a ready CausalLm from a checkpoint directory or from the `dummy` load
// format, on a given backend, through the registry (model_registry.h): the architecture is
// config.json's.
//
// `model` is either a directory holding config.json and safetensors, or
// "dummy:<path to config.json>[@seed]" for random weights of that architecture.
#ifndef DEEPINFER_WORKER_MODEL_MODEL_LOADER_H_
#define DEEPINFER_WORKER_MODEL_MODEL_LOADER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/causal_lm.h"
#include "worker/model/model_registry.h"
#include "worker/model/model_weights.h"

namespace deepinfer {

// The single-rank dispatcher LoadModel uses by default: a LocalExpertDispatcher over the
// experts the weights hold in every MoE layer.
absl::StatusOr<std::unique_ptr<ExpertDispatcher>> MakeLocalExpertDispatcher(
    const ModelConfig& config, const ModelWeights& weights, Backend* backend);

// With the dispatcher made by `make_dispatcher` (only called for models with routed experts).
absl::StatusOr<std::unique_ptr<CausalLm>> LoadModel(
    const std::string& model, Backend* backend, const LoadOptions& options = {},
    const ExpertDispatcherFactory& make_dispatcher = MakeLocalExpertDispatcher);

// The weight source of `model` (a checkpoint directory or "dummy:CONFIG[@seed]") and its
// config, as LoadModel opens them; for loading experts again after a placement change.
absl::StatusOr<std::unique_ptr<WeightSource>> OpenWeightSource(const std::string& model,
                                                               ModelConfig* config);

// The model of `config`'s architecture with weights from `source` (LoadModel's second half).
absl::StatusOr<std::unique_ptr<CausalLm>> BuildModel(
    const ModelConfig& config, WeightSource* source, Backend* backend,
    const LoadOptions& options = {},
    const ExpertDispatcherFactory& make_dispatcher = MakeLocalExpertDispatcher);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_MODEL_LOADER_H_
