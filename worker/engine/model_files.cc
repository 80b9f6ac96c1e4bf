// ModelFiles::Open.
#include "worker/engine/model_files.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
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

std::string FileText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// FNV-1a, as 16 hex digits.
std::string HexHash(const std::string& bytes) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ull;
  return absl::StrFormat("%016x", h);
}

// See ModelFiles::fingerprint.
std::string Fingerprint(const std::string& spec, const std::string& config_path, bool dummy) {
  std::string weights;
  if (dummy) {
    const size_t at = spec.rfind('@');
    weights = absl::StrCat("dummy@", at == std::string::npos ? "" : spec.substr(at + 1));
  } else {
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(spec, ec)) {
      const std::string name = entry.path().filename().string();
      if (!absl::EndsWith(name, ".safetensors")) continue;
      files.push_back(absl::StrCat(name, ":", entry.file_size(ec)));
    }
    std::sort(files.begin(), files.end());
    weights = absl::StrJoin(files, ",");
  }
  return absl::StrCat("config-", HexHash(FileText(config_path)), "-weights-", HexHash(weights));
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
  files->fingerprint = Fingerprint(spec, config_path, dummy);
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
