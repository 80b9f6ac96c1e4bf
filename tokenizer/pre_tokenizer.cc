#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <functional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/config_json.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

// The GPT-2 word regex that ByteLevel applies when use_regex is true.
constexpr char kGpt2Pattern[] =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

struct Range {
  size_t begin, end;
  bool is_match;
};

void ApplyToEach(std::vector<std::string>* splits,
                 const std::function<void(std::string&&, std::vector<std::string>*)>& fn) {
  std::vector<std::string> out;
  out.reserve(splits->size() * 2);
  for (std::string& split : *splits) fn(std::move(split), &out);
  *splits = std::move(out);
}

class SequencePreTokenizer : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts)
      : parts_(std::move(parts)) {}
  void PreTokenize(std::vector<std::string>* splits) const override {
    for (const auto& part : parts_) part->PreTokenize(splits);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

class SplitPreTokenizer : public PreTokenizer {
 public:
  SplitPreTokenizer(std::unique_ptr<Regex> pattern, SplitBehavior behavior, bool invert)
      : pattern_(std::move(pattern)), behavior_(behavior), invert_(invert) {}
  void PreTokenize(std::vector<std::string>* splits) const override {
    ApplyToEach(splits, [this](std::string&& split, std::vector<std::string>* out) {
      SplitWithPattern(split, *pattern_, behavior_, invert_, out);
    });
  }

 private:
  std::unique_ptr<Regex> pattern_;
  SplitBehavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void PreTokenize(std::vector<std::string>* splits) const override {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
    ApplyToEach(splits, [&](std::string&& split, std::vector<std::string>* out) {
      if (add_prefix_space_ && (split.empty() || split[0] != ' ')) split.insert(0, " ");
      const size_t first = out->size();
      if (regex_ != nullptr) {
        SplitWithPattern(split, *regex_, SplitBehavior::kIsolated, false, out);
      } else {
        out->push_back(std::move(split));
      }
      for (size_t i = first; i < out->size(); ++i) {
        std::string mapped;
        mapped.reserve((*out)[i].size() * 2);
        for (char c : (*out)[i]) mapped += alphabet.CharFor(static_cast<uint8_t>(c));
        (*out)[i] = std::move(mapped);
      }
    });
  }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // null when use_regex is false
};

}  // namespace

absl::StatusOr<SplitBehavior> ParseSplitBehavior(const std::string& name) {
  if (name == "Removed") return SplitBehavior::kRemoved;
  if (name == "Isolated") return SplitBehavior::kIsolated;
  if (name == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (name == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (name == "Contiguous") return SplitBehavior::kContiguous;
  return absl::InvalidArgumentError(absl::StrCat("unknown split behavior '", name, "'"));
}

void SplitWithPattern(const std::string& text, const Regex& pattern, SplitBehavior behavior,
                      bool invert, std::vector<std::string>* out) {
  if (text.empty()) return;
  // The text as alternating non-match / match ranges (empty matches included), as HF does.
  std::vector<std::pair<size_t, size_t>> matches;
  pattern.FindAll(text, &matches);
  std::vector<Range> ranges;
  ranges.reserve(matches.size() * 2 + 1);
  size_t previous = 0;
  for (const auto& [begin, end] : matches) {
    if (previous != begin) ranges.push_back({previous, begin, invert});
    ranges.push_back({begin, end, !invert});
    previous = end;
  }
  if (previous != text.size()) ranges.push_back({previous, text.size(), invert});

  std::vector<Range> pieces;
  pieces.reserve(ranges.size());
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      pieces = std::move(ranges);
      break;
    case SplitBehavior::kRemoved:
      for (const Range& r : ranges) {
        if (!r.is_match) pieces.push_back(r);
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Range& r : ranges) {
        if (r.is_match && !previous_match && !pieces.empty()) {
          pieces.back().end = r.end;
        } else {
          pieces.push_back(r);
        }
        previous_match = r.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = ranges.rbegin(); it != ranges.rend(); ++it) {
        if (it->is_match && !previous_match && !pieces.empty()) {
          pieces.back().begin = it->begin;
        } else {
          pieces.push_back(*it);
        }
        previous_match = it->is_match;
      }
      std::reverse(pieces.begin(), pieces.end());
      break;
    case SplitBehavior::kContiguous:
      for (const Range& r : ranges) {
        if (r.is_match == previous_match && !pieces.empty()) {
          pieces.back().end = r.end;
        } else {
          pieces.push_back(r);
        }
        previous_match = r.is_match;
      }
      break;
  }
  for (const Range& r : pieces) {
    if (r.end > r.begin) out->emplace_back(text, r.begin, r.end - r.begin);
  }
}

absl::StatusOr<std::unique_ptr<PreTokenizer>> PreTokenizer::FromJson(const nlohmann::json& config) {
  if (config.is_null()) return std::unique_ptr<PreTokenizer>();
  auto type = GetStringField(config, "type", "pre_tokenizer");
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    auto it = config.find("pretokenizers");
    if (it == config.end() || !it->is_array()) {
      return absl::InvalidArgumentError("Sequence pre_tokenizer: missing 'pretokenizers' array");
    }
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    for (const auto& part_config : *it) {
      auto part = FromJson(part_config);
      if (!part.ok()) return part.status();
      if (*part) parts.push_back(*std::move(part));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  if (*type == "Split") {
    auto it = config.find("pattern");
    if (it == config.end()) return absl::InvalidArgumentError("Split pre_tokenizer: no pattern");
    auto pattern = CompilePatternJson(*it);
    if (!pattern.ok()) return pattern.status();
    auto behavior_name = GetStringField(config, "behavior", "Split pre_tokenizer");
    if (!behavior_name.ok()) return behavior_name.status();
    auto behavior = ParseSplitBehavior(*behavior_name);
    if (!behavior.ok()) return behavior.status();
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(
        *std::move(pattern), *behavior, GetBoolField(config, "invert", false)));
  }
  if (*type == "ByteLevel") {
    std::unique_ptr<Regex> regex;
    if (GetBoolField(config, "use_regex", true)) {
      auto compiled = Regex::Compile(kGpt2Pattern);
      if (!compiled.ok()) return compiled.status();
      regex = *std::move(compiled);
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(
        GetBoolField(config, "add_prefix_space", true), std::move(regex)));
  }
  if (*type == "Digits") {
    // HF: each numeric character alone, or runs of them, split off as their own pieces.
    const bool individual = GetBoolField(config, "individual_digits", false);
    auto regex = Regex::Compile("\\p{N}");
    if (!regex.ok()) return regex.status();
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(
        *std::move(regex), individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous,
        false));
  }
  return absl::UnimplementedError(absl::StrCat("pre_tokenizer type '", *type, "' not supported"));
}

}  // namespace deepinfer::tokenizer
