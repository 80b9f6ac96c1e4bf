#include "common/grammar/json_schema_grammar.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::grammar {
namespace {

using json = ::nlohmann::ordered_json;
using ::testing::HasSubstr;

std::shared_ptr<const CompiledGrammar> CompileSchema(const std::string& schema) {
  absl::StatusOr<Grammar> g = JsonSchemaGrammar(json::parse(schema));
  EXPECT_TRUE(g.ok()) << g.status();
  if (!g.ok()) return nullptr;
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Compile(*g);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *c : nullptr;
}

std::string SchemaError(const std::string& schema) {
  absl::StatusOr<Grammar> g = JsonSchemaGrammar(json::parse(schema));
  if (!g.ok()) return std::string(g.status().message());
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Compile(*g);
  return c.ok() ? "" : std::string(c.status().message());
}

// Schemas whose documents are bounded, so random walks end.
const std::vector<std::string>& Schemas() {
  static const auto* s = new std::vector<std::string>{
      R"({"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 3},
                     "minItems": 1, "maxItems": 3},
            "ok": {"type": "boolean"}},
          "required": ["name", "age"], "additionalProperties": false})",
      R"({"enum": ["red", "green", 3, null, {"a": [1, 2]}]})",
      R"({"type": "array", "prefixItems": [{"const": "x"}, {"type": "null"}],
          "items": {"type": "integer", "exclusiveMinimum": -20, "exclusiveMaximum": 20},
          "maxItems": 4})",
      R"({"type": "number", "minimum": -3, "maximum": 7})",
      R"({"type": "integer", "minimum": 95, "maximum": 1234})",
      R"({"type": "integer", "minimum": -1234, "maximum": -95})",
      R"({"type": "object", "properties": {
            "d": {"type": "string", "format": "date"},
            "t": {"type": "string", "format": "date-time"},
            "u": {"type": "string", "format": "uuid"},
            "e": {"type": "string", "format": "email"}},
          "required": ["d", "t", "u", "e"], "additionalProperties": false})",
      R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}(x|\")?$"})",
      R"({"$defs": {"node": {"type": "object",
                             "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 9},
                                            "next": {"anyOf": [{"$ref": "#/$defs/node"},
                                                               {"type": "null"}]}},
                             "required": ["v", "next"], "additionalProperties": false}},
          "$ref": "#/$defs/node"})",
      R"({"type": "object", "properties": {"a": {"type": "integer", "maximum": 3},
                                         "b": {"oneOf": [{"type": "string", "maxLength": 2},
                                                         {"type": ["boolean", "null"]}]},
                                         "c": {"const": 1}},
          "additionalProperties": false})",
      R"({"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 9},
          "properties": {"k": {"type": "boolean"}}, "required": ["k"]})",
  };
  return *s;
}

// A random document the grammar allows, byte by byte; nullopt past 400 bytes. The walk takes
// the stop token one time in two once the document is complete.
std::optional<std::string> RandomDocument(const std::shared_ptr<TokenMaskCache>& cache,
                                          std::mt19937* rng) {
  GrammarMatcher m(cache);
  std::vector<uint32_t> mask(m.vocabulary().mask_words());
  std::string out;
  while (out.size() < 400) {
    if (m.IsComplete() && (*rng)() % 2 == 0) return out;
    m.FillNextTokenBitmask(mask.data());
    std::vector<int> allowed;
    for (int b = 0; b < 256; ++b) {
      if (mask[b >> 5] >> (b & 31) & 1) allowed.push_back(b);
    }
    if (allowed.empty()) return m.IsComplete() ? std::optional<std::string>(out) : std::nullopt;
    const int b = allowed[(*rng)() % allowed.size()];
    if (!m.AcceptToken(b)) return std::nullopt;
    out.push_back(static_cast<char>(b));
  }
  return std::nullopt;
}

// A Python with the jsonschema package: $DEEPINFER_PYTHON, else python3.
std::string PythonWithJsonschema() {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("DEEPINFER_PYTHON")) candidates.push_back(p);
  candidates.push_back("python3");
  for (const std::string& py : candidates) {
    if (std::system((py + " -c 'import jsonschema' 2>/dev/null").c_str()) == 0) return py;
  }
  return "";
}

