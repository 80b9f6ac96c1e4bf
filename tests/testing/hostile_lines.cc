#include "tests/testing/hostile_lines.h"

#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "nlohmann/json.hpp"

namespace deepinfer::testing {
namespace {

using json = nlohmann::ordered_json;

json Completion(const std::string& custom_id, json prompt) {
  return {{"custom_id", custom_id},
          {"method", "POST"},
          {"url", "/v1/completions"},
          {"body",
           {{"model", "m"},
            {"prompt", std::move(prompt)},
            {"max_tokens", 3},
            {"temperature", 0.5},
            {"top_p", 0.9},
            {"top_k", 5},
            {"seed", 3},
            {"stop", {"zz"}},
            {"stop_token_ids", {7}},
            {"ignore_eos", true},
            {"logprobs", 2},
            {"return_token_ids", true},
            {"n", 1},
            {"stream", false},
            {"user", "u"}}}};
}

json Chat(const std::string& custom_id) {
  const json tool = {{"type", "function"},
                     {"function",
                      {{"name", "get_weather"},
                       {"description", "Weather of a city"},
                       {"parameters",
                        {{"type", "object"},
                         {"properties", {{"city", {{"type", "string"}}}}},
                         {"required", {"city"}}}}}}};
  const json messages = {
      {{"role", "system"}, {"content", "Be brief."}},
      {{"role", "user"},
       {"content", {{{"type", "text"}, {"text", "hello"}}, {{"type", "text"}, {"text", "world"}}}}},
      {{"role", "assistant"},
       {"content", nullptr},
       {"tool_calls",
        {{{"id", "c0"},
          {"type", "function"},
          {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}},
      {{"role", "tool"}, {"tool_call_id", "c0"}, {"content", "18"}},
      {{"role", "user"}, {"name", "ann"}, {"content", "and tomorrow?"}}};
  return {{"custom_id", custom_id},
          {"method", "POST"},
          {"url", "/v1/chat/completions"},
          {"body",
           {{"model", "m"},
            {"messages", messages},
            {"tools", {tool}},
            {"tool_choice", "auto"},
            {"max_completion_tokens", 3},
            {"temperature", 0},
            {"logprobs", true},
            {"top_logprobs", 2},
            {"seed", 5},
            {"return_token_ids", true}}}};
}

std::vector<json> Bases(const std::string& prefix) {
  return {Completion(prefix + "text", "hello world"), Completion(prefix + "ids", {1, 2, 3}),
          Completion(prefix + "nested-ids", {{4, 5}}), Chat(prefix + "chat")};
}

// Values are spliced into the dumped line as raw text where nlohmann cannot hold them (too
// deep to dump, numbers it cannot represent): RawValue returns a marker string "\u0001RAW<n>\u0001"
// that Dump() replaces with the raw text.
class Splicer {
 public:
  json RawValue(std::string raw) {
    raws_.push_back(std::move(raw));
    return json(absl::StrCat("\x01RAW", raws_.size() - 1, "\x01"));
  }
  std::string Dump(const json& line) const {
    std::string text = line.dump(-1, ' ', false, json::error_handler_t::replace);
    for (size_t i = 0; i < raws_.size(); ++i) {
      text = absl::StrReplaceAll(text, {{absl::StrCat("\"\\u0001RAW", i, "\\u0001\""), raws_[i]}});
    }
    return text;
  }

 private:
  std::vector<std::string> raws_;
};

class Generator {
 public:
  explicit Generator(uint64_t seed) : rng_(seed) {}

  std::string Line(int index) {
    std::vector<json> bases = Bases(absl::StrCat("fuzz-", index, "-"));
    json line = bases[Pick(bases.size())];
    Splicer splicer;
    const int structural = 1 + static_cast<int>(Pick(2));
    for (int i = 0; i < structural; ++i) MutateStructure(&line, &splicer);
    std::string text = splicer.Dump(line);
    if (Pick(3) == 0) MutateText(&text);
    // One line is one request.
    for (char& c : text) {
      if (c == '\n') c = ' ';
    }
    return text;
  }

 private:
  size_t Pick(size_t n) { return static_cast<size_t>(rng_() % n); }

  json HostileValue(Splicer* splicer) {
    // Every JSON type, edge numbers, long and odd strings, big containers.
    static const std::vector<json> values = {
        nullptr,
        true,
        false,
        0,
        -1,
        1.5,
        -0.0,
        1e308,
        2147483648LL,
        std::numeric_limits<int64_t>::min(),
        std::numeric_limits<uint64_t>::max(),
        "",
        "x",
        std::string(100000, 'a'),
        std::string("a\0b\x01\x1f", 5),
        "\xed\xa0\x80",  // dumped as U+FFFD; raw bytes come from MutateText
        json::array(),
        json::array({1, "two", nullptr}),
        json::array({json::array({1, 2}), json::array({3})}),
        json(std::vector<int>(10000, 1)),
        json::object(),
        json{{"a", 1}},
        json{{"type", "json_schema"}, {"json_schema", {{"schema", json::object()}}}},
    };
    const size_t pick = Pick(values.size() + 3);
    if (pick < values.size()) return values[pick];
    if (pick == values.size()) {  // lists in lists
      const int depths[] = {63, 64, 65, 1000, 30000, 100000};
      const int depth = depths[Pick(6)];
      return splicer->RawValue(
          absl::StrCat(std::string(depth, '['), "1", std::string(depth, ']')));
    }
    if (pick == values.size() + 1) {  // objects in objects
      const int depth = Pick(2) == 0 ? 65 : 30000;
      std::string raw;
      for (int i = 0; i < depth; ++i) raw += "{\"a\":";
      return splicer->RawValue(raw + "1" + std::string(depth, '}'));
    }
    // Numbers at and past the edges of a double and a 64-bit integer.
    const char* numbers[] = {"1e400",
                             "-1e400",
                             "1e-400",
                             "123456789012345678901234567890",
                             "-123456789012345678901234567890",
                             "0.0000000000000000000001",
                             "1E+999999999999",
                             "-0"};
    return splicer->RawValue(numbers[Pick(8)]);
  }

  // Every object and list in `value`.
  void Collect(json* value, std::vector<json*>* containers) {
    if (value->is_object() || value->is_array()) containers->push_back(value);
    if (value->is_object()) {
      for (auto it = value->begin(); it != value->end(); ++it) Collect(&*it, containers);
    } else if (value->is_array()) {
      for (json& item : *value) Collect(&item, containers);
    }
  }

  void MutateStructure(json* line, Splicer* splicer) {
    std::vector<json*> containers;
    Collect(line, &containers);
    if (containers.empty()) return;  // the line was replaced by a scalar
    json* target = containers[Pick(containers.size())];
    json scratch = json::object();
    json& body = line->is_object() && line->contains("body") && (*line)["body"].is_object()
                     ? (*line)["body"]
                     : scratch;
    switch (Pick(8)) {
      case 0:
      case 1:
      case 2: {  // a field or item replaced by a value of another kind
        if (target->empty()) break;
        const size_t i = Pick(target->size());
        auto it = target->begin();
        std::advance(it, i);
        *it = HostileValue(splicer);
        break;
      }
      case 3: {  // a field or item deleted
        if (target->empty()) break;
        if (target->is_object()) {
          auto it = target->begin();
          std::advance(it, Pick(target->size()));
          target->erase(it.key());
        } else {
          target->erase(Pick(target->size()));
        }
        break;
      }
      case 4: {  // a refused, unknown or misplaced field
        const char* fields[] = {"response_format",
                                "guided_json",
                                "guided_regex",
                                "guided_grammar",
                                "logit_bias",
                                "presence_penalty",
                                "min_tokens",
                                "echo",
                                "best_of",
                                "made_up",
                                "messages",
                                "prompt",
                                "max_completion_tokens",
                                "top_logprobs",
                                "\xff\xfe",
                                "",
                                "custom_id",
                                "body"};
        json* where = target->is_object() ? target : &body;
        (*where)[fields[Pick(18)]] = HostileValue(splicer);
        break;
      }
      case 5: {  // a role
        if (!body.contains("messages") || !body["messages"].is_array() ||
            body["messages"].empty()) {
          break;
        }
        json& message = body["messages"][Pick(body["messages"].size())];
        if (!message.is_object()) break;
        const char* roles[] = {"", "wizard", "hacker", "USER", " user", "developer", "function"};
        message["role"] = Pick(8) == 7 ? HostileValue(splicer) : json(roles[Pick(7)]);
        break;
      }
      case 6: {  // a field holding a deep value
        const char* fields[] = {"prompt", "messages", "tools", "stop", "seed", "made_up"};
        const int depth = Pick(2) == 0 ? 30000 : 100000;
        body[fields[Pick(6)]] =
            splicer->RawValue(absl::StrCat(std::string(depth, '['), std::string(depth, ']')));
        break;
      }
      default: {  // the line replaced by something else altogether
        const char* lines[] = {"[]", "null", "\"x\"", "1", "{}", "{\"custom_id\": \"x\"}"};
        *line = splicer->RawValue(lines[Pick(6)]);
        break;
      }
    }
  }

  void MutateText(std::string* text) {
    const size_t at = text->empty() ? 0 : Pick(text->size());
    switch (Pick(9)) {
      case 0:  // a NUL byte inside, or before trailing data
        text->insert(at, 1, '\0');
        break;
      case 1:
        *text += std::string("\0{\"trailing\": 1}", 16);
        break;
      case 2: {  // bytes that are not UTF-8
        const char* bad[] = {"\xff",     "\xc3",    "\xed\xa0\x80", "\xf4\x90\x80\x80",
                             "\xc0\xaf", "\xe2\x82"};
        text->insert(at, bad[Pick(6)]);
        break;
      }
      case 3:  // cut short
        text->resize(at);
        break;
      case 4: {  // data after the object
        const char* tails[] = {" {\"x\": 1}", "x", "]", "}", ",", " null"};
        *text += tails[Pick(6)];
        break;
      }
      case 5:  // a random byte
        if (!text->empty()) (*text)[at] = static_cast<char>(Pick(256));
        break;
      case 6:
        *text = "\xef\xbb\xbf" + *text;  // a byte order mark
        break;
      case 7: {  // a key twice in the body
        const size_t body = text->find("\"body\":{");
        if (body != std::string::npos) text->insert(body + 8, "\"seed\":1,");
        break;
      }
      default:
        *text = "[" + *text + "]";
        break;
    }
  }

  std::mt19937_64 rng_;
};

}  // namespace

std::vector<std::string> MakeHostileLines(uint64_t seed, int count) {
  Generator generator(seed);
  std::vector<std::string> lines;
  lines.reserve(count);
  for (int i = 0; i < count; ++i) lines.push_back(generator.Line(i));
  return lines;
}

std::vector<std::string> ValidLines(const std::string& custom_id_prefix) {
  std::vector<std::string> lines;
  for (const json& line : Bases(custom_id_prefix)) lines.push_back(line.dump());
  return lines;
}

}  // namespace deepinfer::testing
