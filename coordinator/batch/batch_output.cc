#include "coordinator/batch/batch_output.h"

#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

using json = nlohmann::ordered_json;

// Characters (code points) in UTF-8 text: OpenAI's text_offset counts characters.
int64_t CodePoints(const std::string& text) {
  int64_t n = 0;
  for (unsigned char c : text) n += (c & 0xC0) != 0x80;
  return n;
}

// Completion tokens are those of every choice, as OpenAI counts them.
json Usage(const std::vector<const RequestResult*>& choices) {
  int64_t completion = 0;
  for (const RequestResult* r : choices) completion += r->token_ids_size();
  const int64_t prompt = choices.front()->prompt_tokens();
  return {{"prompt_tokens", prompt},
          {"completion_tokens", completion},
          {"total_tokens", prompt + completion},
          {"prompt_tokens_details", {{"cached_tokens", choices.front()->cached_prompt_tokens()}}}};
}

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}.
json CompletionLogprobs(const RequestResult& result, const OutputContext& context) {
  json tokens = json::array(), token_logprobs = json::array(), top = json::array(),
       offsets = json::array();
  int64_t offset = 0;
  for (const TokenLogprob& lp : result.logprobs()) {
    std::string text = context.token_text ? context.token_text(lp.token_id()) : "";
    tokens.push_back(text);
    token_logprobs.push_back(lp.logprob());
    json alternatives = json::object();
    for (int i = 0; i < lp.top_token_ids_size() && i < lp.top_logprobs_size(); ++i) {
      std::string alt = context.token_text ? context.token_text(lp.top_token_ids(i)) : "";
      // Two ids may share a text; keep the more likely (first) one, as OpenAI's map does.
      if (!alternatives.contains(alt)) alternatives[alt] = lp.top_logprobs(i);
    }
    top.push_back(std::move(alternatives));
    offsets.push_back(offset);
    offset += CodePoints(text);
  }
  return {{"tokens", tokens},
          {"token_logprobs", token_logprobs},
          {"top_logprobs", top},
          {"text_offset", offsets}};
}

json Bytes(const std::string& text) {
  json bytes = json::array();
  for (unsigned char c : text) bytes.push_back(static_cast<int>(c));
  return bytes;
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
json ChatLogprobs(const RequestResult& result, const OutputContext& context) {
  json content = json::array();
  for (const TokenLogprob& lp : result.logprobs()) {
    std::string text = context.token_text ? context.token_text(lp.token_id()) : "";
    json top = json::array();
    for (int i = 0; i < lp.top_token_ids_size() && i < lp.top_logprobs_size(); ++i) {
      std::string alt = context.token_text ? context.token_text(lp.top_token_ids(i)) : "";
      top.push_back({{"token", alt}, {"logprob", lp.top_logprobs(i)}, {"bytes", Bytes(alt)}});
    }
    content.push_back({{"token", text},
                       {"logprob", lp.logprob()},
                       {"bytes", Bytes(text)},
                       {"top_logprobs", top}});
  }
  return {{"content", content}};
}

}  // namespace

std::string FormatResultLine(const BatchLine& request, const RequestResult& result,
                             const OutputContext& context) {
  return FormatResultLine(request, std::vector<const RequestResult*>{&result}, context);
}

std::string FormatResultLine(const BatchLine& request,
                             const std::vector<const RequestResult*>& choices,
                             const OutputContext& context) {
  const bool chat = request.endpoint == BatchEndpoint::kChatCompletions;
  const bool want_logprobs = request.sampling.logprobs() >= 0;
  json choice_list = json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const RequestResult& result = *choices[i];
    json choice = {{"index", i}};
    if (chat) {
      choice["message"] = {{"role", "assistant"}, {"content", result.text()}};
      choice["logprobs"] = want_logprobs ? ChatLogprobs(result, context) : json(nullptr);
    } else {
      choice["text"] = result.text();
      choice["logprobs"] = want_logprobs ? CompletionLogprobs(result, context) : json(nullptr);
    }
    choice["finish_reason"] = result.finish_reason();
    if (request.sampling.return_token_ids()) {
      choice["token_ids"] =
          json(std::vector<int32_t>(result.token_ids().begin(), result.token_ids().end()));
    }
    choice_list.push_back(std::move(choice));
  }
  json body = {
      {"id", absl::StrCat(chat ? "chatcmpl-" : "cmpl-", context.request_id)},
      {"object", chat ? "chat.completion" : "text_completion"},
      {"created", context.created_unix_s},
      {"model", request.model.empty() ? context.model : request.model},
      {"choices", std::move(choice_list)},
      {"usage", Usage(choices)},
  };
  json line = {
      {"id", absl::StrCat("batch_req_", context.request_id)},
      {"custom_id", request.custom_id},
      {"response",
       {{"status_code", 200}, {"request_id", context.request_id}, {"body", std::move(body)}}},
      {"error", nullptr},
  };
  return line.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string FormatErrorLine(const std::string& custom_id, const std::string& request_id,
                            const std::string& code, const std::string& message) {
  json line = {
      {"id", absl::StrCat("batch_req_", request_id)},
      {"custom_id", custom_id.empty() ? json(nullptr) : json(custom_id)},
      {"response", nullptr},
      {"error", {{"code", code}, {"message", message}}},
  };
  return line.dump(-1, ' ', false, json::error_handler_t::replace);
}

}  // namespace deepinfer
