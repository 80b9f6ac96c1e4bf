#include "tokenizer/normalizer.h"

#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/config_json.h"
#include "tokenizer/regex.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

class SequenceNormalizer : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts)
      : parts_(std::move(parts)) {}
  void Normalize(std::string* text) const override {
    for (const auto& part : parts_) part->Normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class PrependNormalizer : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  // HF prepends only to non-empty text.
  void Normalize(std::string* text) const override {
    if (!text->empty()) text->insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer : public Normalizer {
 public:
  ReplaceNormalizer(std::unique_ptr<Regex> pattern, std::string content)
      : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void Normalize(std::string* text) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    pattern_->FindAll(*text, &matches);
    if (matches.empty()) return;
    std::string out;
    size_t last = 0;
    for (const auto& [begin, end] : matches) {
      out.append(*text, last, begin - last);
      out += content_;
      last = end;
    }
    out.append(*text, last, std::string::npos);
    *text = std::move(out);
  }

 private:
  std::unique_ptr<Regex> pattern_;
  std::string content_;
};

class StripNormalizer : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void Normalize(std::string* text) const override {
    size_t begin = 0, end = text->size();
    if (left_) {
      while (begin < end) {
        size_t n;
        if (!IsUnicodeWhitespace(DecodeCodePoint(*text, begin, &n))) break;
        begin += n;
      }
    }
    if (right_) {
      while (end > begin) {
        size_t start = end - 1;
        while (start > begin && (static_cast<uint8_t>((*text)[start]) & 0xC0) == 0x80) --start;
        size_t n;
        if (!IsUnicodeWhitespace(DecodeCodePoint(*text, start, &n))) break;
        end = start;
      }
    }
    *text = text->substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Normalizer>> Normalizer::FromJson(const nlohmann::json& config) {
  if (config.is_null()) return std::unique_ptr<Normalizer>();
  auto type = GetStringField(config, "type", "normalizer");
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    auto it = config.find("normalizers");
    if (it == config.end() || !it->is_array()) {
      return absl::InvalidArgumentError("Sequence normalizer: missing 'normalizers' array");
    }
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& part_config : *it) {
      auto part = FromJson(part_config);
      if (!part.ok()) return part.status();
      if (*part) parts.push_back(*std::move(part));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  if (*type == "Prepend") {
    auto prepend = GetStringField(config, "prepend", "Prepend normalizer");
    if (!prepend.ok()) return prepend.status();
    return std::unique_ptr<Normalizer>(new PrependNormalizer(*std::move(prepend)));
  }
  if (*type == "Replace") {
    auto content = GetStringField(config, "content", "Replace normalizer");
    if (!content.ok()) return content.status();
    auto it = config.find("pattern");
    if (it == config.end()) return absl::InvalidArgumentError("Replace normalizer: no pattern");
    auto pattern = CompilePatternJson(*it);
    if (!pattern.ok()) return pattern.status();
    return std::unique_ptr<Normalizer>(
        new ReplaceNormalizer(*std::move(pattern), *std::move(content)));
  }
  if (*type == "Strip") {
    return std::unique_ptr<Normalizer>(new StripNormalizer(
        GetBoolField(config, "strip_left", true), GetBoolField(config, "strip_right", true)));
  }
  return absl::UnimplementedError(absl::StrCat("normalizer type '", *type, "' is not supported"));
}

}  // namespace deepinfer::tokenizer
