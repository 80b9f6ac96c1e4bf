// Renders a model's chat template (tokenizer_config.json "chat_template") the way
// transformers' apply_chat_template does: the Jinja template with messages,
// add_generation_prompt, bos_token, eos_token and (when given) tools in the context.
#ifndef TOKENIZER_CHAT_TEMPLATE_H_
#define TOKENIZER_CHAT_TEMPLATE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "tokenizer/jinja/template.h"

namespace deepinfer::tokenizer {

class ChatTemplate {
 public:
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> Create(absl::string_view source,
                                                              std::string bos_token,
                                                              std::string eos_token);

  // From a parsed tokenizer_config.json. chat_template may be a string or a list of
  // {"name", "template"} (the one named "default" is used). kNotFound if there is none.
  static absl::StatusOr<std::unique_ptr<ChatTemplate>> FromTokenizerConfig(
      const nlohmann::json& config);

  // `messages` is a JSON array of message objects; `tools` may be null (not passed).
  // Errors: kInvalidArgument (bad input, template type errors), kAborted (the template called
  // raise_exception; the message is the template's).
  absl::StatusOr<std::string> Render(const nlohmann::ordered_json& messages,
                                     bool add_generation_prompt,
                                     const nlohmann::ordered_json& tools = nullptr) const;

  // The roles the template tells apart: the strings it compares a `role` attribute, key or
  // variable with (`message['role'] == 'user'`, `m.role != "system"`, `role in ['a', 'b']`),
  // in the order they appear. A message of any other role would render as the template's
  // fallthrough does, usually not at all.
  const std::vector<std::string>& roles() const { return roles_; }
  // Whether the template refers to `tools` at all (DeepSeek-V3's does not: tools given to
  // it change nothing).
  bool reads_tools() const { return reads_tools_; }

 private:
  ChatTemplate(std::unique_ptr<jinja::Template> compiled, std::string bos_token,
               std::string eos_token);

  std::unique_ptr<jinja::Template> template_;
  std::string bos_token_;
  std::string eos_token_;
  std::vector<std::string> roles_;
  bool reads_tools_ = false;
};

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_CHAT_TEMPLATE_H_
