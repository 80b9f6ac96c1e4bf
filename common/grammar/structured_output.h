// StructuredOutput: what a request asks its output to match (one of JSON object, JSON Schema,
// regex, choice, EBNF grammar), the form both daemons share: the coordinator parses it from a
// request line and compiles it once to reject what does not compile; a worker compiles it again
// for the request's matcher.
#ifndef DEEPINFER_COMMON_GRAMMAR_STRUCTURED_OUTPUT_H_
#define DEEPINFER_COMMON_GRAMMAR_STRUCTURED_OUTPUT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar.h"

namespace deepinfer::grammar {

struct StructuredOutput {
  enum class Kind { kNone, kJsonObject, kJsonSchema, kRegex, kChoice, kGrammar };
  Kind kind = Kind::kNone;
  // kJsonSchema: the schema as JSON text; kRegex: the pattern; kGrammar: the EBNF text.
  std::string text;
  std::vector<std::string> choices;  // kChoice
};

// The grammar of exactly the strings in `choices` (at least one).
Grammar ChoiceGrammar(const std::vector<std::string>& choices);

// INVALID_ARGUMENT naming the problem: a schema, pattern or grammar that does not parse or
// compile, an empty choice list, kind kNone.
absl::StatusOr<Grammar> BuildGrammar(const StructuredOutput& spec);
absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompileStructuredOutput(
    const StructuredOutput& spec);

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_STRUCTURED_OUTPUT_H_
