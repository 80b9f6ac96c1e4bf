#include "tokenizer/tokenize_command.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {
namespace {

using Json = nlohmann::ordered_json;

std::string Dump(const Json& json) {
  // Invalid UTF-8 cannot reach here (input lines are parsed as JSON), but never throw.
  return json.dump(-1, ' ', /*ensure_ascii=*/false, Json::error_handler_t::replace);
}

// The result line for one input line, or an error message (without the line number).
absl::StatusOr<Json> ProcessLine(const std::string& line, const Tokenizer& tokenizer,
                                 const absl::StatusOr<std::unique_ptr<ChatTemplate>>& chat,
                                 const TokenizeOptions& options) {
  if (line.find_first_not_of(" \t\r") == std::string::npos) {
    return absl::InvalidArgumentError("empty line");
  }
  const Json request = Json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (request.is_discarded()) {
    return absl::InvalidArgumentError("not valid JSON (or not valid UTF-8)");
  }
  if (!request.is_object()) return absl::InvalidArgumentError("expected a JSON object");
  auto text = request.find("text");
  auto messages = request.find("messages");
  if ((text == request.end()) == (messages == request.end())) {
    return absl::InvalidArgumentError("expected exactly one of \"text\" or \"messages\"");
  }
  Json result;
  if (text != request.end()) {
    if (!text->is_string()) return absl::InvalidArgumentError("\"text\" must be a string");
    result["ids"] =
        tokenizer.Encode(text->get_ref<const std::string&>(), options.add_special_tokens);
    return result;
  }
  if (!messages->is_array()) return absl::InvalidArgumentError("\"messages\" must be a list");
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& message = (*messages)[i];
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat("message ", i, " must be an object with a string \"role\""));
    }
  }
  if (!chat.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot render messages: ", chat.status().message()));
  }
  auto tools = request.find("tools");
  auto prompt = (*chat)->Render(*messages, /*add_generation_prompt=*/true,
                                tools == request.end() ? Json() : *tools);
  if (!prompt.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("chat template failed: ", prompt.status().message()));
  }
  result["prompt"] = *prompt;
  result["ids"] = tokenizer.Encode(*prompt, /*add_special_tokens=*/false);
  return result;
}

}  // namespace

absl::Status RunTokenizeCommand(const TokenizeOptions& options, std::istream& in, std::ostream& out,
                                std::ostream& err) {
  auto tokenizer = Tokenizer::FromDirectory(options.model_dir);
  if (!tokenizer.ok()) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrCat("tokenize: cannot load the tokenizer of model '",
                                     options.model_dir, "': ", tokenizer.status().message()));
  }
  // A model without a chat template still tokenizes text; messages lines then fail.
  const absl::StatusOr<std::unique_ptr<ChatTemplate>> chat =
      ChatTemplate::FromTokenizerConfig((*tokenizer)->config());
  std::string line;
  int line_number = 0, failed = 0;
  while (std::getline(in, line)) {
    ++line_number;
    auto result = ProcessLine(line, **tokenizer, chat, options);
    if (result.ok()) {
      out << Dump(*result) << '\n';
      continue;
    }
    ++failed;
    const std::string message = absl::StrCat("line ", line_number, ": ", result.status().message());
    out << Dump(Json{{"error", message}}) << '\n';
    err << "tokenize: " << message << '\n';
  }
  out.flush();
  if (in.bad()) return absl::DataLossError("tokenize: error reading the input");
  if (failed > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(failed, " of ", line_number, " input lines failed"));
  }
  return absl::OkStatus();
}

}  // namespace deepinfer::tokenizer
