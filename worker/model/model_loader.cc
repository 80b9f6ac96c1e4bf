// LoadModel: config + weight source + the registry's build.
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

absl::StatusOr<std::unique_ptr<CausalLm>> BuildModel(
    const ModelConfig& config, WeightSource* source, Backend* backend, const LoadOptions& options,
    const ExpertDispatcherFactory& make_dispatcher) {
  absl::StatusOr<const Architecture*> arch = FindArchitecture(config);
  if (!arch.ok()) return arch.status();
  ModelBuildArgs args;
  args.config = &config;
  args.source = source;
  args.backend = backend;
  args.load = options;
  args.make_dispatcher = make_dispatcher;
  return (*arch)->build(args);
}

absl::StatusOr<std::unique_ptr<CausalLm>> LoadModel(
    const std::string& model, Backend* backend, const LoadOptions& options,
    const ExpertDispatcherFactory& make_dispatcher) {
  ModelConfig config;
  auto source = OpenWeightSource(model, &config);
  if (!source.ok()) return source.status();
  return BuildModel(config, source->get(), backend, options, make_dispatcher);
}

}  // namespace deepinfer
