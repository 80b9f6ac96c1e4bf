#include "common/grammar/structured_output.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/grammar/ebnf_parser.h"
#include "common/grammar/json_schema_grammar.h"
#include "common/grammar/regex_parser.h"
#include "nlohmann/json.hpp"

namespace deepinfer::grammar {

Grammar ChoiceGrammar(const std::vector<std::string>& choices) {
  Grammar g;
  std::vector<int32_t> alts;
  for (const std::string& c : choices) alts.push_back(g.Bytes(c));
  const int32_t root = g.Rule("root");
  g.SetBody(root, alts.empty() ? g.CharClass({}) : g.Alternation(std::move(alts)));
  g.SetRoot(root);
  return g;
}

absl::StatusOr<Grammar> BuildGrammar(const StructuredOutput& spec) {
  switch (spec.kind) {
    case StructuredOutput::Kind::kNone:
      return absl::InvalidArgumentError("no structured output was asked for");
    case StructuredOutput::Kind::kJsonObject:
      return JsonObjectGrammar();
    case StructuredOutput::Kind::kJsonSchema: {
      nlohmann::ordered_json schema =
          nlohmann::ordered_json::parse(spec.text, nullptr, /*allow_exceptions=*/false);
      if (schema.is_discarded()) return absl::InvalidArgumentError("json schema: not valid JSON");
      return JsonSchemaGrammar(schema);
    }
    case StructuredOutput::Kind::kRegex:
      return RegexGrammar(spec.text);
    case StructuredOutput::Kind::kChoice:
      if (spec.choices.empty()) return absl::InvalidArgumentError("choice: the list is empty");
      for (const std::string& c : spec.choices) {
        if (c.empty()) return absl::InvalidArgumentError("choice: an empty string is not a choice");
      }
      return ChoiceGrammar(spec.choices);
    case StructuredOutput::Kind::kGrammar:
      return ParseEbnf(spec.text);
  }
  return absl::InvalidArgumentError("unknown structured output kind");
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileStructuredOutput(
    const StructuredOutput& spec) {
  absl::StatusOr<Grammar> g = BuildGrammar(spec);
  if (!g.ok()) return g.status();
  return CompiledGrammar::Compile(*g);
}

}  // namespace deepinfer::grammar
