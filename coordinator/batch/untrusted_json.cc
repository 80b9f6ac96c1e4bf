#include "coordinator/batch/untrusted_json.h"

#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

using json = nlohmann::ordered_json;

// Bytes of a user's string shown in a message.
constexpr size_t kShownBytes = 40;
// Bytes of the parser's own description of a syntax error shown in a message (it quotes
// the input near the error).
constexpr size_t kShownParserBytes = 160;

// The length of the longest prefix of `text` of at most `max_bytes` that does not end
// inside a UTF-8 sequence.
size_t Utf8Prefix(absl::string_view text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text.size();
  size_t n = max_bytes;
  while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  return n;
}

// JSON string escaping of `text` without the quotes; bytes that are not UTF-8 become U+FFFD.
std::string Escape(absl::string_view text) {
  std::string quoted =
      json(std::string(text)).dump(-1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
  return quoted.substr(1, quoted.size() - 2);
}

// Builds the value from the parser's events, as nlohmann's own DOM parser does, and stops at
// the first thing ParseUntrustedJson refuses.
class BoundedDomBuilder final : public nlohmann::json_sax<json> {
 public:
  bool null() override { return Add(nullptr); }
  bool boolean(bool value) override { return Add(value); }
  bool number_integer(number_integer_t value) override { return Add(value); }
  bool number_unsigned(number_unsigned_t value) override { return Add(value); }
  bool number_float(number_float_t value, const string_t& /*text*/) override { return Add(value); }
  bool string(string_t& value) override { return Add(std::move(value)); }
  bool binary(binary_t& /*value*/) override {
    // The JSON lexer never produces binary values.
    return Fail("a binary value");
  }
  bool start_object(std::size_t /*elements*/) override { return Open(json::object()); }
  bool key(string_t& key) override {
    Frame& frame = stack_.back();
    if (!frame.keys.insert(key).second) {
      return Fail(absl::StrCat("duplicate key ", QuoteForMessage(key), " in one object"));
    }
    // The set above has ruled out a second entry, so append without ordered_map's linear
    // search for the key (quadratic over an object's keys).
    json::object_t& object = frame.value->get_ref<json::object_t&>();
    object.emplace_back(std::move(key), nullptr);
    slot_ = &object.back().second;
    return true;
  }
  bool end_object() override {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t /*elements*/) override { return Open(json::array()); }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t position, const std::string& /*last_token*/,
                   const nlohmann::detail::exception& ex) override {
    // what(): "[json.exception.parse_error.101] parse error at line 1, column 7: syntax
    // error while parsing value - ...". The prefix repeats the position and the "line 1"
    // would read like the input's line number.
    absl::string_view what = ex.what();
    if (size_t bracket = what.find("] "); bracket != absl::string_view::npos) {
      what.remove_prefix(bracket + 2);
    }
    if (absl::StartsWith(what, "parse error")) {
      if (size_t colon = what.find(": "); colon != absl::string_view::npos) {
        what.remove_prefix(colon + 2);
      }
    }
    if (absl::StrContains(what, "; expected end of input")) {
      return Fail(absl::StrCat("data after the JSON value, near byte ", position));
    }
    const size_t shown = Utf8Prefix(what, kShownParserBytes);
    return Fail(absl::StrCat("not valid JSON near byte ", position, ": ", what.substr(0, shown),
                             shown < what.size() ? "..." : ""));
  }

  json TakeValue() { return std::move(root_); }
  const std::string& error() const { return error_; }

 private:
  struct Frame {
    json* value;
    absl::flat_hash_set<std::string> keys;  // objects only
  };

  // Where the next value goes: the root, the end of the open list, or the key just read.
  json* Slot() {
    if (stack_.empty()) return &root_;
    json* container = stack_.back().value;
    if (container->is_array()) {
      json::array_t& array = container->get_ref<json::array_t&>();
      array.emplace_back();
      return &array.back();
    }
    return slot_;
  }

  template <typename V>
  bool Add(V&& value) {
    *Slot() = json(std::forward<V>(value));
    return true;
  }

  bool Open(json container) {
    if (stack_.size() >= static_cast<size_t>(kMaxJsonDepth)) {
      return Fail(absl::StrCat("nested more than ", kMaxJsonDepth,
                               " levels deep (objects and lists inside each other)"));
    }
    json* target = Slot();
    *target = std::move(container);
    // `target` stays valid while it is open: its parent only grows after it is closed.
    stack_.push_back({target, {}});
    return true;
  }

  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }

  json root_;
  std::vector<Frame> stack_;
  json* slot_ = nullptr;
  std::string error_;
};

}  // namespace

absl::StatusOr<json> ParseUntrustedJson(absl::string_view text) {
  if (size_t nul = text.find('\0'); nul != absl::string_view::npos) {
    // The parser would stop there and ignore the rest.
    return absl::InvalidArgumentError(absl::StrCat("a NUL byte at byte ", nul + 1));
  }
  BoundedDomBuilder builder;
  const bool ok = json::sax_parse(text.begin(), text.end(), &builder);
  if (!ok || !builder.error().empty()) {
    return absl::InvalidArgumentError(builder.error().empty() ? "not valid JSON" : builder.error());
  }
  return builder.TakeValue();
}

std::string DescribeJson(const json& value) {
  switch (value.type()) {
    case json::value_t::object:
      return value.empty() ? "an empty object"
                           : absl::StrCat("an object of ", value.size(), " keys");
    case json::value_t::array:
      return value.empty() ? "an empty list" : absl::StrCat("a list of ", value.size(), " items");
    case json::value_t::string: {
      const std::string& s = value.get_ref<const std::string&>();
      const size_t shown = Utf8Prefix(s, kShownBytes);
      if (shown == s.size()) return absl::StrCat("\"", Escape(s), "\"");
      return absl::StrCat("\"", Escape(absl::string_view(s).substr(0, shown)), "...\" (", s.size(),
                          " bytes)");
    }
    default:
      // null, booleans and numbers: short.
      return value.dump(-1, ' ', false, json::error_handler_t::replace);
  }
}

std::string QuoteForMessage(absl::string_view text) {
  const size_t shown = Utf8Prefix(text, kShownBytes);
  return absl::StrCat("'", Escape(text.substr(0, shown)), shown < text.size() ? "...'" : "'");
}

}  // namespace deepinfer
