#include "coordinator/batch/batch_line.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

using json = nlohmann::ordered_json;

// Largest N for logprobs / top_logprobs (vLLM's default max_logprobs).
constexpr int kMaxLogprobs = 20;
// OpenAI's default for /v1/completions; chat has no default (0: until EOS or limit).
constexpr int kCompletionsDefaultMaxTokens = 16;

class LineParser {
 public:
  explicit LineParser(int64_t line_number) : prefix_(absl::StrCat("line ", line_number, ": ")) {}

  absl::Status Error(absl::string_view message) const {
    return absl::InvalidArgumentError(absl::StrCat(prefix_, message));
  }

  // Reads an optional integer field of `body` into `*out`, within [lo, hi].
  absl::Status OptionalInt(const json& body, const char* field, int64_t lo, int64_t hi,
                           std::optional<int64_t>* out) const {
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number_integer()) {
      return Error(absl::StrCat("body.", field, " must be an integer, got ", it->dump()));
    }
    int64_t v = it->get<int64_t>();
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) v = hi + 1;
    if (v < lo || v > hi) {
      return Error(absl::StrCat("body.", field, " must be in [", lo, ", ", hi, "], got ", v));
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status OptionalNumber(const json& body, const char* field, double lo, double hi,
                              bool lo_open, std::optional<double>* out) const {
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_number()) {
      return Error(absl::StrCat("body.", field, " must be a number, got ", it->dump()));
    }
    double v = it->get<double>();
    if ((lo_open ? v <= lo : v < lo) || v > hi) {
      return Error(absl::StrCat("body.", field, " must be in ", lo_open ? "(" : "[", lo, ", ", hi,
                                "], got ", v));
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status OptionalBool(const json& body, const char* field, bool* out) const {
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_boolean()) {
      return Error(absl::StrCat("body.", field, " must be true or false, got ", it->dump()));
    }
    *out = it->get<bool>();
    return absl::OkStatus();
  }

 private:
  std::string prefix_;
};

absl::StatusOr<std::vector<int32_t>> TokenIds(const json& array, const LineParser& p,
                                              absl::string_view field) {
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (const json& v : array) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return p.Error(absl::StrCat(field, " must hold non-negative integer token ids, found ",
                                  v.dump()));
    }
    ids.push_back(static_cast<int32_t>(v.get<int64_t>()));
  }
  return ids;
}

absl::Status ParsePrompt(const json& body, const LineParser& p, BatchLine* out) {
  auto it = body.find("prompt");
  if (it == body.end() || it->is_null()) return p.Error("body.prompt is missing");
  const json& prompt = *it;
  if (prompt.is_string()) {
    out->prompt_text = prompt.get<std::string>();
    return absl::OkStatus();
  }
  if (!prompt.is_array()) {
    return p.Error("body.prompt must be a string or a list of token ids");
  }
  if (prompt.empty()) return p.Error("body.prompt is an empty list");
  // OpenAI also allows a list of prompts; one line is one request here.
  if (prompt[0].is_string() || prompt[0].is_array()) {
    if (prompt.size() != 1) {
      return p.Error("body.prompt holds several prompts; put one request per line");
    }
    if (prompt[0].is_string()) {
      out->prompt_text = prompt[0].get<std::string>();
      return absl::OkStatus();
    }
    auto ids = TokenIds(prompt[0], p, "body.prompt");
    if (!ids.ok()) return ids.status();
    if (ids->empty()) return p.Error("body.prompt is an empty list");
    out->prompt_token_ids = std::move(*ids);
    return absl::OkStatus();
  }
  auto ids = TokenIds(prompt, p, "body.prompt");
  if (!ids.ok()) return ids.status();
  out->prompt_token_ids = std::move(*ids);
  return absl::OkStatus();
}

