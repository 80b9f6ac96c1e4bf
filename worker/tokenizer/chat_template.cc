#include "worker/tokenizer/chat_template.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::Create(absl::string_view source,
                                                                   std::string bos_token,
                                                                   std::string eos_token) {
  auto compiled = jinja::Template::Parse(source);
  if (!compiled.ok()) {
    return absl::Status(compiled.status().code(),
                        absl::StrCat("chat template: ", compiled.status().message()));
  }
  return std::unique_ptr<ChatTemplate>(
      new ChatTemplate(*std::move(compiled), std::move(bos_token), std::move(eos_token)));
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> ChatTemplate::FromTokenizerConfig(
    const nlohmann::json& config) {
  if (!config.is_object()) return absl::NotFoundError("no tokenizer_config.json");
  auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return absl::NotFoundError("tokenizer_config.json has no chat_template");
  }
  std::string source;
  if (it->is_string()) {
    source = it->get<std::string>();
  } else if (it->is_array()) {
    for (const auto& entry : *it) {
      auto name = entry.find("name");
      auto text = entry.find("template");
      if (name != entry.end() && *name == "default" && text != entry.end() && text->is_string()) {
        source = text->get<std::string>();
      }
    }
    if (source.empty()) return absl::NotFoundError("chat_template list has no 'default' entry");
  } else {
    return absl::InvalidArgumentError("chat_template must be a string or a list");
  }
  return Create(source, TokenContent(config, "bos_token").value_or(""),
                TokenContent(config, "eos_token").value_or(""));
}

absl::StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& messages,
                                                 bool add_generation_prompt,
                                                 const nlohmann::ordered_json& tools) const {
  if (!messages.is_array()) return absl::InvalidArgumentError("messages must be a list");
  for (const auto& message : messages) {
    if (!message.is_object()) return absl::InvalidArgumentError("each message must be an object");
  }
  jinja::Value context = jinja::Value::NewObject();
  context.Set("messages", jinja::Value::FromJson(messages));
  context.Set("add_generation_prompt", jinja::Value::Bool(add_generation_prompt));
  context.Set("bos_token", jinja::Value::String(bos_token_));
  context.Set("eos_token", jinja::Value::String(eos_token_));
  if (!tools.is_null()) context.Set("tools", jinja::Value::FromJson(tools));
  return template_->Render(context);
}

}  // namespace deepinfer::tokenizer
