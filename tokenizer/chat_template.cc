#include "tokenizer/chat_template.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {
namespace {

using jinja::Expr;
using jinja::Stmt;

// `message.role`, `message['role']` or a variable named `role`.
bool NamesRole(const Expr* e) {
  if (e == nullptr) return false;
  if (e->kind == Expr::Kind::kName) return e->name == "role";
  if (e->kind != Expr::Kind::kMember) return false;
  if (e->items.empty()) return e->name == "role";
  const Expr* key = e->items[0].get();
  return key != nullptr && key->kind == Expr::Kind::kLiteral && key->value.is_string() &&
         key->value.string_value() == "role";
}

void AddString(const jinja::Value& v, std::vector<std::string>* out) {
  if (v.is_string() && std::find(out->begin(), out->end(), v.string_value()) == out->end()) {
    out->push_back(v.string_value());
  }
}

// The string literals of `e`: itself, or the items of a literal list or tuple.
void AddStrings(const Expr* e, std::vector<std::string>* out) {
  if (e == nullptr) return;
  if (e->kind == Expr::Kind::kLiteral) {
    if (e->value.is_array()) {
      for (const jinja::Value& v : e->value.array()) AddString(v, out);
    } else {
      AddString(e->value, out);
    }
  } else if (e->kind == Expr::Kind::kList || e->kind == Expr::Kind::kTuple) {
    for (const auto& item : e->items) {
      if (item != nullptr && item->kind == Expr::Kind::kLiteral) AddString(item->value, out);
    }
  }
}

// What a template's syntax tree says about the requests it renders.
struct TemplateFacts {
  std::vector<std::string> roles;
  bool reads_tools = false;
};

void Collect(const Expr* e, TemplateFacts* out);

void Collect(const jinja::StmtList& body, TemplateFacts* out) {
  for (const auto& stmt : body) {
    const Stmt& s = *stmt;
    Collect(s.expr.get(), out);
    Collect(s.target.get(), out);
    Collect(s.filter.get(), out);
    for (const auto& [condition, branch] : s.branches) {
      Collect(condition.get(), out);
      Collect(branch, out);
    }
    Collect(s.body, out);
    Collect(s.else_body, out);
    for (const auto& param : s.params) Collect(param.second.get(), out);
  }
}

void Collect(const Expr* e, TemplateFacts* out) {
  if (e == nullptr) return;
  if (e->kind == Expr::Kind::kName && e->name == "tools") out->reads_tools = true;
  if (e->kind == Expr::Kind::kBinary) {
    if (e->name == "==" || e->name == "!=") {
      if (NamesRole(e->left.get())) AddStrings(e->right.get(), &out->roles);
      if (NamesRole(e->right.get())) AddStrings(e->left.get(), &out->roles);
    } else if ((e->name == "in" || e->name == "not in") && NamesRole(e->left.get())) {
      AddStrings(e->right.get(), &out->roles);
    }
  }
  Collect(e->object.get(), out);
  Collect(e->left.get(), out);
  Collect(e->right.get(), out);
  for (const auto& item : e->items) Collect(item.get(), out);
  for (const auto& key : e->keys) Collect(key.get(), out);
  for (const auto& keyword : e->keywords) Collect(keyword.second.get(), out);
}

}  // namespace

ChatTemplate::ChatTemplate(std::unique_ptr<jinja::Template> compiled, std::string bos_token,
                           std::string eos_token)
    : template_(std::move(compiled)),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)) {
  TemplateFacts facts;
  Collect(template_->body(), &facts);
  roles_ = std::move(facts.roles);
  reads_tools_ = facts.reads_tools;
}

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