absl::Status ParseMessages(const json& body, const LineParser& p, BatchLine* out) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return p.Error("body.messages is missing");
  if (!it->is_array() || it->empty()) {
    return p.Error("body.messages must be a non-empty list of messages");
  }
  for (size_t i = 0; i < it->size(); ++i) {
    const json& m = (*it)[i];
    if (!m.is_object()) return p.Error(absl::StrCat("body.messages[", i, "] is not an object"));
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) {
      return p.Error(absl::StrCat("body.messages[", i, "].role is missing or not a string"));
    }
    auto content = m.find("content");
    if (content != m.end() && !content->is_null() && !content->is_string() &&
        !content->is_array()) {
      return p.Error(absl::StrCat("body.messages[", i,
                                  "].content must be a string, a list of parts, or null"));
    }
  }
  out->messages = *it;
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) return p.Error("body.tools must be a list");
    out->tools = *tools;
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const json& body, const LineParser& p, GenerationParams* sampling) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  auto add = [&](const json& s) -> absl::Status {
    if (!s.is_string()) return p.Error("body.stop must be a string or a list of strings");
    if (s.get<std::string>().empty()) return p.Error("body.stop holds an empty string");
    sampling->add_stop(s.get<std::string>());
    return absl::OkStatus();
  };
  if (it->is_array()) {
    for (const json& s : *it) {
      if (absl::Status st = add(s); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  return add(*it);
}

absl::Status ParseSampling(const json& body, const LineParser& p, BatchEndpoint endpoint,
                           GenerationParams* s) {
  std::optional<int64_t> n;
  if (absl::Status st = p.OptionalInt(body, "n", 1, 1, &n); !st.ok()) {
    return p.Error("body.n: only n = 1 is supported (one completion per request line)");
  }
  if (auto stream = body.find("stream"); stream != body.end() && stream->is_boolean() &&
                                         stream->get<bool>()) {
    return p.Error("body.stream: streaming is not available in batch jobs");
  }
  std::optional<int64_t> max_tokens;
  const char* max_field =
      endpoint == BatchEndpoint::kChatCompletions && body.contains("max_completion_tokens")
          ? "max_completion_tokens"
          : "max_tokens";
  if (absl::Status st =
          p.OptionalInt(body, max_field, 1, std::numeric_limits<int32_t>::max(), &max_tokens);
      !st.ok()) {
    return st;
  }
  s->set_max_tokens(max_tokens.value_or(
      endpoint == BatchEndpoint::kCompletions ? kCompletionsDefaultMaxTokens : 0));

  std::optional<double> temperature, top_p;
  if (absl::Status st = p.OptionalNumber(body, "temperature", 0, 1e6, false, &temperature);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = p.OptionalNumber(body, "top_p", 0, 1, true, &top_p); !st.ok()) return st;
  s->set_temperature(static_cast<float>(temperature.value_or(1.0)));
  s->set_top_p(static_cast<float>(top_p.value_or(1.0)));

  std::optional<int64_t> top_k;
  if (absl::Status st = p.OptionalInt(body, "top_k", -1, std::numeric_limits<int32_t>::max(),
                                      &top_k);
      !st.ok()) {
    return st;
  }
  s->set_top_k(top_k.has_value() && *top_k > 0 ? static_cast<int32_t>(*top_k) : 0);

  if (auto seed = body.find("seed"); seed != body.end() && !seed->is_null()) {
    if (!seed->is_number_integer()) {
      return p.Error(absl::StrCat("body.seed must be an integer, got ", seed->dump()));
    }
    s->set_seed(seed->is_number_unsigned() ? seed->get<uint64_t>()
                                           : static_cast<uint64_t>(seed->get<int64_t>()));
  }
  if (absl::Status st = ParseStop(body, p, s); !st.ok()) return st;
  if (auto ids = body.find("stop_token_ids"); ids != body.end() && !ids->is_null()) {
    if (!ids->is_array()) return p.Error("body.stop_token_ids must be a list of token ids");
    auto parsed = TokenIds(*ids, p, "body.stop_token_ids");
    if (!parsed.ok()) return parsed.status();
    for (int32_t id : *parsed) s->add_stop_token_ids(id);
  }
  bool ignore_eos = false, return_token_ids = false;
  if (absl::Status st = p.OptionalBool(body, "ignore_eos", &ignore_eos); !st.ok()) return st;
  if (absl::Status st = p.OptionalBool(body, "return_token_ids", &return_token_ids); !st.ok()) {
    return st;
  }
  s->set_ignore_eos(ignore_eos);
  s->set_return_token_ids(return_token_ids);

  s->set_logprobs(-1);
  if (endpoint == BatchEndpoint::kCompletions) {
    // Completions: "logprobs": N, the number of alternatives per token.
    std::optional<int64_t> logprobs;
    if (absl::Status st = p.OptionalInt(body, "logprobs", 0, kMaxLogprobs, &logprobs); !st.ok()) {
      return st;
    }
    if (logprobs) s->set_logprobs(static_cast<int32_t>(*logprobs));
  } else {
    // Chat: "logprobs": true plus "top_logprobs": N.
    bool logprobs = false;
    if (absl::Status st = p.OptionalBool(body, "logprobs", &logprobs); !st.ok()) return st;
    std::optional<int64_t> top;
    if (absl::Status st = p.OptionalInt(body, "top_logprobs", 0, kMaxLogprobs, &top); !st.ok()) {
      return st;
    }
    if (top && !logprobs) return p.Error("body.top_logprobs needs body.logprobs set to true");
    if (logprobs) s->set_logprobs(static_cast<int32_t>(top.value_or(0)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BatchLine> ParseBatchLine(absl::string_view line, int64_t line_number,
                                         std::string* custom_id_on_error) {
  LineParser p(line_number);
  json root = json::parse(line.begin(), line.end(), nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return p.Error("not valid JSON");
  if (!root.is_object()) return p.Error("not a JSON object");
  BatchLine out;
  auto custom_id = root.find("custom_id");
  if (custom_id == root.end() || !custom_id->is_string() ||
      custom_id->get<std::string>().empty()) {
    return p.Error("custom_id is missing or not a non-empty string");
  }
  out.custom_id = custom_id->get<std::string>();
  if (custom_id_on_error != nullptr) *custom_id_on_error = out.custom_id;

  if (auto method = root.find("method"); method != root.end() &&
                                         (!method->is_string() || *method != "POST")) {
    return p.Error(absl::StrCat("method must be \"POST\", got ", method->dump()));
  }
  auto url = root.find("url");
  if (url == root.end() || !url->is_string()) return p.Error("url is missing");
  if (*url == "/v1/completions") {
    out.endpoint = BatchEndpoint::kCompletions;
  } else if (*url == "/v1/chat/completions") {
    out.endpoint = BatchEndpoint::kChatCompletions;
  } else {
    return p.Error(absl::StrCat("url ", url->dump(),
                                " is not served (use /v1/completions or /v1/chat/completions)"));
  }
  auto body = root.find("body");
  if (body == root.end() || !body->is_object()) return p.Error("body is missing or not an object");
  if (auto model = body->find("model"); model != body->end() && model->is_string()) {
    out.model = model->get<std::string>();
  }
  absl::Status prompt_status = out.endpoint == BatchEndpoint::kCompletions
                                   ? ParsePrompt(*body, p, &out)
                                   : ParseMessages(*body, p, &out);
  if (!prompt_status.ok()) return prompt_status;
  if (absl::Status st = ParseSampling(*body, p, out.endpoint, &out.sampling); !st.ok()) return st;
  return out;
}

}  // namespace deepinfer
