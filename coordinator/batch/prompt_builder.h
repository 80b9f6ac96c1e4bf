// PromptBuilder: turns a parsed batch line into the prompt token ids the engine runs,
// and checks them against the model: text prompts through the tokenizer (BOS as the
// tokenizer config says), chat messages through the chat template then the tokenizer,
// token-id prompts as given. Errors are per request (INVALID_ARGUMENT), so one bad
// line fails alone. A chat message's role must be one of OpenAI's (system, user, assistant,
// tool) or one the chat template names itself: the template would drop any other. Tools
// are refused for a template that does not render them.
#ifndef DEEPINFER_COORDINATOR_BATCH_PROMPT_BUILDER_H_
#define DEEPINFER_COORDINATOR_BATCH_PROMPT_BUILDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/batch/batch_line.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

struct ModelLimits {
  int64_t vocab_size = 0;
  // Longest sequence (prompt + generated) the model serves.
  int64_t max_context = 0;
  // Routed experts per MoE layer (0 for a dense model); the expert-parallel world size
  // must divide it.
  int64_t routed_experts = 0;
  // Expert groups of the router (n_group), for EPLB's hierarchical placement.
  int64_t expert_groups = 1;
  // MoE layers (the layers of an EPLB placement).
  int64_t moe_layers = 0;
};

// The limits of `model` (a checkpoint directory, or "dummy:<config.json>[@seed]"), from its
// config.json alone, as the coordinator reads them.
absl::StatusOr<ModelLimits> ReadModelLimits(const std::string& model);

class PromptBuilder {
 public:
  // `model` is a checkpoint directory, or "dummy:<config.json>[@seed]" (no tokenizer).
  // A directory without tokenizer.json serves token-id prompts only. Errors name the
  // file that is missing or unreadable.
  static absl::StatusOr<std::unique_ptr<PromptBuilder>> FromModel(const std::string& model);

  // For tests: explicit parts; `tokenizer` and `chat_template` may be null.
  PromptBuilder(ModelLimits limits, std::unique_ptr<tokenizer::Tokenizer> tokenizer,
                std::unique_ptr<tokenizer::ChatTemplate> chat_template);

  // The prompt ids, or INVALID_ARGUMENT saying why this request cannot run.
  absl::StatusOr<std::vector<int32_t>> Build(const BatchLine& line) const;

  // The text of one token for logprobs ("token_id:N" without a tokenizer; "" for an id the
  // tokenizer does not know).
  std::string TokenText(int32_t id) const;

  const ModelLimits& limits() const { return limits_; }
  bool has_tokenizer() const { return tokenizer_ != nullptr; }
  // The chat roles a request may use.
  const std::vector<std::string>& roles() const { return roles_; }

 private:
  absl::Status CheckRoles(const nlohmann::ordered_json& messages) const;

  ModelLimits limits_;
  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<tokenizer::ChatTemplate> chat_template_;
  std::vector<std::string> roles_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_BATCH_PROMPT_BUILDER_H_
