#include "tokenizer/post_processor.h"

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/config_json.h"

namespace deepinfer::tokenizer {
namespace {

class IdentityPostProcessor : public PostProcessor {
 public:
  void Process(std::vector<uint32_t>*) const override {}
};

class SequencePostProcessor : public PostProcessor {
 public:
  explicit SequencePostProcessor(std::vector<std::unique_ptr<PostProcessor>> parts)
      : parts_(std::move(parts)) {}
  void Process(std::vector<uint32_t>* ids) const override {
    for (const auto& part : parts_) part->Process(ids);
  }

 private:
  std::vector<std::unique_ptr<PostProcessor>> parts_;
};

class SurroundPostProcessor : public PostProcessor {
 public:
  SurroundPostProcessor(std::vector<uint32_t> prefix, std::vector<uint32_t> suffix)
      : prefix_(std::move(prefix)), suffix_(std::move(suffix)) {}
  void Process(std::vector<uint32_t>* ids) const override {
    ids->insert(ids->begin(), prefix_.begin(), prefix_.end());
    ids->insert(ids->end(), suffix_.begin(), suffix_.end());
  }

 private:
  std::vector<uint32_t> prefix_, suffix_;
};

absl::StatusOr<std::unique_ptr<PostProcessor>> TemplateFromJson(const nlohmann::json& config) {
  absl::flat_hash_map<std::string, std::vector<uint32_t>> special_ids;
  auto special = config.find("special_tokens");
  if (special != config.end() && special->is_object()) {
    for (const auto& [name, entry] : special->items()) {
      auto ids = entry.find("ids");
      if (ids == entry.end() || !ids->is_array()) {
        return absl::InvalidArgumentError(absl::StrCat("TemplateProcessing: no ids for ", name));
      }
      std::vector<uint32_t>& out = special_ids[name];
      for (const auto& id : *ids) {
        if (!(id.is_number_integer() && id.get<int64_t>() >= 0))
          return absl::InvalidArgumentError("bad special token id");
        out.push_back(id.get<uint32_t>());
      }
    }
  }
  auto single = config.find("single");
  if (single == config.end() || !single->is_array()) {
    return absl::InvalidArgumentError("TemplateProcessing: missing 'single' template");
  }
  std::vector<uint32_t> prefix, suffix;
  bool seen_sequence = false;
  for (const auto& item : *single) {
    if (item.contains("Sequence")) {
      if (seen_sequence) return absl::UnimplementedError("template repeats the sequence");
      seen_sequence = true;
      continue;
    }
    auto token = item.find("SpecialToken");
    if (token == item.end() || !token->is_object() || !token->contains("id") ||
        !(*token)["id"].is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("TemplateProcessing: bad item ", item.dump()));
    }
    auto ids = special_ids.find((*token)["id"].get<std::string>());
    if (ids == special_ids.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("TemplateProcessing: unknown special token ", (*token)["id"].dump()));
    }
    std::vector<uint32_t>& target = seen_sequence ? suffix : prefix;
    target.insert(target.end(), ids->second.begin(), ids->second.end());
  }
  return PostProcessor::Surround(std::move(prefix), std::move(suffix));
}

}  // namespace

std::unique_ptr<PostProcessor> PostProcessor::Surround(std::vector<uint32_t> prefix,
                                                       std::vector<uint32_t> suffix) {
  return std::make_unique<SurroundPostProcessor>(std::move(prefix), std::move(suffix));
}

absl::StatusOr<std::unique_ptr<PostProcessor>> PostProcessor::FromJson(
    const nlohmann::json& config) {
  if (config.is_null()) return std::unique_ptr<PostProcessor>();
  auto type = GetStringField(config, "type", "post_processor");
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return std::unique_ptr<PostProcessor>(new IdentityPostProcessor());
  if (*type == "TemplateProcessing") return TemplateFromJson(config);
  if (*type == "Sequence") {
    auto it = config.find("processors");
    if (it == config.end() || !it->is_array()) {
      return absl::InvalidArgumentError("Sequence post_processor: missing 'processors'");
    }
    std::vector<std::unique_ptr<PostProcessor>> parts;
    for (const auto& part_config : *it) {
      auto part = FromJson(part_config);
      if (!part.ok()) return part.status();
      if (*part) parts.push_back(*std::move(part));
    }
    return std::unique_ptr<PostProcessor>(new SequencePostProcessor(std::move(parts)));
  }
  return absl::UnimplementedError(absl::StrCat("post_processor '", *type, "' not supported"));
}

}  // namespace deepinfer::tokenizer
