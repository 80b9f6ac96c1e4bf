// A parsed Jinja template and its interpreter: statements (set, if/elif/else, for with loop
// variables and else, macros, break/continue), expressions, filters, tests, string / dict
// methods and the globals chat templates use (namespace, range, raise_exception). Rendering
// aims to produce exactly what @huggingface/jinja produces.
#ifndef TOKENIZER_JINJA_TEMPLATE_H_
#define TOKENIZER_JINJA_TEMPLATE_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tokenizer/jinja/ast.h"
#include "tokenizer/jinja/value.h"

namespace deepinfer::tokenizer::jinja {

class Template {
 public:
  // kInvalidArgument on a syntax error.
  static absl::StatusOr<std::unique_ptr<Template>> Parse(absl::string_view source);

  // Renders with `context` (an object: name -> value). Errors: kInvalidArgument for type errors
  // and unknown filters/tests/methods, kAborted for raise_exception (message = its argument).
  absl::StatusOr<std::string> Render(const Value& context) const;

  // The parsed statements, for callers that inspect what a template does.
  const StmtList& body() const { return body_; }

 private:
  explicit Template(StmtList body) : body_(std::move(body)) {}
  StmtList body_;
};

}  // namespace deepinfer::tokenizer::jinja

#endif  // TOKENIZER_JINJA_TEMPLATE_H_
