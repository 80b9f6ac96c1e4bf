#include "coordinator/batch/structured_output_fields.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::ordered_json;

absl::Status Parse(const std::string& body, StructuredOutputSpec* spec) {
  return ParseStructuredOutput(json::parse(body), spec);
}

std::string ErrorOf(const std::string& body) {
  StructuredOutputSpec spec;
  absl::Status s = Parse(body, &spec);
  return s.ok() ? "" : std::string(s.message());
}

TEST(StructuredOutputFieldsTest, EachFieldGivesItsSpec) {
  struct Case {
    const char* body;
    StructuredOutputSpec::Kind kind;
    const char* text;
  };
  const Case cases[] = {
      {R"({"response_format": {"type": "json_object"}})", StructuredOutputSpec::JSON_OBJECT, ""},
      {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema":
           {"type": "integer"}}}})",
       StructuredOutputSpec::JSON_SCHEMA, R"({"type":"integer"})"},
      {R"({"structured_outputs": {"json": "{\"type\": \"string\"}"}})",
       StructuredOutputSpec::JSON_SCHEMA, R"({"type":"string"})"},
      {R"({"structured_outputs": {"regex": "[0-9]+"}})", StructuredOutputSpec::REGEX, "[0-9]+"},
      {R"({"structured_outputs": {"grammar": "root ::= \"a\""}})", StructuredOutputSpec::GRAMMAR,
       "root ::= \"a\""},
      {R"({"structured_outputs": {"json_object": true}})", StructuredOutputSpec::JSON_OBJECT, ""},
      {R"({"guided_json": {"type": "boolean"}})", StructuredOutputSpec::JSON_SCHEMA,
       R"({"type":"boolean"})"},
      {R"({"guided_regex": "a|b"})", StructuredOutputSpec::REGEX, "a|b"},
      {R"({"guided_grammar": "start: \"x\""})", StructuredOutputSpec::GRAMMAR, "start: \"x\""},
      {R"({"response_format": {"type": "text"}, "guided_regex": "a"})", StructuredOutputSpec::REGEX,
       "a"},
  };
  for (const Case& c : cases) {
    StructuredOutputSpec spec;
    ASSERT_TRUE(Parse(c.body, &spec).ok()) << c.body << ": " << Parse(c.body, &spec);
    EXPECT_EQ(spec.kind(), c.kind) << c.body;
    EXPECT_EQ(spec.text(), c.text) << c.body;
  }
  StructuredOutputSpec spec;
  ASSERT_TRUE(Parse(R"({"guided_choice": ["a", "bc"]})", &spec).ok());
  EXPECT_EQ(spec.kind(), StructuredOutputSpec::CHOICE);
  EXPECT_THAT(spec.choices(), ElementsAre("a", "bc"));
  StructuredOutputSpec none;
  ASSERT_TRUE(Parse(R"({"response_format": {"type": "text"}, "guided_json": null})", &none).ok());
  EXPECT_EQ(none.kind(), StructuredOutputSpec::KIND_UNSPECIFIED);
}

TEST(StructuredOutputFieldsTest, ErrorsNameTheField) {
  EXPECT_EQ(ErrorOf(R"({"response_format": {"type": "xml"}})"),
            "body.response_format.type: must be \"text\", \"json_object\" or \"json_schema\", got "
            "\"xml\"");
  EXPECT_EQ(
      ErrorOf(R"({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})"),
      "body.response_format.json_schema.name: is missing");
  EXPECT_EQ(
      ErrorOf(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}})"),
      "body.response_format.json_schema.schema: is missing");
  EXPECT_EQ(ErrorOf(R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x",
                        "schema": {"type": "string", "format": "ipv4"}}}})"),
            "body.response_format: json schema: format 'ipv4' is not supported (at '/format')");
  EXPECT_EQ(ErrorOf(R"({"structured_outputs": {"regex": "a", "choice": ["b"]}})"),
            "body.structured_outputs: must set exactly one of json, regex, choice, grammar, "
            "json_object; got regex, choice");
  EXPECT_THAT(ErrorOf(R"({"structured_outputs": {"structural_tag": "x"}})"),
              HasSubstr("field 'structural_tag' is not supported"));
  EXPECT_EQ(ErrorOf(R"({"guided_choice": []})"),
            "body.guided_choice: must be a non-empty list of strings, got a list");
  EXPECT_EQ(ErrorOf(R"({"guided_grammar": "root ::= missing"})"),
            "body.guided_grammar: grammar: rule 'missing' is referenced but never defined");
  EXPECT_EQ(ErrorOf(R"({"guided_regex": "a", "structured_outputs": {"regex": "b"}})"),
            "body.structured_outputs and body.guided_regex both ask for structured output; set "
            "only one");
  EXPECT_EQ(ErrorOf(R"({"guided_json": "not json"})"),
            "body.guided_json: the string is not a JSON schema (a JSON object)");
}

}  // namespace
}  // namespace deepinfer
