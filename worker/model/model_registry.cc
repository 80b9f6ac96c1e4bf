// The architectures this build runs.
#include "worker/model/model_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/model/deepseek_v3_model.h"
#include "worker/model/deepseek_v4/deepseek_v4_model.h"

namespace deepinfer {
namespace {

const std::vector<Architecture>& Registry() {
  static const std::vector<Architecture>* registry = new std::vector<Architecture>{
      DeepseekV3Model::Entry(),
      DeepseekV4Model::Entry(),
  };
  return *registry;
}

}  // namespace

absl::StatusOr<const Architecture*> FindArchitecture(const ModelConfig& config) {
  for (const Architecture& a : Registry()) {
    if (!config.architecture.empty() ? a.name == config.architecture
                                     : std::find(a.model_types.begin(), a.model_types.end(),
                                                 config.model_type) != a.model_types.end()) {
      return &a;
    }
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "no model for architecture '", config.architecture, "' (model_type '", config.model_type,
      "'); this build runs: ", absl::StrJoin(RegisteredArchitectures(), ", ")));
}

std::vector<std::string> RegisteredArchitectures() {
  std::vector<std::string> names;
  for (const Architecture& a : Registry()) names.push_back(a.name);
  return names;
}

}  // namespace deepinfer
