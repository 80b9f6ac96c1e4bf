// make_demo_model: writes a small DeepSeek-V3-architecture checkpoint with random
// weights and the real DeepSeek-V3 tokenizer, so a fresh checkout can run a real job
// (`deepinfer run`) without downloading weights. The outputs are not meaningful text;
// everything else (tokenizer, chat template, MLA, MoE routing, sampling) is the real path.
//
//   make_demo_model --out models/demo --tokenizer-dir DIR_WITH_TOKENIZER_JSON
//
// The tensors written are exactly those the loader asks for: a recording WeightSource
// around the dummy one captures each (name, shape) while ModelWeights::Load runs.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/flags/flag_set.h"
#include "nlohmann/json.hpp"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/dummy_weight_source.h"
#include "worker/model/model_config.h"
#include "worker/model/model_weights.h"
#include "worker/model/safetensors_writer.h"

namespace deepinfer {
namespace {

// Forwards reads to the dummy source and keeps a BF16 copy of every tensor read.
class RecordingSource : public WeightSource {
 public:
  RecordingSource(WeightSource* inner, SafetensorsWriter* writer) : inner_(inner), writer_(writer) {}
  absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                           float* out) override {
    if (absl::Status s = inner_->ReadFloat32(name, shape, out); !s.ok()) return s;
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    // Values are rounded to BF16 in the file; the model reads them back from there.
    if (written_.insert(name).second) writer_->AddBf16(name, shape, std::vector<float>(out, out + n));
    return absl::OkStatus();
  }
  bool Contains(const std::string& name) const override { return inner_->Contains(name); }
  std::string description() const override { return inner_->description(); }

 private:
  WeightSource* inner_;
  SafetensorsWriter* writer_;
  std::set<std::string> written_;
};

nlohmann::ordered_json DemoConfig() {
  return {
      {"architectures", {"DeepseekV3ForCausalLM"}},
      {"model_type", "deepseek_v3"},
      {"vocab_size", 129280},
      {"hidden_size", 128},
      {"intermediate_size", 256},
      {"moe_intermediate_size", 64},
      {"num_hidden_layers", 3},
      {"num_attention_heads", 4},
      {"num_key_value_heads", 4},
      {"q_lora_rank", nullptr},
      {"kv_lora_rank", 64},
      {"qk_nope_head_dim", 32},
      {"qk_rope_head_dim", 16},
      {"v_head_dim", 32},
      {"n_routed_experts", 8},
      {"n_shared_experts", 1},
      {"num_experts_per_tok", 2},
      {"n_group", 2},
      {"topk_group", 1},
      {"topk_method", "noaux_tc"},
      {"scoring_func", "sigmoid"},
      {"norm_topk_prob", true},
      {"routed_scaling_factor", 2.5},
      {"first_k_dense_replace", 1},
      {"moe_layer_freq", 1},
      {"rms_norm_eps", 1e-6},
      {"max_position_embeddings", 4096},
      {"rope_theta", 10000.0},
      {"rope_interleave", true},
      {"tie_word_embeddings", false},
      {"num_nextn_predict_layers", 0},
      {"bos_token_id", 0},
      {"eos_token_id", 1},
      {"torch_dtype", "bfloat16"},
  };
}

bool Copy(const std::string& from, const std::string& to) {
  std::ifstream in(from, std::ios::binary);
  std::ofstream out(to, std::ios::binary | std::ios::trunc);
  out << in.rdbuf();
  return in.good() && out.good();
}

int Main(int argc, char** argv) {
  std::string out_dir;
  std::string tokenizer_dir;
  int64_t seed = 1;
  FlagSet flags("make_demo_model --out DIR --tokenizer-dir DIR [--seed N]",
                "Writes a small random-weight DeepSeek-V3 checkpoint with a real tokenizer.");
  flags.AddString("out", &out_dir, "Directory to write (created if missing).");
  flags.Require("out");
  flags.AddString("tokenizer-dir", &tokenizer_dir,
                  "Directory holding tokenizer.json and tokenizer_config.json to copy.");
  flags.Require("tokenizer-dir");
  flags.AddInt("seed", &seed, "Seed of the random weights.");
  absl::Status parsed = flags.Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (flags.help_requested()) {
    std::cout << flags.Help();
    return 0;
  }
  if (!parsed.ok()) {
    std::cerr << "make_demo_model: " << parsed.message() << "\n";
    return 2;
  }
  std::error_code mkdir_error;
  std::filesystem::create_directories(out_dir, mkdir_error);
  if (mkdir_error) {
    std::cerr << "make_demo_model: cannot create " << out_dir << ": " << mkdir_error.message()
              << "\n";
    return 1;
  }
  const std::string config_text = DemoConfig().dump(2);
  absl::StatusOr<ModelConfig> config = ModelConfig::FromJson(config_text, "demo config");
  if (!config.ok()) {
    std::cerr << "make_demo_model: " << config.status().message() << "\n";
    return 1;
  }
  SafetensorsWriter writer;
  DummyWeightSource dummy(static_cast<uint64_t>(seed));
  RecordingSource recording(&dummy, &writer);
  CpuBackend backend(1);
  absl::StatusOr<std::unique_ptr<ModelWeights>> weights =
      ModelWeights::Load(*config, &recording, &backend, LoadOptions());
  if (!weights.ok()) {
    std::cerr << "make_demo_model: " << weights.status().message() << "\n";
    return 1;
  }
  if (absl::Status s = writer.Write(out_dir + "/model.safetensors"); !s.ok()) {
    std::cerr << "make_demo_model: " << s.message() << "\n";
    return 1;
  }
  std::ofstream(out_dir + "/config.json") << config_text << "\n";
  std::ofstream(out_dir + "/generation_config.json")
      << nlohmann::ordered_json({{"bos_token_id", 0}, {"eos_token_id", 1}}).dump(2) << "\n";
  for (const char* name : {"tokenizer.json", "tokenizer_config.json"}) {
    if (!Copy(tokenizer_dir + "/" + name, out_dir + "/" + name)) {
      std::cerr << "make_demo_model: cannot copy " << tokenizer_dir << "/" << name << "\n";
      return 1;
    }
  }
  std::cout << "demo model written to " << out_dir << "\n";
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) { return deepinfer::Main(argc, argv); }
