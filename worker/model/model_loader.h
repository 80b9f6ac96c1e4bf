// LoadDeepseekV3: builds a ready DeepseekV3Model from a checkpoint directory or from the
// `dummy` load format, on a given backend, with a single-rank LocalExpertDispatcher.
//
// `model` is either a directory holding config.json and safetensors, or
// "dummy:<path to config.json>[@seed]" for random weights of that architecture.
#ifndef DEEPINFER_WORKER_MODEL_MODEL_LOADER_H_
#define DEEPINFER_WORKER_MODEL_MODEL_LOADER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/deepseek_v3_model.h"
#include "worker/model/model_weights.h"

namespace deepinfer {

absl::StatusOr<std::unique_ptr<DeepseekV3Model>> LoadDeepseekV3(const std::string& model,
                                                                Backend* backend,
                                                                const LoadOptions& options = {});

// The weight source of `model` (a checkpoint directory or "dummy:CONFIG[@seed]") and its
// config, as LoadDeepseekV3 opens them; for loading experts again after a placement change.
absl::StatusOr<std::unique_ptr<WeightSource>> OpenWeightSource(const std::string& model,
                                                               ModelConfig* config);

// Builds the ExpertDispatcher of a model once its config and weights are loaded (an
// expert-parallel rank wires its communicator in here).
using ExpertDispatcherFactory = std::function<absl::StatusOr<std::unique_ptr<ExpertDispatcher>>(
    const ModelConfig& config, const ModelWeights& weights, Backend* backend)>;

// As above, with the dispatcher made by `make_dispatcher` (only called for MoE models).
absl::StatusOr<std::unique_ptr<DeepseekV3Model>> LoadDeepseekV3(
    const std::string& model, Backend* backend, const LoadOptions& options,
    const ExpertDispatcherFactory& make_dispatcher);

// The single-rank dispatcher LoadDeepseekV3 uses by default: a LocalExpertDispatcher over the
// experts the weights hold in every MoE layer.
absl::StatusOr<std::unique_ptr<ExpertDispatcher>> MakeLocalExpertDispatcher(
    const ModelConfig& config, const ModelWeights& weights, Backend* backend);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_MODEL_LOADER_H_
