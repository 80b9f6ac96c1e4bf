#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::ostringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

// Tokenizer classes whose transformers implementation rebuilds the post-processor from
// add_bos_token / add_eos_token (LlamaTokenizerFast.update_post_processor and kin).
bool RebuildsPostProcessor(const nlohmann::json& config) {
  static const auto* classes = new absl::flat_hash_set<std::string>{
      "LlamaTokenizer",         "LlamaTokenizerFast", "CodeLlamaTokenizer",
      "CodeLlamaTokenizerFast", "GemmaTokenizer",     "GemmaTokenizerFast"};
  auto it = config.find("tokenizer_class");
  return it != config.end() && it->is_string() && classes->contains(it->get<std::string>());
}

// HF tokenizers ignores the ids written in added_tokens: while loading it adds the tokens in
// order, and a token gets the id its content already has (as an earlier added token or in the
// model vocabulary), or else the next id after the vocabulary / the largest added id. Real
// files agree with this; for the ones that do not, HF's ids are the ones that count.
void AssignAddedTokenIds(const BpeModel& model, std::vector<AddedToken>* tokens) {
  absl::flat_hash_map<std::string, uint32_t> assigned;
  std::optional<uint32_t> max_added;
  const uint32_t vocab_size = static_cast<uint32_t>(model.VocabSize());
  for (AddedToken& token : *tokens) {
    uint32_t id;
    auto earlier = assigned.find(token.content);
    if (earlier != assigned.end()) {
      id = earlier->second;
    } else if (std::optional<uint32_t> in_vocab = model.TokenToId(token.content)) {
      id = *in_vocab;
    } else if (!max_added.has_value()) {
      id = vocab_size;
    } else {
      id = (*max_added >= vocab_size || vocab_size == 0) ? *max_added + 1 : vocab_size;
    }
    if (id != token.id) {
      LOG(WARNING) << "added token '" << token.content << "' has id " << token.id
                   << " in tokenizer.json but gets id " << id << ", as in HF tokenizers";
      token.id = id;
    }
    assigned.emplace(token.content, id);
    max_added = max_added.has_value() ? std::max(*max_added, id) : id;
  }
}

}  // namespace

