// Parses Jinja tokens into statements (see ast.h). Grammar and operator precedence follow
// Jinja2 / @huggingface/jinja: ternary < or < and < not < comparison/in < + - ~ < * / // % <
// is-tests < filters < unary minus < member access / call.
#ifndef TOKENIZER_JINJA_PARSER_H_
#define TOKENIZER_JINJA_PARSER_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/jinja/ast.h"

namespace deepinfer::tokenizer::jinja {

// kInvalidArgument with the offset and what was expected on a syntax error.
absl::StatusOr<StmtList> ParseTemplate(absl::string_view source);

}  // namespace deepinfer::tokenizer::jinja

#endif  // TOKENIZER_JINJA_PARSER_H_
