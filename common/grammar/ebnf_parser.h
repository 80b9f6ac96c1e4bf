// EBNF grammars as vLLM users write them: GBNF (llama.cpp, XGrammar) and the Lark subset that
// maps onto it.
//
//   root   ::= object | "null"          # a rule: name ::= expression (Lark: name: expression)
//   object ::= "{" ws (pair ("," ws pair)*)? "}"
//   ws     ::= [ \t\n]*
//
// Expressions: sequences, alternation `|`, groups `( )`, `?`, `*`, `+`, `{m}`, `{m,}`,
// `{m,n}`, string literals "..." or '...' (escapes \n \t \r \\ \" \' \xHH \uHHHH
// \UHHHHHHHH), character classes [a-z0-9_] / [^"\\], regex terminals /.../ (regex_parser.h),
// comments from # or // to the end of the line. A rule may span lines; the next rule starts
// where a name is followed by ::= or :. The start rule is `root`, else `start` (Lark). Lark's
// ?rule and !rule prefixes are accepted; %import, %ignore and other directives are errors.
#ifndef DEEPINFER_COMMON_GRAMMAR_EBNF_PARSER_H_
#define DEEPINFER_COMMON_GRAMMAR_EBNF_PARSER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/grammar/grammar.h"

namespace deepinfer::grammar {

// INVALID_ARGUMENT naming the problem and its line otherwise.
absl::StatusOr<Grammar> ParseEbnf(absl::string_view text);

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_EBNF_PARSER_H_
