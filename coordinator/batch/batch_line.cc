#include "coordinator/batch/batch_line.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/batch/structured_output_fields.h"
#include "coordinator/batch/untrusted_json.h"

namespace deepinfer {
namespace {

using json = nlohmann::ordered_json;

// Largest N for logprobs / top_logprobs (vLLM's default max_logprobs).
constexpr int kMaxLogprobs = 20;
// Most choices per request (OpenAI's limit for n).
constexpr int kMaxChoices = 128;
// OpenAI's default for /v1/completions; chat has no default (0: until EOS or limit).
constexpr int kCompletionsDefaultMaxTokens = 16;

constexpr unsigned kOnCompletions = 1;
constexpr unsigned kOnChat = 2;
constexpr unsigned kOnBoth = kOnCompletions | kOnChat;

unsigned EndpointBit(BatchEndpoint endpoint) {
  return endpoint == BatchEndpoint::kCompletions ? kOnCompletions : kOnChat;
}

// The body fields that are read, and on which endpoint. docs/jobs.md lists them.
struct AcceptedField {
  const char* name;
  unsigned endpoints;
};
constexpr AcceptedField kAcceptedFields[] = {
    {"model", kOnBoth},
    {"prompt", kOnCompletions},
    {"messages", kOnChat},
    {"tools", kOnChat},
    {"tool_choice", kOnChat},
    {"max_tokens", kOnBoth},
    {"max_completion_tokens", kOnChat},
    {"temperature", kOnBoth},
    {"top_p", kOnBoth},
    {"top_k", kOnBoth},
    {"seed", kOnBoth},
    {"stop", kOnBoth},
    {"stop_token_ids", kOnBoth},
    {"ignore_eos", kOnBoth},
    {"logprobs", kOnBoth},
    {"top_logprobs", kOnChat},
    {"return_token_ids", kOnBoth},
    {"n", kOnBoth},
    {"logit_bias", kOnBoth},
    {"presence_penalty", kOnBoth},
    {"frequency_penalty", kOnBoth},
    {"repetition_penalty", kOnBoth},
    {"min_tokens", kOnBoth},
    {"stream", kOnBoth},
    {"user", kOnBoth},
    // Structured output: structured_output_fields.h.
    {"response_format", kOnBoth},
    {"structured_outputs", kOnBoth},
    {"guided_json", kOnBoth},
    {"guided_regex", kOnBoth},
    {"guided_choice", kOnBoth},
    {"guided_grammar", kOnBoth},
};

// OpenAI and vLLM body fields that are not served; a line that sets one gets an error line
// naming it instead of running without it. `neutral` (JSON) is the value that asks for
// nothing, accepted like null so that requests spelling out defaults still run.
struct RefusedField {
  const char* name;
  bool planned;  // guided-decoding options, min_p, echo, best_of: "not supported yet"
  const char* neutral;
};
constexpr RefusedField kRefusedFields[] = {
    {"guided_decoding_backend", true, nullptr},
    {"guided_whitespace_pattern", true, nullptr},
    {"structural_tag", true, nullptr},
    {"min_p", true, "0"},
    {"echo", true, "false"},
    {"best_of", true, "1"},
    {"suffix", false, nullptr},
    {"stream_options", false, nullptr},
    {"functions", false, nullptr},
    {"function_call", false, nullptr},
    {"parallel_tool_calls", false, nullptr},
    {"audio", false, nullptr},
    {"modalities", false, nullptr},
    {"prediction", false, nullptr},
    {"reasoning_effort", false, nullptr},
    {"verbosity", false, nullptr},
    {"web_search_options", false, nullptr},
    {"metadata", false, nullptr},
    {"store", false, "false"},
    {"service_tier", false, nullptr},
    {"prompt_cache_key", false, nullptr},
    {"safety_identifier", false, nullptr},
    {"length_penalty", false, "1"},
    {"use_beam_search", false, "false"},
    {"include_stop_str_in_output", false, "false"},
    {"skip_special_tokens", false, nullptr},
    {"spaces_between_special_tokens", false, nullptr},
    {"truncate_prompt_tokens", false, nullptr},
    {"prompt_logprobs", false, nullptr},
    {"allowed_token_ids", false, nullptr},
    {"bad_words", false, nullptr},
    {"add_generation_prompt", false, nullptr},
    {"continue_final_message", false, "false"},
    {"add_special_tokens", false, nullptr},
    {"documents", false, nullptr},
    {"chat_template", false, nullptr},
    {"chat_template_kwargs", false, nullptr},
    {"mm_processor_kwargs", false, nullptr},
    {"priority", false, "0"},
    {"request_id", false, nullptr},
    {"logits_processors", false, nullptr},
    {"return_tokens_as_token_ids", false, "false"},
    {"cache_salt", false, nullptr},
    {"kv_transfer_params", false, nullptr},
    {"vllm_xargs", false, nullptr},
    {"prompt_embeds", false, nullptr},
};

// Fields of a chat message passed to the chat template, and OpenAI's that are not served.
constexpr const char* kMessageFields[] = {"role", "content", "name", "tool_calls", "tool_call_id"};
constexpr const char* kRefusedMessageFields[] = {"audio", "function_call", "refusal"};

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
      return Error(absl::StrCat("body.", field, " must be an integer, got ", DescribeJson(*it)));
    }
    int64_t v = it->get<int64_t>();
    if (it->is_number_unsigned() && it->get<uint64_t>() > static_cast<uint64_t>(hi)) {
      return Error(absl::StrCat("body.", field, " must be in [", lo, ", ", hi, "], got ",
                                DescribeJson(*it)));
    }
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
      return Error(absl::StrCat("body.", field, " must be a number, got ", DescribeJson(*it)));
    }
    double v = it->get<double>();
    if ((lo_open ? v <= lo : v < lo) || v > hi) {
      return Error(absl::StrCat("body.", field, " must be in ", lo_open ? "(" : "[", lo, ", ", hi,
                                "], got ", DescribeJson(*it)));
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status OptionalBool(const json& body, const char* field, bool* out) const {
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_boolean()) {
      return Error(absl::StrCat("body.", field, " must be true or false, got ", DescribeJson(*it)));
    }
    *out = it->get<bool>();
    return absl::OkStatus();
  }

  absl::Status OptionalString(const json& object, const char* field, absl::string_view where,
                              std::string* out) const {
    auto it = object.find(field);
    if (it == object.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_string()) {
      return Error(absl::StrCat(where, field, " must be a string, got ", DescribeJson(*it)));
    }
    if (out != nullptr) *out = it->get<std::string>();
    return absl::OkStatus();
  }

 private:
  std::string prefix_;
};

