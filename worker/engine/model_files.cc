// ModelFiles::Open.
#include "worker/engine/model_files.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "worker/model/safetensors_checkpoint.h"

namespace deepinfer {
namespace {

// Parsed JSON file; null when the file does not exist, an error when it does not parse.
absl::StatusOr<nlohmann::json> ReadJsonIfPresent(const std::string& path) {
  std::ifstream in(path);
  if (!in) return nlohmann::json();
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(path, ": not valid JSON"));
  return j;
}

// eos_token_id as HF writes it: a number or a list of numbers.
std::vector<int32_t> EosIds(const nlohmann::json& j) {
  std::vector<int32_t> ids;
  if (!j.is_object()) return ids;
  auto it = j.find("eos_token_id");
  if (it == j.end()) return ids;
  if (it->is_number_integer()) ids.push_back(it->get<int32_t>());
  if (it->is_array()) {
    for (const auto& v : *it) {
      if (v.is_number_integer()) ids.push_back(v.get<int32_t>());
    }
  }
  return ids;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ModelFiles>> ModelFiles::Open(const std::string& spec) {
  auto files = std::make_unique<ModelFiles>();
  files->spec = spec;
  std::string config_path;
  const bool dummy = absl::StartsWith(spec, "dummy:");
  if (dummy) {
    config_path = spec.substr(6);
    const size_t at = config_path.rfind('@');
    if (at != std::string::npos) config_path = config_path.substr(0, at);
    const size_t slash = config_path.rfind('/');
    files->dir = slash == std::string::npos ? "." : config_path.substr(0, slash);
  } else {
    files->dir = spec;
    config_path = spec + "/config.json";
  }
  auto config = ModelConfig::FromFile(config_path);
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat("model '", spec, "': ", config.status().message()));
  }
  files->config = *config;
  if (!dummy) {
    auto ckpt = SafetensorsCheckpoint::Open(spec, config->fp8_block_rows, config->fp8_block_cols);
    if (!ckpt.ok()) {
      return absl::Status(ckpt.status().code(),
                          absl::StrCat("model '", spec, "': ", ckpt.status().message()));
    }
  }
  auto tok = tokenizer::Tokenizer::FromDirectory(files->dir);
  if (tok.ok()) {
    files->tokenizer = std::move(*tok);
  } else if (!absl::IsNotFound(tok.status())) {
    return absl::Status(tok.status().code(),
                        absl::StrCat("model '", spec, "': tokenizer: ", tok.status().message()));
  }
  auto generation = ReadJsonIfPresent(files->dir + "/generation_config.json");
  if (!generation.ok()) return generation.status();
  files->eos_token_ids = EosIds(*generation);
  if (files->eos_token_ids.empty()) {
    auto raw_config = ReadJsonIfPresent(config_path);
    if (raw_config.ok()) files->eos_token_ids = EosIds(*raw_config);
  }
  if (files->eos_token_ids.empty() && files->tokenizer != nullptr) {
    auto eos = tokenizer::TokenContent(files->tokenizer->config(), "eos_token");
    if (eos.has_value()) {
      auto id = files->tokenizer->TokenToId(*eos);
      if (id.has_value()) files->eos_token_ids.push_back(static_cast<int32_t>(*id));
    }
  }
  for (int32_t id : files->eos_token_ids) {
    if (id < 0 || id >= files->config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("model '", spec, "': eos_token_id ", id, " outside the vocabulary"));
    }
  }
  return files;
}

}  // namespace deepinfer