// Every generated document parses (nlohmann) and validates (Python jsonschema, Draft 2020-12
// with its format checker).
TEST(JsonSchemaGrammarTest, GeneratedDocumentsValidate) {
  const std::string python = PythonWithJsonschema();
  if (python.empty()) {
    GTEST_SKIP() << "no python3 with the jsonschema package (apt-get install python3-jsonschema, "
                    "or set DEEPINFER_PYTHON)";
  }
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  const std::string cases_path = dir + "/cases.jsonl";
  std::ofstream cases(cases_path);
  std::mt19937 rng(1234);
  int total = 0;
  for (const std::string& schema : Schemas()) {
    auto g = CompileSchema(schema);
    ASSERT_NE(g, nullptr) << schema;
    auto cache = std::make_shared<TokenMaskCache>(g, ByteVocabulary());
    int made = 0;
    for (int i = 0; i < 300 && made < 60; ++i) {
      std::optional<std::string> doc = RandomDocument(cache, &rng);
      if (!doc) continue;
      ++made;
      json parsed = json::parse(*doc, nullptr, false);
      ASSERT_FALSE(parsed.is_discarded()) << "not JSON: " << *doc << "\nschema " << schema;
      cases << json{{"schema", json::parse(schema)}, {"doc", *doc}}.dump() << "\n";
    }
    EXPECT_GE(made, 30) << schema;
    total += made;
  }
  cases.close();
  const std::string script = dir + "/validate.py";
  std::ofstream(script) << R"py(
import json, sys
from jsonschema import Draft202012Validator, FormatChecker
bad = 0
for line in open(sys.argv[1]):
    case = json.loads(line)
    doc = json.loads(case["doc"])
    v = Draft202012Validator(case["schema"], format_checker=FormatChecker())
    errors = list(v.iter_errors(doc))
    if errors:
        bad += 1
        print("INVALID:", case["doc"], "--", errors[0].message)
print("checked", sum(1 for _ in open(sys.argv[1])), "invalid", bad)
sys.exit(1 if bad else 0)
)py";
  const std::string out_path = dir + "/validate.out";
  const int rc =
      std::system((python + " " + script + " " + cases_path + " > " + out_path + " 2>&1").c_str());
  std::ifstream in(out_path);
  const std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(rc, 0) << report;
  EXPECT_THAT(report, HasSubstr("checked " + std::to_string(total) + " invalid 0")) << report;
}