// Refuses any body field that is not read on `endpoint`: a refused field unless it holds
// null or its neutral value, an accepted field of the other endpoint, an unknown field.
absl::Status CheckBodyFields(const json& body, const LineParser& p, BatchEndpoint endpoint) {
  for (auto it = body.begin(); it != body.end(); ++it) {
    const std::string& key = it.key();
    bool handled = false;
    for (const AcceptedField& f : kAcceptedFields) {
      if (key != f.name) continue;
      handled = true;
      if ((f.endpoints & EndpointBit(endpoint)) == 0 && !it->is_null()) {
        return p.Error(absl::StrCat("field '", key, "' belongs to ",
                                    endpoint == BatchEndpoint::kCompletions
                                        ? "/v1/chat/completions, not /v1/completions"
                                        : "/v1/completions, not /v1/chat/completions"));
      }
      break;
    }
    if (handled) continue;
    for (const RefusedField& f : kRefusedFields) {
      if (key != f.name) continue;
      handled = true;
      if (it->is_null()) break;
      if (f.neutral != nullptr &&
          *it == json::parse(f.neutral, nullptr, /*allow_exceptions=*/false)) {
        break;
      }
      return p.Error(absl::StrCat(
          "field '", key, "' is not supported", f.planned ? " yet" : "",
          f.neutral != nullptr ? absl::StrCat("; leave it out or set it to ", f.neutral) : ""));
    }
    if (!handled) {
      return p.Error(absl::StrCat("unknown field ", QuoteForMessage(key), " in body"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> TokenIds(const json& array, const LineParser& p,
                                              absl::string_view field) {
  std::vector<int32_t> ids;
  ids.reserve(array.size());
  for (const json& v : array) {
    if (!v.is_number_integer() ||
        (v.is_number_unsigned() && v.get<uint64_t>() > std::numeric_limits<int32_t>::max()) ||
        v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return p.Error(absl::StrCat(field, " must hold non-negative integer token ids, found ",
                                  DescribeJson(v)));
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
    return p.Error(absl::StrCat("body.prompt must be a string or a list of token ids, got ",
                                DescribeJson(prompt)));
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

// A message's content: a string, null, or a list of text parts, which is joined with "\n"
// into one string (as vLLM does for templates that take string content).
absl::StatusOr<json> MessageContent(const json& content, const LineParser& p,
                                    const std::string& where) {
  if (content.is_null() || content.is_string()) return content;
  if (!content.is_array()) {
    return p.Error(absl::StrCat(where, ".content must be a string, a list of text parts, or null, ",
                                "got ", DescribeJson(content)));
  }
  std::vector<std::string> texts;
  for (size_t j = 0; j < content.size(); ++j) {
    const json& part = content[j];
    const std::string part_where = absl::StrCat(where, ".content[", j, "]");
    if (!part.is_object()) {
      return p.Error(absl::StrCat(part_where, " must be an object, got ", DescribeJson(part)));
    }
    auto type = part.find("type");
    if (type == part.end() || !type->is_string()) {
      return p.Error(absl::StrCat(part_where, ".type must be a string"));
    }
    if (*type != "text") {
      return p.Error(absl::StrCat(part_where, ": content part type ",
                                  QuoteForMessage(type->get_ref<const std::string&>()),
                                  " is not supported (text parts only)"));
    }
    for (auto f = part.begin(); f != part.end(); ++f) {
      if (f.key() != "type" && f.key() != "text") {
        return p.Error(
            absl::StrCat("unknown field ", QuoteForMessage(f.key()), " in ", part_where));
      }
    }
    auto text = part.find("text");
    if (text == part.end() || !text->is_string()) {
      return p.Error(absl::StrCat(part_where, ".text must be a string"));
    }
    texts.push_back(text->get<std::string>());
  }
  return json(absl::StrJoin(texts, "\n"));
}

absl::StatusOr<json> ParseMessage(const json& m, const LineParser& p, const std::string& where) {
  if (!m.is_object()) {
    return p.Error(absl::StrCat(where, " must be an object, got ", DescribeJson(m)));
  }
  json message = json::object();
  for (auto f = m.begin(); f != m.end(); ++f) {
    const std::string& key = f.key();
    bool known = false;
    for (const char* name : kMessageFields) known = known || key == name;
    if (!known) {
      for (const char* name : kRefusedMessageFields) {
        if (key == name && !f->is_null()) {
          return p.Error(absl::StrCat("field '", key, "' in ", where, " is not supported"));
        }
      }
      if (f->is_null()) continue;
      return p.Error(absl::StrCat("unknown field ", QuoteForMessage(key), " in ", where));
    }
    if (key == "content") {
      absl::StatusOr<json> content = MessageContent(*f, p, where);
      if (!content.ok()) return content.status();
      message["content"] = std::move(*content);
      continue;
    }
    if (key == "tool_calls" && !f->is_null()) {
      if (!f->is_array()) {
        return p.Error(absl::StrCat(where, ".tool_calls must be a list, got ", DescribeJson(*f)));
      }
      for (size_t j = 0; j < f->size(); ++j) {
        if (!(*f)[j].is_object()) {
          return p.Error(absl::StrCat(where, ".tool_calls[", j, "] must be an object, got ",
                                      DescribeJson((*f)[j])));
        }
      }
    } else if (key != "tool_calls" && !f->is_null() && !f->is_string()) {
      return p.Error(absl::StrCat(where, ".", key, " must be a string, got ", DescribeJson(*f)));
    }
    message[key] = *f;
  }
  auto role = message.find("role");
  if (role == message.end() || role->is_null())
    return p.Error(absl::StrCat(where, ".role is missing"));
  if (role->get_ref<const std::string&>().empty()) {
    return p.Error(absl::StrCat(where, ".role is empty"));
  }
  return message;
}

absl::Status ParseMessages(const json& body, const LineParser& p, BatchLine* out) {
  auto it = body.find("messages");
  if (it == body.end() || it->is_null()) return p.Error("body.messages is missing");
  if (!it->is_array() || it->empty()) {
    return p.Error(absl::StrCat("body.messages must be a non-empty list of messages, got ",
                                DescribeJson(*it)));
  }
  json messages = json::array();
  for (size_t i = 0; i < it->size(); ++i) {
    absl::StatusOr<json> message =
        ParseMessage((*it)[i], p, absl::StrCat("body.messages[", i, "]"));
    if (!message.ok()) return message.status();
    messages.push_back(std::move(*message));
  }
  out->messages = std::move(messages);
  if (auto tools = body.find("tools"); tools != body.end() && !tools->is_null()) {
    if (!tools->is_array()) {
      return p.Error(absl::StrCat("body.tools must be a list, got ", DescribeJson(*tools)));
    }
    for (size_t i = 0; i < tools->size(); ++i) {
      if (!(*tools)[i].is_object()) {
        return p.Error(
            absl::StrCat("body.tools[", i, "] must be an object, got ", DescribeJson((*tools)[i])));
      }
    }
    out->tools = *tools;
  }
  if (auto choice = body.find("tool_choice");
      choice != body.end() && !choice->is_null() && *choice != "auto") {
    return p.Error(absl::StrCat(
        "body.tool_choice: only \"auto\" is supported (the model decides whether to call a "
        "tool), got ",
        DescribeJson(*choice)));
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const json& body, const LineParser& p, GenerationParams* sampling) {
  auto it = body.find("stop");
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  auto add = [&](const json& s) -> absl::Status {
    if (!s.is_string()) {
      return p.Error(
          absl::StrCat("body.stop must be a string or a list of strings, found ", DescribeJson(s)));
    }
    if (s.get_ref<const std::string&>().empty()) return p.Error("body.stop holds an empty string");
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

absl::Status ParseMaxTokens(const json& body, const LineParser& p, BatchEndpoint endpoint,
                            GenerationParams* s) {
  const bool chat = endpoint == BatchEndpoint::kChatCompletions;
  auto completion = body.find("max_completion_tokens");
  auto max = body.find("max_tokens");
  const bool has_completion = chat && completion != body.end() && !completion->is_null();
  const bool has_max = max != body.end() && !max->is_null();
  if (has_completion && has_max && *completion != *max) {
    return p.Error(
        "body.max_completion_tokens and body.max_tokens differ; give one of them (OpenAI's "
        "newer name is max_completion_tokens)");
  }
  std::optional<int64_t> max_tokens;
  if (absl::Status st = p.OptionalInt(body, has_completion ? "max_completion_tokens" : "max_tokens",
                                      1, std::numeric_limits<int32_t>::max(), &max_tokens);
      !st.ok()) {
    return st;
  }
  s->set_max_tokens(
      static_cast<int32_t>(max_tokens.value_or(chat ? 0 : kCompletionsDefaultMaxTokens)));
  return absl::OkStatus();
}

// "logit_bias": {"<token id>": bias, ...}, biases in [-100, 100] (OpenAI). Whether the ids are
// in the vocabulary is PromptBuilder's check (it knows the model).
absl::Status ParseLogitBias(const json& body, const LineParser& p, GenerationParams* s) {
  auto it = body.find("logit_bias");
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_object()) {
    return p.Error(absl::StrCat(
        "body.logit_bias must be an object mapping token ids to biases, got ", DescribeJson(*it)));
  }
  for (auto e = it->begin(); e != it->end(); ++e) {
    const std::string& key = e.key();
    int64_t id = -1;
    bool digits = !key.empty() && key.size() <= 10;
    for (char c : key) digits = digits && c >= '0' && c <= '9';
    if (digits) id = std::stoll(key);
    if (!digits || id > std::numeric_limits<int32_t>::max()) {
      return p.Error(absl::StrCat("body.logit_bias: key ", QuoteForMessage(key),
                                  " is not a token id (a non-negative integer)"));
    }
    if (!e->is_number() || e->get<double>() < -100 || e->get<double>() > 100) {
      return p.Error(absl::StrCat("body.logit_bias[", QuoteForMessage(key),
                                  "] must be a number in [-100, 100], got ", DescribeJson(*e)));
    }
    (*s->mutable_logit_bias())[static_cast<int32_t>(id)] = e->get<float>();
  }
  return absl::OkStatus();
}

absl::Status ParsePenalties(const json& body, const LineParser& p, GenerationParams* s) {
  std::optional<double> presence, frequency, repetition;
  if (absl::Status st = p.OptionalNumber(body, "presence_penalty", -2, 2, false, &presence);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = p.OptionalNumber(body, "frequency_penalty", -2, 2, false, &frequency);
      !st.ok()) {
    return st;
  }
  // vLLM takes any repetition_penalty > 0; the bound keeps the arithmetic finite.
  if (absl::Status st = p.OptionalNumber(body, "repetition_penalty", 0, 1e6, true, &repetition);
      !st.ok()) {
    return st;
  }
  s->set_presence_penalty(static_cast<float>(presence.value_or(0)));
  s->set_frequency_penalty(static_cast<float>(frequency.value_or(0)));
  s->set_repetition_penalty(static_cast<float>(repetition.value_or(1)));
  std::optional<int64_t> min_tokens;
  if (absl::Status st =
          p.OptionalInt(body, "min_tokens", 0, std::numeric_limits<int32_t>::max(), &min_tokens);
      !st.ok()) {
    return st;
  }
  if (min_tokens && s->max_tokens() > 0 && *min_tokens > s->max_tokens()) {
    return p.Error(absl::StrCat("body.min_tokens (", *min_tokens,
                                ") must not exceed the maximum number of tokens (", s->max_tokens(),
                                ")"));
  }
  s->set_min_tokens(static_cast<int32_t>(min_tokens.value_or(0)));
  return absl::OkStatus();
}

absl::Status ParseSampling(const json& body, const LineParser& p, BatchEndpoint endpoint,
                           BatchLine* out) {
  GenerationParams* s = &out->sampling;
  std::optional<int64_t> n;
  if (absl::Status st = p.OptionalInt(body, "n", 1, kMaxChoices, &n); !st.ok()) return st;
  out->n = static_cast<int32_t>(n.value_or(1));
  bool stream = false;
  if (absl::Status st = p.OptionalBool(body, "stream", &stream); !st.ok()) return st;
  if (stream) return p.Error("body.stream: streaming is not available in batch jobs");
  if (absl::Status st = ParseMaxTokens(body, p, endpoint, s); !st.ok()) return st;

  std::optional<double> temperature, top_p;
  if (absl::Status st = p.OptionalNumber(body, "temperature", 0, 1e6, false, &temperature);
      !st.ok()) {
    return st;
  }
  if (absl::Status st = p.OptionalNumber(body, "top_p", 0, 1, true, &top_p); !st.ok()) return st;
  s->set_temperature(static_cast<float>(temperature.value_or(1.0)));
  s->set_top_p(static_cast<float>(top_p.value_or(1.0)));

  std::optional<int64_t> top_k;
  if (absl::Status st =
          p.OptionalInt(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &top_k);
      !st.ok()) {
    return st;
  }
  s->set_top_k(top_k.has_value() && *top_k > 0 ? static_cast<int32_t>(*top_k) : 0);

  if (auto seed = body.find("seed"); seed != body.end() && !seed->is_null()) {
    if (!seed->is_number_integer()) {
      return p.Error(absl::StrCat("body.seed must be an integer, got ", DescribeJson(*seed)));
    }
    s->set_seed(seed->is_number_unsigned() ? seed->get<uint64_t>()
                                           : static_cast<uint64_t>(seed->get<int64_t>()));
  }
  if (absl::Status st = ParseStop(body, p, s); !st.ok()) return st;
  if (auto ids = body.find("stop_token_ids"); ids != body.end() && !ids->is_null()) {
    if (!ids->is_array()) {
      return p.Error(absl::StrCat("body.stop_token_ids must be a list of token ids, got ",
                                  DescribeJson(*ids)));
    }
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
  if (absl::Status st = ParseLogitBias(body, p, s); !st.ok()) return st;
  if (absl::Status st = ParsePenalties(body, p, s); !st.ok()) return st;

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
  if (absl::Status st = ParseStructuredOutput(body, s->mutable_structured_output()); !st.ok()) {
    return p.Error(st.message());
  }
  if (s->structured_output().kind() == StructuredOutputSpec::KIND_UNSPECIFIED) {
    s->clear_structured_output();
  }
  return absl::OkStatus();
}

}  // namespace

uint64_t ChoiceSeed(uint64_t seed, int32_t index) {
  if (index == 0) return seed;
  uint64_t z = seed + static_cast<uint64_t>(index) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

absl::StatusOr<BatchLine> ParseBatchLine(absl::string_view line, int64_t line_number,
                                         std::string* custom_id_on_error) {
  LineParser p(line_number);
  absl::StatusOr<json> parsed = ParseUntrustedJson(line);
  if (!parsed.ok()) return p.Error(parsed.status().message());
  const json& root = *parsed;
  if (!root.is_object()) {
    return p.Error(absl::StrCat("a line must be a JSON object, got ", DescribeJson(root)));
  }
  BatchLine out;
  auto custom_id = root.find("custom_id");
  if (custom_id == root.end() || !custom_id->is_string() ||
      custom_id->get_ref<const std::string&>().empty()) {
    return p.Error("custom_id is missing or not a non-empty string");
  }
  out.custom_id = custom_id->get<std::string>();
  if (custom_id_on_error != nullptr) *custom_id_on_error = out.custom_id;

  for (auto it = root.begin(); it != root.end(); ++it) {
    if (it.key() != "custom_id" && it.key() != "method" && it.key() != "url" &&
        it.key() != "body") {
      return p.Error(absl::StrCat("unknown field ", QuoteForMessage(it.key()),
                                  " (a line holds custom_id, method, url and body)"));
    }
  }
  if (auto method = root.find("method");
      method != root.end() && (!method->is_string() || *method != "POST")) {
    return p.Error(absl::StrCat("method must be \"POST\", got ", DescribeJson(*method)));
  }
  auto url = root.find("url");
  if (url == root.end() || !url->is_string()) return p.Error("url is missing");
  if (*url == "/v1/completions") {
    out.endpoint = BatchEndpoint::kCompletions;
  } else if (*url == "/v1/chat/completions") {
    out.endpoint = BatchEndpoint::kChatCompletions;
  } else {
    return p.Error(absl::StrCat("url ", DescribeJson(*url),
                                " is not served (use /v1/completions or /v1/chat/completions)"));
  }
  auto body = root.find("body");
  if (body == root.end() || !body->is_object()) return p.Error("body is missing or not an object");
  if (absl::Status st = CheckBodyFields(*body, p, out.endpoint); !st.ok()) return st;
  if (absl::Status st = p.OptionalString(*body, "model", "body.", &out.model); !st.ok()) return st;
  if (absl::Status st = p.OptionalString(*body, "user", "body.", nullptr); !st.ok()) return st;
  absl::Status prompt_status = out.endpoint == BatchEndpoint::kCompletions
                                   ? ParsePrompt(*body, p, &out)
                                   : ParseMessages(*body, p, &out);
  if (!prompt_status.ok()) return prompt_status;
  if (absl::Status st = ParseSampling(*body, p, out.endpoint, &out); !st.ok()) return st;
  return out;
}

}  // namespace deepinfer
