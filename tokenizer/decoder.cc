#include "tokenizer/decoder.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "tokenizer/config_json.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";

class SequenceDecoder : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts)
      : parts_(std::move(parts)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (const auto& part : parts_) part->DecodeChain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

// Maps the byte-level alphabet back to bytes. A token with any character outside the alphabet
// (an added token such as "<｜User｜>") is kept as its own UTF-8, as HF does.
class ByteLevelDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
    std::string bytes;
    for (const std::string& token : *tokens) {
      const size_t mark = bytes.size();
      bool in_alphabet = true;
      for (size_t pos = 0; pos < token.size();) {
        const size_t n = ValidUtf8SequenceLength(token, pos);
        size_t length = 1;
        const int byte = n == 0 ? -1 : alphabet.ByteFor(DecodeCodePoint(token, pos, &length));
        if (byte < 0) {
          in_alphabet = false;
          break;
        }
        bytes.push_back(static_cast<char>(byte));
        pos += length;
      }
      if (!in_alphabet) {
        bytes.resize(mark);
        bytes += token;
      }
    }
    tokens->assign(1, RepairUtf8(bytes));
  }
};

// "<0xAB>" tokens become bytes; each run of them becomes its text if valid UTF-8, otherwise
// one U+FFFD per byte token (HF's rule).
class ByteFallbackDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_tokens = 0;
    auto flush = [&] {
      if (run_tokens == 0) return;
      if (IsValidUtf8(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_tokens; ++i) out.push_back(kReplacementChar);
      }
      run.clear();
      run_tokens = 0;
    };
    for (std::string& token : *tokens) {
      int value = -1;
      if (token.size() == 6 && token.compare(0, 3, "<0x") == 0 && token[5] == '>') {
        auto hex = [](char c) {
          return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        };
        const int high = hex(token[3]), low = hex(token[4]);
        if (high >= 0 && low >= 0) value = high * 16 + low;
      }
      if (value >= 0) {
        run.push_back(static_cast<char>(value));
        ++run_tokens;
      } else {
        flush();
        out.push_back(std::move(token));
      }
    }
    flush();
    *tokens = std::move(out);
  }
};

class FuseDecoder : public Decoder {
 public:
  void DecodeChain(std::vector<std::string>* tokens) const override {
    tokens->assign(1, absl::StrJoin(*tokens, ""));
  }
};

class ReplaceDecoder : public Decoder {
 public:
  ReplaceDecoder(std::string from, std::string to) : from_(std::move(from)), to_(std::move(to)) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) token = absl::StrReplaceAll(token, {{from_, to_}});
  }

 private:
  std::string from_, to_;
};

// Removes up to `start` leading and `stop` trailing copies of `content` from each token.
class StripDecoder : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop)
      : content_(std::move(content)), start_(start), stop_(stop) {}
  void DecodeChain(std::vector<std::string>* tokens) const override {
    for (std::string& token : *tokens) {
      size_t begin = 0, end = token.size();
      for (size_t i = 0; i < start_ && token.compare(begin, content_.size(), content_) == 0 &&
                         begin + content_.size() <= end;
           ++i) {
        begin += content_.size();
      }
      for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                         token.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      token = token.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

}  // namespace

std::string Decoder::Decode(const Decoder* decoder, std::vector<std::string> tokens) {
  if (decoder == nullptr) return absl::StrJoin(tokens, " ");
  decoder->DecodeChain(&tokens);
  return absl::StrJoin(tokens, "");
}

absl::StatusOr<std::unique_ptr<Decoder>> Decoder::FromJson(const nlohmann::json& config) {
  if (config.is_null()) return std::unique_ptr<Decoder>();
  auto type = GetStringField(config, "type", "decoder");
  if (!type.ok()) return type.status();
  if (*type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (*type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (*type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (*type == "Replace") {
    auto content = GetStringField(config, "content", "Replace decoder");
    if (!content.ok()) return content.status();
    auto pattern = config.find("pattern");
    if (pattern == config.end() || !pattern->is_object() || !pattern->contains("String") ||
        !(*pattern)["String"].is_string()) {
      return absl::UnimplementedError("Replace decoder: only String patterns are supported");
    }
    return std::unique_ptr<Decoder>(
        new ReplaceDecoder((*pattern)["String"].get<std::string>(), *std::move(content)));
  }
  if (*type == "Strip") {
    auto content = GetStringField(config, "content", "Strip decoder");
    if (!content.ok()) return content.status();
    auto number = [&](const char* key) -> size_t {
      auto it = config.find(key);
      return it != config.end() && it->is_number_integer() && it->get<int64_t>() >= 0
                 ? it->get<size_t>()
                 : 0;
    };
    return std::unique_ptr<Decoder>(
        new StripDecoder(*std::move(content), number("start"), number("stop")));
  }
  if (*type == "Sequence") {
    auto it = config.find("decoders");
    if (it == config.end() || !it->is_array()) {
      return absl::InvalidArgumentError("Sequence decoder: missing 'decoders'");
    }
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& part_config : *it) {
      auto part = FromJson(part_config);
      if (!part.ok()) return part.status();
      if (*part) parts.push_back(*std::move(part));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  return absl::UnimplementedError(absl::StrCat("decoder type '", *type, "' not supported"));
}

}  // namespace deepinfer::tokenizer
