#include "coordinator/batch/prompt_builder.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/batch/untrusted_json.h"
#include "worker/model/model_config.h"

namespace deepinfer {
namespace {

bool FileExists(const std::string& path) { return std::ifstream(path).good(); }

// OpenAI's chat roles (beside the ones a chat template names itself).
constexpr const char* kStandardRoles[] = {"system", "user", "assistant", "tool"};

}  // namespace

absl::StatusOr<ModelLimits> ReadModelLimits(const std::string& model) {
  std::string config_path;
  if (absl::StartsWith(model, "dummy:")) {
    config_path = model.substr(6);
    if (size_t at = config_path.rfind('@'); at != std::string::npos) {
      config_path = config_path.substr(0, at);
    }
  } else {
    config_path = model + "/config.json";
  }
  absl::StatusOr<ModelConfig> config = ModelConfig::FromFile(config_path);
  if (!config.ok()) return config.status();
  ModelLimits limits;
  limits.vocab_size = config->vocab_size;
  limits.routed_experts = config->n_routed_experts;
  limits.expert_groups = config->n_group;
  for (int64_t l = 0; l < config->num_hidden_layers; ++l) {
    limits.moe_layers += config->IsMoeLayer(l) ? 1 : 0;
  }
  limits.max_context =
      config->max_position_embeddings > 0 ? config->max_position_embeddings : int64_t{1} << 20;
  return limits;
}

absl::StatusOr<std::unique_ptr<PromptBuilder>> PromptBuilder::FromModel(const std::string& model) {
  absl::StatusOr<ModelLimits> limits = ReadModelLimits(model);
  if (!limits.ok()) return limits.status();
  const std::string directory = absl::StartsWith(model, "dummy:") ? "" : model;
  std::unique_ptr<tokenizer::Tokenizer> tok;
  std::unique_ptr<tokenizer::ChatTemplate> chat;
  if (!directory.empty() && FileExists(directory + "/tokenizer.json")) {
    auto loaded = tokenizer::Tokenizer::FromDirectory(directory);
    if (!loaded.ok()) {
      return absl::Status(loaded.status().code(),
                          absl::StrCat(directory, "/tokenizer.json: ", loaded.status().message()));
    }
    tok = std::move(*loaded);
    auto templ = tokenizer::ChatTemplate::FromTokenizerConfig(tok->config());
    if (templ.ok()) {
      chat = std::move(*templ);
    } else if (templ.status().code() != absl::StatusCode::kNotFound) {
      return absl::Status(templ.status().code(),
                          absl::StrCat(directory, "/tokenizer_config.json: chat_template: ",
                                       templ.status().message()));
    }
  }
  return std::make_unique<PromptBuilder>(*limits, std::move(tok), std::move(chat));
}

PromptBuilder::PromptBuilder(ModelLimits limits, std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                             std::unique_ptr<tokenizer::ChatTemplate> chat_template)
    : limits_(limits), tokenizer_(std::move(tokenizer)), chat_template_(std::move(chat_template)) {
  roles_.assign(std::begin(kStandardRoles), std::end(kStandardRoles));
  if (chat_template_ != nullptr) {
    for (const std::string& role : chat_template_->roles()) {
      if (std::find(roles_.begin(), roles_.end(), role) == roles_.end()) roles_.push_back(role);
    }
  }
}

absl::Status PromptBuilder::CheckRoles(const nlohmann::ordered_json& messages) const {
  for (size_t i = 0; i < messages.size(); ++i) {
    auto role = messages[i].find("role");
    if (role == messages[i].end() || !role->is_string()) {
      return absl::InvalidArgumentError(absl::StrCat("body.messages[", i, "].role is missing"));
    }
    const std::string& name = role->get_ref<const std::string&>();
    if (std::find(roles_.begin(), roles_.end(), name) == roles_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "body.messages[", i, "].role ", QuoteForMessage(name),
          " is not a role of the model's chat template (", absl::StrJoin(roles_, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> PromptBuilder::Build(const BatchLine& line) const {
  std::vector<int32_t> ids;
  if (line.prompt_token_ids.has_value()) {
    ids = *line.prompt_token_ids;
  } else if (line.prompt_text.has_value()) {
    if (tokenizer_ == nullptr) {
      return absl::InvalidArgumentError(
          "the model has no tokenizer: give the prompt as a list of token ids");
    }
    for (uint32_t id : tokenizer_->Encode(*line.prompt_text, /*add_special_tokens=*/true)) {
      ids.push_back(static_cast<int32_t>(id));
    }
  } else if (line.messages.has_value()) {
    if (tokenizer_ == nullptr || chat_template_ == nullptr) {
      return absl::InvalidArgumentError(
          "the model has no tokenizer or chat template: /v1/chat/completions is not served");
    }
    if (absl::Status roles = CheckRoles(*line.messages); !roles.ok()) return roles;
    if (line.tools.has_value() && !line.tools->empty() && !chat_template_->reads_tools()) {
      return absl::InvalidArgumentError(
          "body.tools: the model's chat template does not render tools; leave them out");
    }
    absl::StatusOr<std::string> prompt = chat_template_->Render(
        *line.messages, /*add_generation_prompt=*/true,
        line.tools.has_value() ? *line.tools : nlohmann::ordered_json(nullptr));
    if (!prompt.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("chat template: ", prompt.status().message()));
    }
    // The template writes BOS itself, as transformers' apply_chat_template assumes.
    for (uint32_t id : tokenizer_->Encode(*prompt, /*add_special_tokens=*/false)) {
      ids.push_back(static_cast<int32_t>(id));
    }
  }
  if (ids.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t id : ids) {
    if (id < 0 || id >= limits_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token id ", id, " is outside the vocabulary (size ", limits_.vocab_size, ")"));
    }
  }
  for (int32_t id : line.sampling.stop_token_ids()) {
    if (id >= limits_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("body.stop_token_ids: token id ", id,
                                                     " is outside the vocabulary (size ",
                                                     limits_.vocab_size, ")"));
    }
  }
  for (const auto& [id, bias] : line.sampling.logit_bias()) {
    if (id >= limits_.vocab_size) {
      return absl::InvalidArgumentError(absl::StrCat("body.logit_bias: key \"", id,
                                                     "\" is outside the vocabulary (size ",
                                                     limits_.vocab_size, ")"));
    }
  }
  const int64_t prompt_tokens = static_cast<int64_t>(ids.size());
  const int64_t max_tokens = line.sampling.max_tokens();
  if (prompt_tokens >= limits_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the prompt has ", prompt_tokens, " tokens; the context length is ", limits_.max_context));
  }
  if (max_tokens > 0 && prompt_tokens + max_tokens > limits_.max_context) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt (", prompt_tokens, " tokens) plus max_tokens (", max_tokens,
                     ") exceeds the context length (", limits_.max_context, ")"));
  }
  return ids;
}

std::string PromptBuilder::TokenText(int32_t id) const {
  // Without a tokenizer a token is named by its id, as vLLM does ("token_id:123"), so
  // that logprob alternatives stay distinct.
  if (tokenizer_ == nullptr) return absl::StrCat("token_id:", id);
  // An id past the tokenizer (the model's vocabulary can be larger) is "", as HF decodes it.
  return tokenizer_->DecodeSkippingUnknown({static_cast<uint32_t>(id)},
                                           /*skip_special_tokens=*/false);
}

}  // namespace deepinfer
