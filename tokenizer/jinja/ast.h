// Syntax tree of a parsed Jinja template: expressions (Expr) and statements (Stmt).
#ifndef TOKENIZER_JINJA_AST_H_
#define TOKENIZER_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/value.h"

namespace deepinfer::tokenizer::jinja {

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtList = std::vector<std::unique_ptr<Stmt>>;

struct Expr {
  enum class Kind {
    kLiteral,  // value
    kName,     // name
    kList,     // items
    kTuple,    // items
    kDict,     // keys / items pairwise
    kMember,   // object.name (name) or object[index] (items[0])
    kSlice,    // object[a:b:c]: items = {a, b, c} (null = absent)
    kCall,     // callee(items..., keyword_names=keyword_values)
    kFilter,   // object | name(args)
    kTest,     // object is [not] name(args)
    kUnary,    // op operand
    kBinary,   // left op right
    kTernary,  // items = {then, condition, else (may be null)}
  };
  Kind kind;
  size_t offset = 0;
  Value value;
  std::string name;  // identifier, member, filter/test name, or operator
  bool negated = false;
  ExprPtr object, left, right;
  std::vector<ExprPtr> items;
  std::vector<ExprPtr> keys;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
};

struct Stmt {
  enum class Kind {
    kText,    // text
    kOutput,  // {{ expr }}
    kSet,     // {% set target = expr %} or block set (body)
    kIf,      // branches: condition + body, else_body
    kFor,     // {% for targets in expr [if filter] %} body [else else_body]
    kMacro,   // {% macro name(params) %} body
    kBreak,
    kContinue,
  };
  Kind kind;
  size_t offset = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr target;                                      // kSet: a name, member or tuple
  std::vector<std::string> targets;                    // kFor loop variables
  ExprPtr filter;                                      // kFor: optional "if" filter
  std::vector<std::pair<ExprPtr, StmtList>> branches;  // kIf
  StmtList body, else_body;
  std::string name;                                     // kMacro
  std::vector<std::pair<std::string, ExprPtr>> params;  // kMacro, default may be null
};

}  // namespace deepinfer::tokenizer::jinja

#endif  // TOKENIZER_JINJA_AST_H_
