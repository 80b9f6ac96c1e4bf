// Regular expressions as grammar expressions: the subset structured-output users write
// (vLLM's `regex`, JSON Schema `pattern`, Lark /.../ terminals). Supported: literals, `.`,
// classes `[...]` with ranges, negation and \d \w \s (and their negations), escapes (\n \t \r
// \f \v \0 \xHH \uHHHH \u{H...} and escaped punctuation), groups `(...)`, `(?:...)`, named
// groups, alternation, quantifiers * + ? {m} {m,} {m,n} (lazy forms match the same strings).
// The pattern must match the whole text: `^` at the start and `$` at the end are accepted and
// change nothing. Backreferences, lookaround, word boundaries, inline flags and anchors
// elsewhere are errors naming the construct.
#ifndef DEEPINFER_COMMON_GRAMMAR_REGEX_PARSER_H_
#define DEEPINFER_COMMON_GRAMMAR_REGEX_PARSER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grammar/grammar.h"

namespace deepinfer::grammar {

enum class RegexTarget {
  kText,        // the expression matches the text itself
  kJsonString,  // it matches the inside of a JSON string whose decoded value the regex matches
};

// Adds the expression for `pattern` to `grammar`; INVALID_ARGUMENT naming the problem and its
// offset otherwise.
absl::StatusOr<int32_t> AddRegex(Grammar* grammar, absl::string_view pattern,
                                 RegexTarget target = RegexTarget::kText);

// A grammar whose root is `pattern`.
absl::StatusOr<Grammar> RegexGrammar(absl::string_view pattern);

// Parses a character class starting at text[*pos] == '[' (shared with the EBNF front end);
// on success *pos is just past the closing ']'.
absl::StatusOr<CodepointRanges> ParseCharClass(absl::string_view text, size_t* pos);

// Decodes one UTF-8 code point at text[*pos] and advances; U+FFFD for invalid bytes.
uint32_t NextCodepoint(absl::string_view text, size_t* pos);

// The UTF-8 encoding of `cp`.
std::string EncodeCodepoint(uint32_t cp);

// An expression matching the JSON string encodings of the code points in `ranges`: the
// character itself where JSON allows it raw, its escape otherwise (\" \\ \n \t \r \b \f,
// \u00XX for other control characters).
int32_t JsonStringChars(Grammar* grammar, const CodepointRanges& ranges);

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_REGEX_PARSER_H_
