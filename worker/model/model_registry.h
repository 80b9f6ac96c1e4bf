// Model registry: the architectures this build runs, found by config.json's `architectures`
// (or, for checkpoints that name none, their `model_type`). The one place that maps a name to a
// concrete CausalLm; everything else holds a CausalLm.
//
// An entry (architecture.h) says how to build the model and how big its parts are. Adding an
// architecture is one line in model_registry.cc (docs/model.md, "Adding an architecture").
#ifndef DEEPINFER_WORKER_MODEL_MODEL_REGISTRY_H_
#define DEEPINFER_WORKER_MODEL_MODEL_REGISTRY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/architecture.h"
#include "worker/model/model_config.h"

namespace deepinfer {

// The entry for `config` (by config.architecture, else by config.model_type); INVALID_ARGUMENT
// naming the architecture and listing the registered ones otherwise.
absl::StatusOr<const Architecture*> FindArchitecture(const ModelConfig& config);
// Names of every registered architecture.
std::vector<std::string> RegisteredArchitectures();

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_MODEL_REGISTRY_H_