TEST(JsonSchemaGrammarTest, AcceptsAndRejectsKnownDocuments) {
  auto person = CompileSchema(Schemas()[0]);
  ASSERT_NE(person, nullptr);
  EXPECT_TRUE(Matches(person, R"({"name":"Al","age":30})"));
  EXPECT_TRUE(Matches(person, R"({"name": "Al", "age": 150, "tags": ["a", "bcd"], "ok": true})"));
  EXPECT_TRUE(Matches(person, R"({"name":"\u00e9\n","age":0,"ok":false})"));
  EXPECT_FALSE(Matches(person, R"({"age":30,"name":"Al"})"));           // order is the schema's
  EXPECT_FALSE(Matches(person, R"({"name":"Al"})"));                    // age is required
  EXPECT_FALSE(Matches(person, R"({"name":"Al","age":151})"));          // maximum
  EXPECT_FALSE(Matches(person, R"({"name":"Al","age":-1})"));           // minimum
  EXPECT_FALSE(Matches(person, R"({"name":"Al","age":07})"));           // leading zero
  EXPECT_FALSE(Matches(person, R"({"name":"Alphabet","age":1})"));      // maxLength
  EXPECT_FALSE(Matches(person, R"({"name":"Al","age":1,"x":1})"));      // additionalProperties
  EXPECT_FALSE(Matches(person, R"({"name":"Al","age":1,"tags":[]})"));  // minItems
  EXPECT_FALSE(Matches(person, R"({"name":"Al","age":1,"tags":["a","b","c","d"]})"));

  auto dates = CompileSchema(R"({"type": "string", "format": "date"})");
  EXPECT_TRUE(Matches(dates, R"("2024-02-29")"));
  EXPECT_TRUE(Matches(dates, R"("2000-02-29")"));
  EXPECT_TRUE(Matches(dates, R"("1999-12-31")"));
  EXPECT_FALSE(Matches(dates, R"("2023-02-29")"));
  EXPECT_FALSE(Matches(dates, R"("1900-02-29")"));
  EXPECT_FALSE(Matches(dates, R"("2023-04-31")"));
  EXPECT_FALSE(Matches(dates, R"("2023-13-01")"));

  auto number = CompileSchema(Schemas()[3]);  // [-3, 7]
  for (const char* ok : {"-3", "-3.0", "-2.99", "0", "-0.5", "6.999", "7", "7.00"}) {
    EXPECT_TRUE(Matches(number, ok)) << ok;
  }
  for (const char* bad : {"-3.01", "-4", "7.01", "8", "1e2", "07"}) {
    EXPECT_FALSE(Matches(number, bad)) << bad;
  }
  auto exclusive =
      CompileSchema(R"({"type": "integer", "exclusiveMinimum": 2.5, "exclusiveMaximum": 10})");
  EXPECT_FALSE(Matches(exclusive, "2"));
  EXPECT_TRUE(Matches(exclusive, "3"));
  EXPECT_TRUE(Matches(exclusive, "9"));
  EXPECT_FALSE(Matches(exclusive, "10"));

  auto pattern = CompileSchema(Schemas()[7]);
  EXPECT_TRUE(Matches(pattern, R"("AB-123")"));
  EXPECT_TRUE(Matches(pattern, R"("AB-123\"")"));
  EXPECT_FALSE(Matches(pattern, R"("AB-123"")"));
  EXPECT_FALSE(Matches(pattern, R"("ab-123")"));

  auto any_object = CompiledGrammar::Compile(JsonObjectGrammar());
  ASSERT_TRUE(any_object.ok());
  EXPECT_TRUE(Matches(*any_object, "{ \"a\" : [1, 2.5e-3, {\"b\": null}], \"c\":\"\\\"\" }"));
  EXPECT_FALSE(Matches(*any_object, "[1]"));
  EXPECT_FALSE(Matches(*any_object, "{\"a\":1,}"));
  EXPECT_FALSE(Matches(*any_object, "{\"a\":01}"));
  EXPECT_FALSE(Matches(*any_object, "{\"a\":\"\x01\"}"));
}

TEST(JsonSchemaGrammarTest, UnsupportedKeywordsAreErrorsNamingThem) {
  EXPECT_THAT(SchemaError(R"({"type": "array", "uniqueItems": true})"),
              HasSubstr("keyword 'uniqueItems' is not supported (at '#')"));
  EXPECT_THAT(SchemaError(R"({"properties": {"a": {"type": "string", "contentEncoding": "x"}}})"),
              HasSubstr("keyword 'contentEncoding' is not supported (at '/properties/a')"));
  EXPECT_THAT(SchemaError(R"({"type": "number", "multipleOf": 2})"),
              HasSubstr("keyword 'multipleOf'"));
  EXPECT_THAT(SchemaError(R"({"type": "string", "format": "hostname"})"),
              HasSubstr("format 'hostname' is not supported"));
  EXPECT_THAT(SchemaError(R"({"$ref": "#/$defs/missing"})"), HasSubstr("does not resolve"));
  EXPECT_THAT(SchemaError(R"({"$ref": "http://x/y"})"), HasSubstr("only refs into this document"));
  EXPECT_THAT(SchemaError(R"({"type": "strin"})"), HasSubstr("unknown type 'strin'"));
  EXPECT_THAT(SchemaError(R"({"type": "string", "pattern": "(a"})"), HasSubstr("unclosed '('"));
  EXPECT_THAT(SchemaError(R"({"type": "number", "minimum": 0.5})"),
              HasSubstr("only inclusive integral minimum/maximum"));
  EXPECT_THAT(SchemaError(R"({"type": "object", "required": ["x"]})"),
              HasSubstr("required property 'x' is not in properties"));
  EXPECT_THAT(SchemaError(R"({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"})"),
              HasSubstr("can never complete"));
  EXPECT_THAT(SchemaError("false"), HasSubstr("admits no value"));
  // Hostile sizes end in errors, not in deep recursion.
  json chain = {{"$defs", json::object()}, {"$ref", "#/$defs/d0"}};
  for (int i = 0; i < 5000; ++i) {
    chain["$defs"]["d" + std::to_string(i)] = {{"$ref", "#/$defs/d" + std::to_string(i + 1)}};
  }
  chain["$defs"]["d5000"] = {{"type", "null"}};
  EXPECT_THAT(SchemaError(chain.dump()), HasSubstr("schemas nest more than 128 levels"));
  json tuple = {{"type", "array"}, {"prefixItems", json::array()}};
  for (int i = 0; i < 5000; ++i) tuple["prefixItems"].push_back({{"type", "null"}});
  EXPECT_THAT(SchemaError(tuple.dump()), HasSubstr("more than 1000 items"));
}

}  // namespace
}  // namespace deepinfer::grammar
