// Splits a Jinja template into tokens: literal text and the tokens inside {{ }} / {% %}.
// Applies what transformers configures (trim_blocks, lstrip_blocks, no trailing newline) and
// the whitespace-control markers {%- -%} {{- -}} {#- -#}, the way @huggingface/jinja does.
#ifndef TOKENIZER_JINJA_LEXER_H_
#define TOKENIZER_JINJA_LEXER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer::tokenizer::jinja {

struct Token {
  enum class Type {
    kText,
    kOpenStatement,    // {%
    kCloseStatement,   // %}
    kOpenExpression,   // {{
    kCloseExpression,  // }}
    kName,
    kInteger,
    kFloat,
    kString,
    kSymbol,  // operators and punctuation
  };
  Type type;
  std::string text;  // for kString: the unescaped value
  size_t offset;     // in the preprocessed template, for error messages
};

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view source);

}  // namespace deepinfer::tokenizer::jinja

#endif  // TOKENIZER_JINJA_LEXER_H_