std::optional<std::string> TokenContent(const nlohmann::json& config, const char* key) {
  if (!config.is_object()) return std::nullopt;
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  return std::nullopt;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(
    absl::string_view tokenizer_json, const nlohmann::json& tokenizer_config) {
  const nlohmann::json root =
      nlohmann::json::parse(tokenizer_json.begin(), tokenizer_json.end(), nullptr,
                            /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("tokenizer.json is not valid JSON");
  return FromParsedJson(root, tokenizer_config);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromParsedJson(
    const nlohmann::json& root, const nlohmann::json& tokenizer_config) {
  if (!root.is_object()) return absl::InvalidArgumentError("tokenizer.json is not a JSON object");
  auto section = [&root](const char* key) -> const nlohmann::json& {
    static const nlohmann::json* null_json = new nlohmann::json();
    auto it = root.find(key);
    return it == root.end() ? *null_json : *it;
  };
  std::unique_ptr<Tokenizer> tokenizer(new Tokenizer());
  tokenizer->config_ = tokenizer_config;
  auto annotate = [](const absl::Status& status, const char* what) {
    return absl::Status(status.code(),
                        absl::StrCat("tokenizer.json ", what, ": ", status.message()));
  };

  auto normalizer = Normalizer::FromJson(section("normalizer"));
  if (!normalizer.ok()) return annotate(normalizer.status(), "normalizer");
  tokenizer->normalizer_ = *std::move(normalizer);
  auto pre_tokenizer = PreTokenizer::FromJson(section("pre_tokenizer"));
  if (!pre_tokenizer.ok()) return annotate(pre_tokenizer.status(), "pre_tokenizer");
  tokenizer->pre_tokenizer_ = *std::move(pre_tokenizer);
  auto model = BpeModel::FromJson(section("model"));
  if (!model.ok()) return annotate(model.status(), "model");
  tokenizer->model_ = *std::move(model);
  auto post_processor = PostProcessor::FromJson(section("post_processor"));
  if (!post_processor.ok()) return annotate(post_processor.status(), "post_processor");
  tokenizer->post_processor_ = *std::move(post_processor);
  auto decoder = Decoder::FromJson(section("decoder"));
  if (!decoder.ok()) return annotate(decoder.status(), "decoder");
  tokenizer->decoder_ = *std::move(decoder);
  auto added_tokens = AddedVocabulary::ParseJson(section("added_tokens"));
  if (!added_tokens.ok()) return annotate(added_tokens.status(), "added_tokens");
  AssignAddedTokenIds(*tokenizer->model_, &*added_tokens);
  auto added_vocabulary =
      AddedVocabulary::Create(*std::move(added_tokens), tokenizer->normalizer_.get());
  if (!added_vocabulary.ok()) return annotate(added_vocabulary.status(), "added_tokens");
  tokenizer->added_vocabulary_ = *std::move(added_vocabulary);

  if (RebuildsPostProcessor(tokenizer_config)) {
    // transformers: single = "[bos:0 ]$A:0[ eos:0]" from add_bos_token (default true) and
    // add_eos_token (default false), replacing tokenizer.json's post-processor.
    std::vector<uint32_t> prefix, suffix;
    auto add = [&](const char* flag, bool fallback, const char* token_key,
                   std::vector<uint32_t>* out) -> absl::Status {
      auto it = tokenizer_config.find(flag);
      const bool enabled =
          it != tokenizer_config.end() && it->is_boolean() ? it->get<bool>() : fallback;
      if (!enabled) return absl::OkStatus();
      const std::optional<std::string> content = TokenContent(tokenizer_config, token_key);
      if (!content.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer_config.json: ", flag, " is set but ", token_key, " is not"));
      }
      const std::optional<uint32_t> id = tokenizer->TokenToId(*content);
      if (!id.has_value()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tokenizer_config.json: ", token_key, " '", *content, "' has no id"));
      }
      out->push_back(*id);
      return absl::OkStatus();
    };
    absl::Status status = add("add_bos_token", true, "bos_token", &prefix);
    if (status.ok()) status = add("add_eos_token", false, "eos_token", &suffix);
    if (!status.ok()) return status;
    tokenizer->post_processor_ = PostProcessor::Surround(std::move(prefix), std::move(suffix));
  }
  return tokenizer;
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromDirectory(const std::string& directory) {
  auto tokenizer_json = ReadFile(directory + "/tokenizer.json");
  if (!tokenizer_json.ok()) {
    return absl::NotFoundError(
        absl::StrCat("model directory '", directory, "' has no readable tokenizer.json"));
  }
  nlohmann::json config;
  auto config_text = ReadFile(directory + "/tokenizer_config.json");
  if (config_text.ok()) {
    config = nlohmann::json::parse(*config_text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(directory, "/tokenizer_config.json is not a JSON object"));
    }
  }
  return FromJson(*tokenizer_json, config);
}

void Tokenizer::EncodeText(absl::string_view text, std::vector<uint32_t>* ids) const {
  std::vector<std::string> words = {std::string(text)};
  if (pre_tokenizer_ != nullptr) pre_tokenizer_->PreTokenize(&words);
  for (const std::string& word : words) model_->Tokenize(word, ids);
}

std::vector<uint32_t> Tokenizer::Encode(absl::string_view input, bool add_special_tokens) const {
  std::string repaired;
  if (!IsValidUtf8(input)) {
    repaired = RepairUtf8(input);
    input = repaired;
  }
  std::vector<uint32_t> ids;
  std::vector<TextPiece> raw_pieces;
  added_vocabulary_->Split(input, /*normalized_pass=*/false, &raw_pieces);
  std::vector<TextPiece> pieces;
  for (const TextPiece& raw : raw_pieces) {
    if (raw.token_id.has_value()) {
      ids.push_back(*raw.token_id);
      continue;
    }
    std::string normalized(input.substr(raw.begin, raw.end - raw.begin));
    if (normalizer_ != nullptr) normalizer_->Normalize(&normalized);
    pieces.clear();
    added_vocabulary_->Split(normalized, /*normalized_pass=*/true, &pieces);
    for (const TextPiece& piece : pieces) {
      if (piece.token_id.has_value()) {
        ids.push_back(*piece.token_id);
      } else {
        EncodeText(absl::string_view(normalized).substr(piece.begin, piece.end - piece.begin),
                   &ids);
      }
    }
  }
  if (add_special_tokens && post_processor_ != nullptr) post_processor_->Process(&ids);
  return ids;
}

absl::StatusOr<std::string> Tokenizer::Decode(absl::Span<const uint32_t> ids,
                                              bool skip_special_tokens) const {
  for (uint32_t id : ids) {
    if (IdToToken(id) == nullptr) {
      return absl::OutOfRangeError(absl::StrCat("unknown token id ", id));
    }
  }
  return DecodeSkippingUnknown(ids, skip_special_tokens);
}

std::string Tokenizer::DecodeSkippingUnknown(absl::Span<const uint32_t> ids,
                                             bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (uint32_t id : ids) {
    const AddedToken* added = added_vocabulary_->FindById(id);
    if (added != nullptr) {
      if (!(skip_special_tokens && added->special)) tokens.push_back(added->content);
      continue;
    }
    const std::string* token = model_->IdToToken(id);
    if (token != nullptr) tokens.push_back(*token);
  }
  return Decoder::Decode(decoder_.get(), std::move(tokens));
}

std::optional<uint32_t> Tokenizer::TokenToId(absl::string_view token) const {
  std::optional<uint32_t> id = added_vocabulary_->TokenToId(token);
  return id.has_value() ? id : model_->TokenToId(token);
}

const std::string* Tokenizer::IdToToken(uint32_t id) const {
  const AddedToken* added = added_vocabulary_->FindById(id);
  return added != nullptr ? &added->content : model_->IdToToken(id);
}

bool Tokenizer::IsSpecial(uint32_t id) const {
  const AddedToken* added = added_vocabulary_->FindById(id);
  return added != nullptr && added->special;
}

}  // namespace deepinfer::tokenizer
