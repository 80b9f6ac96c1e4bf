#include "common/grammar/json_schema_grammar.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/grammar/regex_parser.h"

namespace deepinfer::grammar {
namespace {

using json = nlohmann::ordered_json;

// Regexes for `format`, matched against the string's value. date is exact, leap days included.
constexpr char kDateRegex[] =
    "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|"
    "02-(0[1-9]|1[0-9]|2[0-8]))|([0-9]{2}(0[48]|[2468][048]|[13579][26])|"
    "([02468][048]|[13579][26])00)-02-29)";
constexpr char kTimeRegex[] =
    "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?(Z|[+-]([01][0-9]|2[0-3]):[0-5][0-9])";
constexpr char kUuidRegex[] =
    "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}";
constexpr char kEmailRegex[] =
    "[a-zA-Z0-9_%+-]+(\\.[a-zA-Z0-9_%+-]+)*@[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?"
    "(\\.[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)*\\.[a-zA-Z]{2,}";

const absl::flat_hash_set<std::string>& Annotations() {
  static const auto* s = new absl::flat_hash_set<std::string>{
      "title",    "description", "default",  "examples",  "$schema", "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
  return *s;
}

std::string PointerEscape(absl::string_view s) {
  return absl::StrReplaceAll(s, {{"~", "~0"}, {"/", "~1"}});
}

// Digits of the non-negative integers in [lo, hi] whose decimal forms all have hi's length.
int32_t SameLengthRange(Grammar* g, const std::string& lo, const std::string& hi) {
  if (lo.empty()) return g->Empty();
  if (lo[0] == hi[0]) {
    return g->Sequence({g->Bytes(lo.substr(0, 1)), SameLengthRange(g, lo.substr(1), hi.substr(1))});
  }
  const size_t rest = lo.size() - 1;
  const std::string zeros(rest, '0'), nines(rest, '9');
  auto digit = [&](char a, char b) {
    return g->CharClass({{static_cast<uint32_t>(a), static_cast<uint32_t>(b)}});
  };
  auto any_digits = [&](size_t n) { return g->Repeat(digit('0', '9'), n, n); };
  std::vector<int32_t> alts;
  char first_mid = lo[0], last_mid = hi[0];
  if (lo.substr(1) != zeros) {
    alts.push_back(
        g->Sequence({g->Bytes(lo.substr(0, 1)), SameLengthRange(g, lo.substr(1), nines)}));
    ++first_mid;
  }
  const bool hi_full = hi.substr(1) == nines;
  if (!hi_full) --last_mid;
  if (first_mid <= last_mid)
    alts.push_back(g->Sequence({digit(first_mid, last_mid), any_digits(rest)}));
  if (!hi_full) {
    alts.push_back(
        g->Sequence({g->Bytes(hi.substr(0, 1)), SameLengthRange(g, zeros, hi.substr(1))}));
  }
  return g->Alternation(std::move(alts));
}

// Decimal forms (no leading zeros) of the integers in [lo, hi]; hi == nullopt: unbounded.
int32_t NonNegativeRange(Grammar* g, uint64_t lo, std::optional<uint64_t> hi) {
  std::vector<int32_t> alts;
  const std::string lo_s = std::to_string(lo);
  const size_t max_len = hi ? std::to_string(*hi).size() : lo_s.size();
  for (size_t len = lo_s.size(); len <= max_len; ++len) {
    uint64_t first = len == 1 ? 0 : 1;
    for (size_t i = 1; i < len; ++i) first *= 10;
    uint64_t last = 9;
    for (size_t i = 1; i < len; ++i) last = last * 10 + 9;
    const uint64_t a = std::max(lo, first);
    const uint64_t b = hi ? std::min(*hi, last) : last;
    if (a > b) continue;
    alts.push_back(SameLengthRange(g, std::to_string(a), std::to_string(b)));
  }
  if (!hi && lo_s.size() < 19) {
    // Every longer number.
    alts.push_back(g->Sequence({g->CharClass({{'1', '9'}}),
                                g->Repeat(g->CharClass({{'0', '9'}}), lo_s.size(), kUnbounded)}));
  }
  if (alts.empty()) return g->CharClass({});
  return g->Alternation(std::move(alts));
}

constexpr int kMaxSchemaDepth = 128;
// prefixItems are built by recursion, one level per item.
constexpr size_t kMaxPrefixItems = 1000;

class SchemaCompiler {
 public:
  explicit SchemaCompiler(const json& root) : root_(root) {}

  absl::StatusOr<Grammar> Compile() {
    absl::StatusOr<int32_t> e = Visit(root_, "");
    if (!e.ok()) return e.status();
    const int32_t root = g_.Rule("root");
    g_.SetBody(root, *e);
    g_.SetRoot(root);
    return std::move(g_);
  }

  // Shared building blocks of every JSON grammar.
  static void AddBasics(Grammar* g, bool any_whitespace);

 private:
  absl::Status Error(absl::string_view path, absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("json schema: ", what, " (at '", path.empty() ? "#" : path, "')"));
  }

  int32_t Basic(absl::string_view name) {
    if (!basics_added_) {
      AddBasics(&g_, false);
      basics_added_ = true;
    }
    return g_.Ref(g_.Rule(name));
  }

  int32_t Literal(const json& value) { return g_.Bytes(value.dump()); }

  absl::StatusOr<int32_t> Visit(const json& schema, const std::string& path);
  absl::StatusOr<int32_t> VisitSchema(const json& schema, const std::string& path);
  absl::StatusOr<int32_t> VisitType(const json& schema, const std::string& type,
                                    const std::string& path);
  absl::StatusOr<int32_t> Ref(const std::string& ref, const std::string& path);
  absl::StatusOr<int32_t> Object(const json& schema, const std::string& path);
  absl::StatusOr<int32_t> Array(const json& schema, const std::string& path);
  absl::StatusOr<int32_t> String(const json& schema, const std::string& path);
  absl::StatusOr<int32_t> Number(const json& schema, bool integer, const std::string& path);

  const json& root_;
  Grammar g_;
  bool basics_added_ = false;
  absl::flat_hash_map<std::string, int32_t> ref_rules_;
  int depth_ = 0;
};

void SchemaCompiler::AddBasics(Grammar* g, bool any_whitespace) {
  const int32_t ws = g->Rule("ws");
  if (any_whitespace) {
    g->SetBody(ws, g->Repeat(g->CharClass({{' ', ' '}, {'\t', '\t'}, {'\n', '\n'}, {'\r', '\r'}}),
                             0, kUnbounded));
  } else {
    g->SetBody(ws, g->Repeat(g->Bytes(" "), 0, 1));
  }
  const int32_t hex = g->CharClass({{'0', '9'}, {'a', 'f'}, {'A', 'F'}});
  const int32_t ch = g->Rule("json_char");
  g->SetBody(
      ch,
      g->Alternation(
          {g->CharClass({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, /*negated=*/true),
           g->Sequence({g->Bytes("\\"),
                        g->Alternation({g->CharClass({{'"', '"'},
                                                      {'\\', '\\'},
                                                      {'/', '/'},
                                                      {'b', 'b'},
                                                      {'f', 'f'},
                                                      {'n', 'n'},
                                                      {'r', 'r'},
                                                      {'t', 't'}}),
                                        g->Sequence({g->Bytes("u"), g->Repeat(hex, 4, 4)})})})}));
  const int32_t str = g->Rule("json_string");
  g->KeepAsCall(str);
  g->SetBody(str,
             g->Sequence({g->Bytes("\""), g->Repeat(g->Ref(ch), 0, kUnbounded), g->Bytes("\"")}));
  const int32_t digits = g->Repeat(g->CharClass({{'0', '9'}}), 1, kUnbounded);
  const int32_t integer = g->Rule("json_integer");
  g->SetBody(
      integer,
      g->Sequence({g->Repeat(g->Bytes("-"), 0, 1),
                   g->Alternation({g->Bytes("0"), g->Sequence({g->CharClass({{'1', '9'}}),
                                                               g->Repeat(g->CharClass({{'0', '9'}}),
                                                                         0, kUnbounded)})})}));
  const int32_t number = g->Rule("json_number");
  g->SetBody(
      number,
      g->Sequence(
          {g->Ref(integer), g->Repeat(g->Sequence({g->Bytes("."), digits}), 0, 1),
           g->Repeat(g->Sequence({g->CharClass({{'e', 'e'}, {'E', 'E'}}),
                                  g->Repeat(g->CharClass({{'+', '+'}, {'-', '-'}}), 0, 1), digits}),
                     0, 1)}));
  const int32_t value = g->Rule("json_value");
  const int32_t object = g->Rule("json_object");
  const int32_t array = g->Rule("json_array");
  g->SetBody(value, g->Alternation({g->Ref(object), g->Ref(array), g->Ref(str), g->Ref(number),
                                    g->Bytes("true"), g->Bytes("false"), g->Bytes("null")}));
  const int32_t member =
      g->Sequence({g->Ref(str), g->Ref(ws), g->Bytes(":"), g->Ref(ws), g->Ref(value)});
  g->SetBody(object,
             g->Sequence({g->Bytes("{"), g->Ref(ws),
                          g->Repeat(g->Sequence({member, g->Ref(ws),
                                                 g->Repeat(g->Sequence({g->Bytes(","), g->Ref(ws),
                                                                        member, g->Ref(ws)}),
                                                           0, kUnbounded)}),
                                    0, 1),
                          g->Bytes("}")}));
  g->SetBody(array,
             g->Sequence({g->Bytes("["), g->Ref(ws),
                          g->Repeat(g->Sequence({g->Ref(value), g->Ref(ws),
                                                 g->Repeat(g->Sequence({g->Bytes(","), g->Ref(ws),
                                                                        g->Ref(value), g->Ref(ws)}),
                                                           0, kUnbounded)}),
                                    0, 1),
                          g->Bytes("]")}));
}

absl::StatusOr<int32_t> SchemaCompiler::Visit(const json& schema, const std::string& path) {
  // Bounds the recursion ($ref chains can nest without the document nesting).
  if (depth_ >= kMaxSchemaDepth) {
    return Error(path, absl::StrCat("schemas nest more than ", kMaxSchemaDepth,
                                    " levels (through $ref or subschemas)"));
  }
  ++depth_;
  absl::StatusOr<int32_t> out = VisitSchema(schema, path);
  --depth_;
  return out;
}

absl::StatusOr<int32_t> SchemaCompiler::VisitSchema(const json& schema, const std::string& path) {
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return Basic("json_value");
    return Error(path, "the schema false admits no value");
  }
  if (!schema.is_object()) return Error(path, "a schema must be an object or a boolean");

  static const absl::flat_hash_set<std::string>* kKnown =
      new absl::flat_hash_set<std::string>{"type",
                                           "properties",
                                           "required",
                                           "additionalProperties",
                                           "enum",
                                           "const",
                                           "anyOf",
                                           "oneOf",
                                           "allOf",
                                           "$ref",
                                           "items",
                                           "prefixItems",
                                           "minItems",
                                           "maxItems",
                                           "minLength",
                                           "maxLength",
                                           "pattern",
                                           "format",
                                           "minimum",
                                           "maximum",
                                           "exclusiveMinimum",
                                           "exclusiveMaximum"};
  for (const auto& [key, value] : schema.items()) {
    if (!kKnown->contains(key) && !Annotations().contains(key)) {
      return Error(path, absl::StrCat("keyword '", key, "' is not supported"));
    }
  }

  if (schema.contains("$ref")) {
    for (const auto& [key, value] : schema.items()) {
      if (key != "$ref" && !Annotations().contains(key)) {
        return Error(path, absl::StrCat("keyword '", key, "' beside $ref is not supported"));
      }
    }
    if (!schema["$ref"].is_string()) return Error(path, "$ref must be a string");
    return Ref(schema["$ref"].get<std::string>(), path);
  }
  if (schema.contains("const")) {
    return Literal(schema["const"]);
  }
  if (schema.contains("enum")) {
    const json& values = schema["enum"];
    if (!values.is_array() || values.empty()) return Error(path, "enum must be a non-empty array");
    std::vector<int32_t> alts;
    for (const json& v : values) alts.push_back(Literal(v));
    return g_.Alternation(std::move(alts));
  }
  for (const char* key : {"anyOf", "oneOf", "allOf"}) {
    if (!schema.contains(key)) continue;
    const json& list = schema[key];
    const std::string sub = absl::StrCat(path, "/", key);
    if (!list.is_array() || list.empty()) return Error(sub, "must be a non-empty array");
    for (const auto& [other, value] : schema.items()) {
      if (other != key && !Annotations().contains(other)) {
        return Error(path, absl::StrCat("keyword '", other, "' beside ", key, " is not supported"));
      }
    }
    if (std::string(key) == "allOf" && list.size() != 1) {
      return Error(sub, "allOf with more than one schema is not supported");
    }
    std::vector<int32_t> alts;
    for (size_t i = 0; i < list.size(); ++i) {
      absl::StatusOr<int32_t> e = Visit(list[i], absl::StrCat(sub, "/", i));
      if (!e.ok()) return e;
      alts.push_back(*e);
    }
    return g_.Alternation(std::move(alts));
  }

  std::vector<std::string> types;
  if (schema.contains("type")) {
    const json& t = schema["type"];
    if (t.is_string()) {
      types.push_back(t.get<std::string>());
    } else if (t.is_array() && !t.empty()) {
      for (const json& x : t) {
        if (!x.is_string()) return Error(path + "/type", "type names must be strings");
        types.push_back(x.get<std::string>());
      }
    } else {
      return Error(path + "/type", "type must be a string or a non-empty array of strings");
    }
  } else {
    // No type: infer it from the keywords present, else any value.
    if (schema.contains("properties") || schema.contains("additionalProperties") ||
        schema.contains("required")) {
      types.push_back("object");
    } else if (schema.contains("items") || schema.contains("prefixItems") ||
               schema.contains("minItems") || schema.contains("maxItems")) {
      types.push_back("array");
    } else if (schema.contains("pattern") || schema.contains("format") ||
               schema.contains("minLength") || schema.contains("maxLength")) {
      types.push_back("string");
    } else if (schema.contains("minimum") || schema.contains("maximum") ||
               schema.contains("exclusiveMinimum") || schema.contains("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return Basic("json_value");
    }
  }
  std::vector<int32_t> alts;
  for (const std::string& type : types) {
    absl::StatusOr<int32_t> e = VisitType(schema, type, path);
    if (!e.ok()) return e;
    alts.push_back(*e);
  }
  return g_.Alternation(std::move(alts));
}

absl::StatusOr<int32_t> SchemaCompiler::VisitType(const json& schema, const std::string& type,
                                                  const std::string& path) {
  if (type == "object") return Object(schema, path);
  if (type == "array") return Array(schema, path);
  if (type == "string") return String(schema, path);
  if (type == "integer") return Number(schema, true, path);
  if (type == "number") return Number(schema, false, path);
  if (type == "boolean") return g_.Alternation({g_.Bytes("true"), g_.Bytes("false")});
  if (type == "null") return g_.Bytes("null");
  return Error(path + "/type", absl::StrCat("unknown type '", type, "'"));
}

absl::StatusOr<int32_t> SchemaCompiler::Ref(const std::string& ref, const std::string& path) {
  auto it = ref_rules_.find(ref);
  if (it != ref_rules_.end()) return g_.Ref(it->second);
  if (ref.empty() || ref[0] != '#') {
    return Error(path, absl::StrCat("$ref '", ref,
                                    "' is not supported (only refs into this "
                                    "document, starting with '#')"));
  }
  const json* target = &root_;
  if (ref.size() > 1) {
    if (ref[1] != '/') return Error(path, absl::StrCat("$ref '", ref, "' is not a JSON pointer"));
    for (absl::string_view part : absl::StrSplit(absl::string_view(ref).substr(2), '/')) {
      const std::string key = absl::StrReplaceAll(part, {{"~1", "/"}, {"~0", "~"}});
      if (target->is_object() && target->contains(key)) {
        target = &(*target)[key];
      } else if (target->is_array() && !key.empty() &&
                 key.find_first_not_of("0123456789") == std::string::npos &&
                 std::stoul(key) < target->size()) {
        target = &(*target)[std::stoul(key)];
      } else {
        return Error(path, absl::StrCat("$ref '", ref, "' does not resolve"));
      }
    }
  }
  std::string name = "ref";
  for (char c : ref.substr(ref.rfind('/') + 1)) {
    if (absl::ascii_isalnum(c) || c == '_') name.push_back(c);
  }
  if (name != "ref") name = "ref_" + name.substr(3);
  const int32_t rule = g_.NewRule(name, g_.Empty());
  ref_rules_.emplace(ref, rule);
  absl::StatusOr<int32_t> body = Visit(*target, ref.substr(1));
  if (!body.ok()) return body;
  g_.SetBody(rule, *body);
  return g_.Ref(rule);
}

absl::StatusOr<int32_t> SchemaCompiler::Object(const json& schema, const std::string& path) {
  const json empty = json::object();
  const json& props = schema.contains("properties") ? schema["properties"] : empty;
  if (!props.is_object()) return Error(path + "/properties", "properties must be an object");
  absl::flat_hash_set<std::string> required;
  if (schema.contains("required")) {
    if (!schema["required"].is_array()) return Error(path + "/required", "must be an array");
    for (const json& r : schema["required"]) {
      if (!r.is_string()) return Error(path + "/required", "names must be strings");
      if (!props.contains(r.get<std::string>())) {
        return Error(path + "/required", absl::StrCat("required property '", r.get<std::string>(),
                                                      "' is not in properties (not supported)"));
      }
      required.insert(r.get<std::string>());
    }
  }
  // additionalProperties: absent or true: any; false: none; a schema: values of that schema.
  std::optional<int32_t> extra_value;
  if (!schema.contains("additionalProperties") || schema["additionalProperties"] == true) {
    extra_value = Basic("json_value");
  } else if (schema["additionalProperties"] != false) {
    absl::StatusOr<int32_t> v =
        Visit(schema["additionalProperties"], path + "/additionalProperties");
    if (!v.ok()) return v;
    extra_value = *v;
  }
  const int32_t ws = Basic("ws");
  struct Prop {
    int32_t member;  // "name" ws ":" ws value
    bool required;
  };
  std::vector<Prop> list;
  for (const auto& [name, sub] : props.items()) {
    absl::StatusOr<int32_t> v = Visit(sub, absl::StrCat(path, "/properties/", PointerEscape(name)));
    if (!v.ok()) return v;
    list.push_back(
        {g_.Sequence({Literal(json(name)), g_.Bytes(":"), ws, *v}), required.contains(name)});
  }
  std::optional<int32_t> extra_member;
  if (extra_value) {
    extra_member = g_.Sequence({Basic("json_string"), g_.Bytes(":"), ws, *extra_value});
  }
  const int32_t comma = g_.Sequence({g_.Bytes(","), ws});
  // rest[i][started]: properties i.. given whether one was already written (so the next needs
  // a comma). Built from the end as rules so each is written once.
  const size_t n = list.size();
  std::vector<int32_t> rest_started(n + 1), rest_fresh(n + 1);
  if (extra_member) {
    rest_started[n] = g_.Repeat(g_.Sequence({comma, *extra_member}), 0, kUnbounded);
    rest_fresh[n] = g_.Repeat(
        g_.Sequence({*extra_member, g_.Repeat(g_.Sequence({comma, *extra_member}), 0, kUnbounded)}),
        0, 1);
  } else {
    rest_started[n] = g_.Empty();
    rest_fresh[n] = g_.Empty();
  }
  for (size_t i = n; i-- > 0;) {
    const int32_t after = g_.Ref(g_.NewRule("object_rest", rest_started[i + 1]));
    std::vector<int32_t> started = {g_.Sequence({comma, list[i].member, after})};
    std::vector<int32_t> fresh = {g_.Sequence({list[i].member, after})};
    if (!list[i].required) {
      started.push_back(rest_started[i + 1]);
      fresh.push_back(rest_fresh[i + 1]);
    }
    rest_started[i] = g_.Alternation(std::move(started));
    rest_fresh[i] = g_.Alternation(std::move(fresh));
  }
  return g_.Sequence({g_.Bytes("{"), rest_fresh[0], g_.Bytes("}")});
}

absl::StatusOr<int32_t> SchemaCompiler::Array(const json& schema, const std::string& path) {
  int64_t min_items = 0, max_items = -1;
  for (const char* key : {"minItems", "maxItems"}) {
    if (!schema.contains(key)) continue;
    if (!schema[key].is_number_integer() || schema[key].get<int64_t>() < 0) {
      return Error(path + "/" + key, "must be a non-negative integer");
    }
    (std::string(key) == "minItems" ? min_items : max_items) = schema[key].get<int64_t>();
  }
  if (max_items >= 0 && max_items < min_items) return Error(path, "maxItems < minItems");
  std::vector<int32_t> prefix;
  if (schema.contains("prefixItems")) {
    const json& p = schema["prefixItems"];
    if (!p.is_array()) return Error(path + "/prefixItems", "must be an array");
    if (p.size() > kMaxPrefixItems) {
      return Error(path + "/prefixItems",
                   absl::StrCat("more than ", kMaxPrefixItems, " items are not supported"));
    }
    for (size_t i = 0; i < p.size(); ++i) {
      absl::StatusOr<int32_t> e = Visit(p[i], absl::StrCat(path, "/prefixItems/", i));
      if (!e.ok()) return e;
      prefix.push_back(*e);
    }
  }
  std::optional<int32_t> item;
  if (!schema.contains("items") || schema["items"] == true) {
    item = Basic("json_value");
  } else if (schema["items"] != false) {
    absl::StatusOr<int32_t> e = Visit(schema["items"], path + "/items");
    if (!e.ok()) return e;
    item = *e;
  }
  const int32_t ws = Basic("ws");
  const int32_t comma = g_.Sequence({g_.Bytes(","), ws});
  if (!prefix.empty() && min_items > static_cast<int64_t>(prefix.size()) && !item) {
    return Error(path, "minItems is more than prefixItems allows");
  }
  // Elements: the prefix items in order (each optional once minItems is met), then items.
  // Built from the end: tail(k) = what may follow once k elements are written.
  const int64_t cap = 100000;
  if (min_items > cap || max_items > cap) return Error(path, "minItems/maxItems is too large");
  std::function<int32_t(int64_t)> tail = [&](int64_t k) -> int32_t {
    // k elements written (k >= 1): more are ", elem".
    if (k < static_cast<int64_t>(prefix.size())) {
      if (max_items >= 0 && k >= max_items) return g_.Empty();
      const int32_t next = g_.Sequence({comma, prefix[k], tail(k + 1)});
      return k >= min_items ? g_.Repeat(next, 0, 1) : next;
    }
    if (!item) return g_.Empty();
    const int64_t need = std::max<int64_t>(0, min_items - k);
    const int32_t elem = g_.Sequence({comma, *item});
    if (max_items < 0) return g_.Repeat(elem, need, kUnbounded);
    return g_.Repeat(elem, need, std::max<int64_t>(need, max_items - k));
  };
  std::optional<int32_t> first = prefix.empty() ? item : std::optional<int32_t>(prefix[0]);
  int32_t body;
  if (!first || max_items == 0) {
    body = g_.Empty();
  } else {
    const int32_t elems = g_.Sequence({*first, tail(1)});
    body = min_items > 0 ? elems : g_.Repeat(elems, 0, 1);
  }
  return g_.Sequence({g_.Bytes("["), body, g_.Bytes("]")});
}

absl::StatusOr<int32_t> SchemaCompiler::String(const json& schema, const std::string& path) {
  const bool has_len = schema.contains("minLength") || schema.contains("maxLength");
  std::optional<std::string> regex;
  if (schema.contains("format")) {
    if (!schema["format"].is_string()) return Error(path + "/format", "must be a string");
    const std::string f = schema["format"].get<std::string>();
    if (f == "date") {
      regex = kDateRegex;
    } else if (f == "time") {
      regex = kTimeRegex;
    } else if (f == "date-time") {
      regex = absl::StrCat(kDateRegex, "T", kTimeRegex);
    } else if (f == "uuid") {
      regex = kUuidRegex;
    } else if (f == "email") {
      regex = kEmailRegex;
    } else {
      return Error(path + "/format", absl::StrCat("format '", f, "' is not supported"));
    }
  }
  if (schema.contains("pattern")) {
    if (regex) return Error(path, "pattern together with format is not supported");
    if (!schema["pattern"].is_string()) return Error(path + "/pattern", "must be a string");
    regex = schema["pattern"].get<std::string>();
  }
  if (regex) {
    if (has_len)
      return Error(path, "minLength/maxLength together with pattern or format is not supported");
    absl::StatusOr<int32_t> e = AddRegex(&g_, *regex, RegexTarget::kJsonString);
    if (!e.ok())
      return Error(path + (schema.contains("pattern") ? "/pattern" : "/format"),
                   e.status().message());
    return g_.Sequence({g_.Bytes("\""), *e, g_.Bytes("\"")});
  }
  if (!has_len) return Basic("json_string");
  int64_t min_len = 0, max_len = -1;
  for (const char* key : {"minLength", "maxLength"}) {
    if (!schema.contains(key)) continue;
    if (!schema[key].is_number_integer() || schema[key].get<int64_t>() < 0) {
      return Error(path + "/" + key, "must be a non-negative integer");
    }
    (std::string(key) == "minLength" ? min_len : max_len) = schema[key].get<int64_t>();
  }
  if (max_len >= 0 && max_len < min_len) return Error(path, "maxLength < minLength");
  if (min_len > 10000 || max_len > 10000)
    return Error(path, "minLength/maxLength above 10000 is not supported");
  const int32_t ch = Basic("json_char");
  return g_.Sequence({g_.Bytes("\""),
                      g_.Repeat(ch, static_cast<int32_t>(min_len),
                                max_len < 0 ? kUnbounded : static_cast<int32_t>(max_len)),
                      g_.Bytes("\"")});
}

absl::StatusOr<int32_t> SchemaCompiler::Number(const json& schema, bool integer,
                                               const std::string& path) {
  // Bounds as a closed integer interval on the integer part, after exclusivity.
  std::optional<double> lo, hi;
  bool lo_open = false, hi_open = false;
  for (const char* key : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
    if (!schema.contains(key)) continue;
    const json& v = schema[key];
    if (!v.is_number()) return Error(path + "/" + key, "must be a number");
    const double d = v.get<double>();
    const std::string k = key;
    const bool is_min = k == "minimum" || k == "exclusiveMinimum";
    const bool open = k.rfind("exclusive", 0) == 0;
    auto& bound = is_min ? lo : hi;
    auto& bound_open = is_min ? lo_open : hi_open;
    if (!bound || (is_min ? d > *bound : d < *bound) || (d == *bound && open)) {
      bound = d;
      bound_open = open;
    }
  }
  if (!lo && !hi) return Basic(integer ? "json_integer" : "json_number");
  constexpr double kLimit = 9.0e18;
  if ((lo && std::fabs(*lo) > kLimit) || (hi && std::fabs(*hi) > kLimit)) {
    return Error(path, "bounds beyond +-9e18 are not supported");
  }
  if (!integer) {
    const bool integral = (!lo || std::floor(*lo) == *lo) && (!hi || std::floor(*hi) == *hi);
    if (!integral || lo_open || hi_open) {
      return Error(path, "on type number only inclusive integral minimum/maximum are supported");
    }
  }
  // Integer interval [a, b] of allowed integer values (for numbers: of integer parts, see
  // below); has_a and has_b say whether each bound exists. Plain integers rather than
  // optionals: GCC's -O2 flow analysis reports optionals read under a has_value() test that it
  // cannot follow as maybe uninitialized.
  const bool has_a = lo.has_value(), has_b = hi.has_value();
  int64_t a = 0, b = 0;
  if (has_a) a = static_cast<int64_t>(lo_open ? std::floor(*lo) + 1 : std::ceil(*lo));
  if (has_b) b = static_cast<int64_t>(hi_open ? std::ceil(*hi) - 1 : std::floor(*hi));
  if (has_a && has_b && a > b) return Error(path, "no integer lies within the bounds");
  auto bound = [](bool has, int64_t value) {
    return has ? std::optional<int64_t>(value) : std::nullopt;
  };
  auto range = [&](std::optional<int64_t> from, std::optional<int64_t> to) -> int32_t {
    // Integers in [from, to] (either may be unbounded); from <= to when both are set.
    std::vector<int32_t> alts;
    if (!to || *to >= 0) {
      const uint64_t start = from && *from > 0 ? static_cast<uint64_t>(*from) : 0;
      alts.push_back(
          NonNegativeRange(&g_, start, to ? std::optional<uint64_t>(*to) : std::nullopt));
    }
    if (!from || *from < 0) {
      const uint64_t mag_lo = to && *to < 0 ? static_cast<uint64_t>(-*to) : 1;
      std::optional<uint64_t> mag_hi;
      if (from) mag_hi = static_cast<uint64_t>(-*from);
      alts.push_back(g_.Sequence({g_.Bytes("-"), NonNegativeRange(&g_, mag_lo, mag_hi)}));
    }
    return g_.Alternation(std::move(alts));
  };
  if (integer) return range(bound(has_a, a), bound(has_b, b));
  // number in [a, b] with integral a, b: an integer part strictly inside with any fraction, or
  // a bound itself with a zero fraction; negative values with a fraction lie below their
  // integer part, so their integer part may equal a + 1 .. b and fractions grow toward a.
  const int32_t frac = g_.Repeat(
      g_.Sequence({g_.Bytes("."), g_.Repeat(g_.CharClass({{'0', '9'}}), 1, kUnbounded)}), 0, 1);
  const int32_t zero_frac =
      g_.Repeat(g_.Sequence({g_.Bytes("."), g_.Repeat(g_.Bytes("0"), 1, kUnbounded)}), 0, 1);
  std::vector<int32_t> alts;
  // Non-negative values: integer part in [max(a,0), b - 1] with any fraction, b with zeros.
  if (!has_b || b >= 0) {
    const int64_t from = has_a ? std::max<int64_t>(a, 0) : 0;
    if (!has_b || b - 1 >= from) {
      alts.push_back(g_.Sequence({range(from, bound(has_b, b - 1)), frac}));
    }
    if (has_b && b >= from) alts.push_back(g_.Sequence({range(b, b), zero_frac}));
  }
  // Negative values -m.f: -m.f >= a needs a magnitude m <= -a - 1 with any fraction, or m ==
  // -a with a zero fraction; -m.f <= b needs m >= -b (for m == -b any fraction is below b).
  if (!has_a || a < 0) {
    const int64_t m_hi = has_a ? -a : INT64_MAX;
    const int64_t m_lo = has_b && b < 0 ? -b : 0;
    std::vector<int32_t> neg;
    if (!has_a || m_hi - 1 >= m_lo) {
      neg.push_back(g_.Sequence({range(m_lo, bound(has_a, m_hi - 1)), frac}));
    }
    if (has_a) neg.push_back(g_.Sequence({range(m_hi, m_hi), zero_frac}));
    alts.push_back(g_.Sequence({g_.Bytes("-"), g_.Alternation(std::move(neg))}));
  }
  return g_.Alternation(std::move(alts));
}

}  // namespace

Grammar JsonObjectGrammar() {
  Grammar g;
  SchemaCompiler::AddBasics(&g, /*any_whitespace=*/true);
  const int32_t root = g.Rule("root");
  g.SetBody(root, g.Ref(g.Rule("json_object")));
  g.SetRoot(root);
  return g;
}

absl::StatusOr<Grammar> JsonSchemaGrammar(const json& schema) {
  return SchemaCompiler(schema).Compile();
}

}  // namespace deepinfer::grammar
