#include "coordinator/batch/structured_output_fields.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grammar/structured_output_proto.h"

namespace deepinfer {
namespace {

using json = nlohmann::ordered_json;

std::string Describe(const json& v) {
  switch (v.type()) {
    case json::value_t::object:
      return "an object";
    case json::value_t::array:
      return "a list";
    case json::value_t::string:
      return "a string";
    case json::value_t::boolean:
      return v.get<bool>() ? "true" : "false";
    case json::value_t::null:
      return "null";
    default:
      return "a number";
  }
}

absl::Status FieldError(absl::string_view field, absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("body.", field, ": ", message));
}

// A schema given as an object, a boolean, or a string holding JSON (vLLM accepts both).
absl::Status SchemaText(const json& v, absl::string_view field, std::string* out) {
  if (v.is_object() || v.is_boolean()) {
    *out = v.dump();
    return absl::OkStatus();
  }
  if (v.is_string()) {
    json parsed = json::parse(v.get<std::string>(), nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded() || !(parsed.is_object() || parsed.is_boolean())) {
      return FieldError(field, "the string is not a JSON schema (a JSON object)");
    }
    *out = parsed.dump();
    return absl::OkStatus();
  }
  return FieldError(field, absl::StrCat("must be a JSON schema (an object), got ", Describe(v)));
}

absl::Status Choices(const json& v, absl::string_view field, StructuredOutputSpec* spec) {
  if (!v.is_array() || v.empty()) {
    return FieldError(field,
                      absl::StrCat("must be a non-empty list of strings, got ", Describe(v)));
  }
  for (const json& c : v) {
    if (!c.is_string() || c.get_ref<const std::string&>().empty()) {
      return FieldError(field, "must hold non-empty strings only");
    }
    spec->add_choices(c.get<std::string>());
  }
  spec->set_kind(StructuredOutputSpec::CHOICE);
  return absl::OkStatus();
}

absl::Status Text(const json& v, absl::string_view field, StructuredOutputSpec::Kind kind,
                  StructuredOutputSpec* spec) {
  if (!v.is_string()) return FieldError(field, absl::StrCat("must be a string, got ", Describe(v)));
  spec->set_kind(kind);
  spec->set_text(v.get<std::string>());
  return absl::OkStatus();
}

absl::Status ResponseFormat(const json& v, StructuredOutputSpec* spec) {
  if (!v.is_object()) {
    return FieldError("response_format", absl::StrCat("must be an object, got ", Describe(v)));
  }
  for (auto it = v.begin(); it != v.end(); ++it) {
    if (it.key() != "type" && it.key() != "json_schema") {
      return FieldError("response_format", absl::StrCat("unknown field '", it.key(), "'"));
    }
  }
  auto type = v.find("type");
  if (type == v.end() || !type->is_string()) {
    return FieldError("response_format.type",
                      "must be \"text\", \"json_object\" or \"json_schema\"");
  }
  const std::string& t = type->get_ref<const std::string&>();
  if (t != "json_schema" && v.contains("json_schema")) {
    return FieldError("response_format.json_schema", "is only read with type \"json_schema\"");
  }
  if (t == "text") return absl::OkStatus();
  if (t == "json_object") {
    spec->set_kind(StructuredOutputSpec::JSON_OBJECT);
    return absl::OkStatus();
  }
  if (t != "json_schema") {
    return FieldError(
        "response_format.type",
        absl::StrCat("must be \"text\", \"json_object\" or \"json_schema\", got \"", t, "\""));
  }
  auto js = v.find("json_schema");
  if (js == v.end() || !js->is_object()) {
    return FieldError("response_format.json_schema", "must be an object with name and schema");
  }
  for (auto it = js->begin(); it != js->end(); ++it) {
    const std::string& k = it.key();
    if (k == "name" || k == "description") {
      if (!it->is_string()) {
        return FieldError(absl::StrCat("response_format.json_schema.", k), "must be a string");
      }
    } else if (k == "strict") {
      // The output always matches the schema; strict asks for nothing more here.
      if (!it->is_boolean() && !it->is_null()) {
        return FieldError("response_format.json_schema.strict", "must be true or false");
      }
    } else if (k != "schema") {
      return FieldError("response_format.json_schema", absl::StrCat("unknown field '", k, "'"));
    }
  }
  if (!js->contains("name")) return FieldError("response_format.json_schema.name", "is missing");
  auto schema = js->find("schema");
  if (schema == js->end()) {
    return FieldError("response_format.json_schema.schema", "is missing");
  }
  std::string text;
  if (absl::Status s = SchemaText(*schema, "response_format.json_schema.schema", &text); !s.ok()) {
    return s;
  }
  spec->set_kind(StructuredOutputSpec::JSON_SCHEMA);
  spec->set_text(text);
  return absl::OkStatus();
}

absl::Status StructuredOutputs(const json& v, StructuredOutputSpec* spec) {
  if (!v.is_object()) {
    return FieldError("structured_outputs", absl::StrCat("must be an object, got ", Describe(v)));
  }
  std::vector<std::string> set;
  for (auto it = v.begin(); it != v.end(); ++it) {
    const std::string& k = it.key();
    if (k != "json" && k != "regex" && k != "choice" && k != "grammar" && k != "json_object") {
      return FieldError("structured_outputs",
                        absl::StrCat("field '", k,
                                     "' is not supported (json, regex, choice, "
                                     "grammar and json_object are)"));
    }
    if (!it->is_null() && !(k == "json_object" && *it == false)) set.push_back(k);
  }
  if (set.size() != 1) {
    return FieldError("structured_outputs",
                      absl::StrCat("must set exactly one of json, regex, choice, grammar, "
                                   "json_object; got ",
                                   set.empty() ? "none" : absl::StrJoin(set, ", ")));
  }
  const std::string& k = set[0];
  const json& x = v[k];
  const std::string field = absl::StrCat("structured_outputs.", k);
  if (k == "json") {
    std::string text;
    if (absl::Status s = SchemaText(x, field, &text); !s.ok()) return s;
    spec->set_kind(StructuredOutputSpec::JSON_SCHEMA);
    spec->set_text(text);
    return absl::OkStatus();
  }
  if (k == "regex") return Text(x, field, StructuredOutputSpec::REGEX, spec);
  if (k == "grammar") return Text(x, field, StructuredOutputSpec::GRAMMAR, spec);
  if (k == "choice") return Choices(x, field, spec);
  if (x != true) return FieldError(field, "must be true");
  spec->set_kind(StructuredOutputSpec::JSON_OBJECT);
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseStructuredOutput(const json& body, StructuredOutputSpec* spec) {
  std::vector<std::string> asking;
  for (const char* field : kStructuredOutputFields) {
    auto it = body.find(field);
    if (it == body.end() || it->is_null()) continue;
    StructuredOutputSpec one;
    absl::Status s;
    const std::string name = field;
    if (name == "response_format") {
      s = ResponseFormat(*it, &one);
    } else if (name == "structured_outputs") {
      s = StructuredOutputs(*it, &one);
    } else if (name == "guided_json") {
      std::string text;
      s = SchemaText(*it, name, &text);
      one.set_kind(StructuredOutputSpec::JSON_SCHEMA);
      one.set_text(text);
    } else if (name == "guided_regex") {
      s = Text(*it, name, StructuredOutputSpec::REGEX, &one);
    } else if (name == "guided_grammar") {
      s = Text(*it, name, StructuredOutputSpec::GRAMMAR, &one);
    } else {
      s = Choices(*it, name, &one);
    }
    if (!s.ok()) return s;
    if (one.kind() == StructuredOutputSpec::KIND_UNSPECIFIED) continue;
    asking.push_back(name);
    if (asking.size() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("body.", asking[0], " and body.", asking[1],
                       " both ask for structured output; set only one"));
    }
    *spec = std::move(one);
    absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> compiled =
        grammar::CompileStructuredOutput(grammar::FromProto(*spec));
    if (!compiled.ok()) return FieldError(name, compiled.status().message());
  }
  return absl::OkStatus();
}

}  // namespace deepinfer
