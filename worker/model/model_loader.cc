// LoadDeepseekV3: config + weight source + weights + dispatcher.
#include "worker/model/model_loader.h"

#include <cstdlib>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "worker/model/dummy_weight_source.h"
#include "worker/model/local_expert_dispatcher.h"
#include "worker/model/safetensors_checkpoint.h"

namespace deepinfer {

absl::StatusOr<std::unique_ptr<ExpertDispatcher>> MakeLocalExpertDispatcher(
    const ModelConfig& config, const ModelWeights& weights, Backend* backend) {
  // Experts hosted in every MoE layer; a single-rank dispatcher serves exactly these.
  std::vector<int64_t> local;
  for (int64_t e = 0; e < config.n_routed_experts; ++e) {
    bool everywhere = true;
    for (const LayerWeights& l : weights.layers) {
      if (l.moe && !l.experts.count(e)) everywhere = false;
    }
    if (everywhere) local.push_back(e);
  }
  return std::unique_ptr<ExpertDispatcher>(std::make_unique<LocalExpertDispatcher>(
      backend, config.n_routed_experts, config.hidden_size, std::move(local)));
}

absl::StatusOr<std::unique_ptr<DeepseekV3Model>> LoadDeepseekV3(const std::string& model,
                                                                Backend* backend,
                                                                const LoadOptions& options) {
  return LoadDeepseekV3(model, backend, options, MakeLocalExpertDispatcher);
}

absl::StatusOr<std::unique_ptr<WeightSource>> OpenWeightSource(const std::string& model,
                                                               ModelConfig* config_out) {
  std::unique_ptr<WeightSource> source;
  std::string config_path;
  if (absl::StartsWith(model, "dummy:")) {
    std::string spec = model.substr(6);
    uint64_t seed = 0;
    const size_t at = spec.rfind('@');
    if (at != std::string::npos) {
      if (!absl::SimpleAtoi(spec.substr(at + 1), &seed)) {
        return absl::InvalidArgumentError(absl::StrCat("bad dummy seed in '", model, "'"));
      }
      spec = spec.substr(0, at);
    }
    config_path = spec;
    source = std::make_unique<DummyWeightSource>(seed);
  } else {
    config_path = model + "/config.json";
  }
  auto config = ModelConfig::FromFile(config_path);
  if (!config.ok()) return config.status();
  if (source == nullptr) {
    auto ckpt = SafetensorsCheckpoint::Open(model, config->fp8_block_rows, config->fp8_block_cols);
    if (!ckpt.ok()) return ckpt.status();
    source = std::move(*ckpt);
  }
  *config_out = std::move(*config);
  return source;
}

absl::StatusOr<std::unique_ptr<DeepseekV3Model>> LoadDeepseekV3(
    const std::string& model, Backend* backend, const LoadOptions& options,
    const ExpertDispatcherFactory& make_dispatcher) {
  ModelConfig config_value;
  auto opened = OpenWeightSource(model, &config_value);
  if (!opened.ok()) return opened.status();
  std::unique_ptr<WeightSource> source = std::move(*opened);
  const ModelConfig* config = &config_value;
  auto weights = ModelWeights::Load(*config, source.get(), backend, options);
  if (!weights.ok()) return weights.status();
  std::unique_ptr<ExpertDispatcher> dispatcher;
  if (config->n_routed_experts > 0) {
    auto made = make_dispatcher(*config, **weights, backend);
    if (!made.ok()) return made.status();
    dispatcher = std::move(*made);
  }
  return DeepseekV3Model::Create(*config, std::move(*weights), backend, std::move(dispatcher));
}

}  // namespace deepinfer
