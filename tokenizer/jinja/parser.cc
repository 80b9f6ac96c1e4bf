#include "tokenizer/jinja/parser.h"

#include <cstdlib>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/jinja/lexer.h"

namespace deepinfer::tokenizer::jinja {
namespace {

using Type = Token::Type;

class Parser {
 public:
  // Blocks and expressions nest by recursion; bounding the depth keeps a hostile template from
  // overflowing the stack.
  static constexpr int kMaxDepth = 200;

  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<StmtList> ParseAll() {
    StmtList body;
    std::string end_tag;
    absl::Status status = ParseBody({}, &body, &end_tag);
    if (!status.ok()) return status;
    return body;
  }

 private:
  struct DepthGuard {
    explicit DepthGuard(int* depth) : depth(depth) { ++*depth; }
    ~DepthGuard() { --*depth; }
    int* depth;
  };

  // Parses statements until a {% tag %} whose name is in `stop` (consumed up to the name) or
  // the end of input (only allowed when `stop` is empty).
  absl::Status ParseBody(const std::vector<std::string>& stop, StmtList* body,
                         std::string* end_tag) {
    while (!AtEnd()) {
      const Token& token = Peek();
      if (token.type == Type::kText) {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::kText;
        stmt->text = token.text;
        ++pos_;
        body->push_back(std::move(stmt));
      } else if (token.type == Type::kOpenExpression) {
        ++pos_;
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::kOutput;
        stmt->offset = token.offset;
        auto expr = ParseExpression();
        if (!expr.ok()) return expr.status();
        stmt->expr = *std::move(expr);
        absl::Status status = Expect(Type::kCloseExpression, "}}");
        if (!status.ok()) return status;
        body->push_back(std::move(stmt));
      } else if (token.type == Type::kOpenStatement) {
        if (pos_ + 1 >= tokens_.size() || tokens_[pos_ + 1].type != Type::kName) {
          return Error("expected a statement name after {%");
        }
        const std::string& name = tokens_[pos_ + 1].text;
        for (const std::string& s : stop) {
          if (name == s) {
            pos_ += 2;
            *end_tag = name;
            return absl::OkStatus();
          }
        }
        pos_ += 2;
        auto stmt = ParseStatement(name, token.offset);
        if (!stmt.ok()) return stmt.status();
        body->push_back(*std::move(stmt));
      } else {
        return Error("unexpected token");
      }
    }
    if (!stop.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("template syntax error: missing {% ", stop.back(), " %}"));
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseStatement(const std::string& name, size_t offset) {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return Error("blocks nested too deeply");
    auto stmt = std::make_unique<Stmt>();
    stmt->offset = offset;
    std::string end_tag;
    if (name == "set") {
      stmt->kind = Stmt::Kind::kSet;
      auto target = ParseTarget();
      if (!target.ok()) return target.status();
      stmt->target = *std::move(target);
      if (IsSymbol("=")) {
        ++pos_;
        auto value = ParseExpression();
        if (!value.ok()) return value.status();
        stmt->expr = *std::move(value);
        absl::Status status = Expect(Type::kCloseStatement, "%}");
        if (!status.ok()) return status;
      } else {
        absl::Status status = Expect(Type::kCloseStatement, "%}");
        if (status.ok()) status = ParseBody({"endset"}, &stmt->body, &end_tag);
        if (status.ok()) status = Expect(Type::kCloseStatement, "%}");
        if (!status.ok()) return status;
      }
      return stmt;
    }
    if (name == "if") {
      stmt->kind = Stmt::Kind::kIf;
      while (true) {
        auto condition = ParseExpression();
        if (!condition.ok()) return condition.status();
        StmtList body;
        absl::Status status = Expect(Type::kCloseStatement, "%}");
        if (status.ok()) status = ParseBody({"elif", "else", "endif"}, &body, &end_tag);
        if (!status.ok()) return status;
        stmt->branches.emplace_back(*std::move(condition), std::move(body));
        if (end_tag == "elif") continue;
        status = Expect(Type::kCloseStatement, "%}");
        if (!status.ok()) return status;
        if (end_tag == "else") {
          status = ParseBody({"endif"}, &stmt->else_body, &end_tag);
          if (status.ok()) status = Expect(Type::kCloseStatement, "%}");
          if (!status.ok()) return status;
        }
        return stmt;
      }
    }
    if (name == "for") {
      stmt->kind = Stmt::Kind::kFor;
      do {
        if (Peek().type != Type::kName) return Error("expected a loop variable");
        stmt->targets.push_back(tokens_[pos_++].text);
      } while (IsSymbol(",") && ++pos_);
      if (!IsName("in")) return Error("expected 'in'");
      ++pos_;
      auto iterable = ParseOr();  // no ternary: a trailing "if" filters the loop
      if (!iterable.ok()) return iterable.status();
      stmt->expr = *std::move(iterable);
      if (IsName("if")) {
        ++pos_;
        auto filter = ParseExpression();
        if (!filter.ok()) return filter.status();
        stmt->filter = *std::move(filter);
      }
      absl::Status status = Expect(Type::kCloseStatement, "%}");
      if (status.ok()) status = ParseBody({"else", "endfor"}, &stmt->body, &end_tag);
      if (status.ok()) status = Expect(Type::kCloseStatement, "%}");
      if (status.ok() && end_tag == "else") {
        status = ParseBody({"endfor"}, &stmt->else_body, &end_tag);
        if (status.ok()) status = Expect(Type::kCloseStatement, "%}");
      }
      if (!status.ok()) return status;
      return stmt;
    }
    if (name == "macro") {
      stmt->kind = Stmt::Kind::kMacro;
      if (Peek().type != Type::kName) return Error("expected a macro name");
      stmt->name = tokens_[pos_++].text;
      absl::Status status = ExpectSymbol("(");
      if (!status.ok()) return status;
      while (!IsSymbol(")")) {
        if (Peek().type != Type::kName) return Error("expected a parameter name");
        std::string param = tokens_[pos_++].text;
        ExprPtr fallback;
        if (IsSymbol("=")) {
          ++pos_;
          auto value = ParseExpression();
          if (!value.ok()) return value.status();
          fallback = *std::move(value);
        }
        stmt->params.emplace_back(std::move(param), std::move(fallback));
        if (IsSymbol(",")) ++pos_;
      }
      ++pos_;
      status = Expect(Type::kCloseStatement, "%}");
      if (status.ok()) status = ParseBody({"endmacro"}, &stmt->body, &end_tag);
      if (status.ok()) status = Expect(Type::kCloseStatement, "%}");
      if (!status.ok()) return status;
      return stmt;
    }
    if (name == "break" || name == "continue") {
      stmt->kind = name == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
      absl::Status status = Expect(Type::kCloseStatement, "%}");
      if (!status.ok()) return status;
      return stmt;
    }
    pos_ -= 1;
    return Error(absl::StrCat("unknown or unexpected statement '", name, "'"));
  }

  // A set target: name, name.attr or "a, b".
  absl::StatusOr<ExprPtr> ParseTarget() {
    if (Peek().type != Type::kName) return Error("expected a name to set");
    auto target = NewExpr(Expr::Kind::kName);
    target->name = tokens_[pos_++].text;
    if (IsSymbol(".")) {
      ++pos_;
      if (Peek().type != Type::kName) return Error("expected an attribute name");
      auto member = NewExpr(Expr::Kind::kMember);
      member->object = std::move(target);
      member->name = tokens_[pos_++].text;
      return member;
    }
    if (IsSymbol(",")) {
      auto tuple = NewExpr(Expr::Kind::kTuple);
      tuple->items.push_back(std::move(target));
      while (IsSymbol(",")) {
        ++pos_;
        if (Peek().type != Type::kName) return Error("expected a name to set");
        auto name = NewExpr(Expr::Kind::kName);
        name->name = tokens_[pos_++].text;
        tuple->items.push_back(std::move(name));
      }
      return tuple;
    }
    return target;
  }

  absl::StatusOr<ExprPtr> ParseExpression() {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return Error("expression nested too deeply");
    auto value = ParseOr();
    if (!value.ok() || !IsName("if")) return value;
    ++pos_;
    auto ternary = NewExpr(Expr::Kind::kTernary);
    auto condition = ParseOr();
    if (!condition.ok()) return condition.status();
    ExprPtr otherwise;
    if (IsName("else")) {
      ++pos_;
      auto parsed = ParseExpression();
      if (!parsed.ok()) return parsed.status();
      otherwise = *std::move(parsed);
    }
    ternary->items.push_back(*std::move(value));
    ternary->items.push_back(*std::move(condition));
    ternary->items.push_back(std::move(otherwise));
    return ternary;
  }

  absl::StatusOr<ExprPtr> ParseOr() { return ParseLogical("or", &Parser::ParseAnd); }
  absl::StatusOr<ExprPtr> ParseAnd() { return ParseLogical("and", &Parser::ParseNot); }

  absl::StatusOr<ExprPtr> ParseLogical(const char* op, absl::StatusOr<ExprPtr> (Parser::*next)()) {
    auto left = (this->*next)();
    if (!left.ok()) return left;
    ExprPtr result = *std::move(left);
    while (IsName(op)) {
      ++pos_;
      auto right = (this->*next)();
      if (!right.ok()) return right;
      result = Binary(op, std::move(result), *std::move(right));
    }
    return result;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return Error("expression nested too deeply");
    if (IsName("not")) {
      ++pos_;
      auto operand = ParseNot();
      if (!operand.ok()) return operand;
      auto unary = NewExpr(Expr::Kind::kUnary);
      unary->name = "not";
      unary->object = *std::move(operand);
      return unary;
    }
    return ParseComparison();
  }

  absl::StatusOr<ExprPtr> ParseComparison() {
    auto left = ParseAdditive();
    if (!left.ok()) return left;
    ExprPtr result = *std::move(left);
    while (true) {
      std::string op;
      if (Peek().type == Type::kSymbol &&
          (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" || Peek().text == ">" ||
           Peek().text == "<=" || Peek().text == ">=")) {
        op = tokens_[pos_++].text;
      } else if (IsName("in")) {
        op = "in";
        ++pos_;
      } else if (IsName("not") && pos_ + 1 < tokens_.size() &&
                 tokens_[pos_ + 1].type == Type::kName && tokens_[pos_ + 1].text == "in") {
        op = "not in";
        pos_ += 2;
      } else {
        return result;
      }
      auto right = ParseAdditive();
      if (!right.ok()) return right;
      result = Binary(op, std::move(result), *std::move(right));
    }
  }

  absl::StatusOr<ExprPtr> ParseAdditive() {
    auto left = ParseMultiplicative();
    if (!left.ok()) return left;
    ExprPtr result = *std::move(left);
    while (IsSymbol("+") || IsSymbol("-") || IsSymbol("~")) {
      const std::string op = tokens_[pos_++].text;
      auto right = ParseMultiplicative();
      if (!right.ok()) return right;
      result = Binary(op, std::move(result), *std::move(right));
    }
    return result;
  }

  absl::StatusOr<ExprPtr> ParseMultiplicative() {
    auto left = ParsePower();
    if (!left.ok()) return left;
    ExprPtr result = *std::move(left);
    while (IsSymbol("*") || IsSymbol("/") || IsSymbol("//") || IsSymbol("%")) {
      const std::string op = tokens_[pos_++].text;
      auto right = ParsePower();
      if (!right.ok()) return right;
      result = Binary(op, std::move(result), *std::move(right));
    }
    return result;
  }

  absl::StatusOr<ExprPtr> ParsePower() {
    auto left = ParseTest();
    if (!left.ok()) return left;
    ExprPtr result = *std::move(left);
    while (IsSymbol("**")) {
      ++pos_;
      auto right = ParseTest();
      if (!right.ok()) return right;
      result = Binary("**", std::move(result), *std::move(right));
    }
    return result;
  }

  absl::StatusOr<ExprPtr> ParseTest() {
    auto operand = ParseFilter();
    if (!operand.ok()) return operand;
    ExprPtr result = *std::move(operand);
    while (IsName("is")) {
      ++pos_;
      auto test = NewExpr(Expr::Kind::kTest);
      if (IsName("not")) {
        test->negated = true;
        ++pos_;
      }
      if (Peek().type != Type::kName) return Error("expected a test name after 'is'");
      test->name = tokens_[pos_++].text;
      test->object = std::move(result);
      if (IsSymbol("(")) {
        absl::Status status = ParseArguments(test.get());
        if (!status.ok()) return status;
      } else if (Peek().type == Type::kString || Peek().type == Type::kInteger ||
                 Peek().type == Type::kFloat) {
        auto argument = ParsePrimary();  // "is equalto 3", "is divisibleby 2"
        if (!argument.ok()) return argument;
        test->items.push_back(*std::move(argument));
      }
      result = std::move(test);
    }
    return result;
  }

  absl::StatusOr<ExprPtr> ParseFilter() {
    auto operand = ParseUnary();
    if (!operand.ok()) return operand;
    ExprPtr result = *std::move(operand);
    while (IsSymbol("|")) {
      ++pos_;
      if (Peek().type != Type::kName) return Error("expected a filter name after '|'");
      auto filter = NewExpr(Expr::Kind::kFilter);
      filter->name = tokens_[pos_++].text;
      filter->object = std::move(result);
      if (IsSymbol("(")) {
        absl::Status status = ParseArguments(filter.get());
        if (!status.ok()) return status;
      }
      result = std::move(filter);
    }
    return result;
  }

  absl::StatusOr<ExprPtr> ParseUnary() {
    DepthGuard guard(&depth_);
    if (depth_ > kMaxDepth) return Error("expression nested too deeply");
    if (IsSymbol("-") || IsSymbol("+")) {
      const std::string op = tokens_[pos_++].text;
      auto operand = ParseUnary();
      if (!operand.ok()) return operand;
      auto unary = NewExpr(Expr::Kind::kUnary);
      unary->name = op;
      unary->object = *std::move(operand);
      return unary;
    }
    return ParsePostfix();
  }

  absl::StatusOr<ExprPtr> ParsePostfix() {
    auto primary = ParsePrimary();
    if (!primary.ok()) return primary;
    ExprPtr result = *std::move(primary);
    while (true) {
      if (IsSymbol(".")) {
        ++pos_;
        if (Peek().type != Type::kName && Peek().type != Type::kInteger) {
          return Error("expected an attribute name after '.'");
        }
        auto member = NewExpr(Expr::Kind::kMember);
        member->name = tokens_[pos_++].text;
        member->object = std::move(result);
        result = std::move(member);
      } else if (IsSymbol("[")) {
        ++pos_;
        std::vector<ExprPtr> parts(1);
        bool slice = false;
        while (!IsSymbol("]")) {
          if (IsSymbol(":")) {
            slice = true;
            ++pos_;
            parts.emplace_back();
            continue;
          }
          auto part = ParseExpression();
          if (!part.ok()) return part;
          parts.back() = *std::move(part);
        }
        ++pos_;
        if (slice) {
          parts.resize(3);
          auto node = NewExpr(Expr::Kind::kSlice);
          node->items = std::move(parts);
          node->object = std::move(result);
          result = std::move(node);
        } else {
          if (parts[0] == nullptr) return Error("empty subscript");
          auto member = NewExpr(Expr::Kind::kMember);
          member->items.push_back(std::move(parts[0]));
          member->object = std::move(result);
          result = std::move(member);
        }
      } else if (IsSymbol("(")) {
        auto call = NewExpr(Expr::Kind::kCall);
        call->object = std::move(result);
        absl::Status status = ParseArguments(call.get());
        if (!status.ok()) return status;
        result = std::move(call);
      } else {
        return result;
      }
    }
  }

  // "(a, b, k=v)" into expr->items / expr->keywords.
  absl::Status ParseArguments(Expr* expr) {
    absl::Status status = ExpectSymbol("(");
    if (!status.ok()) return status;
    while (!IsSymbol(")")) {
      if (Peek().type == Type::kName && pos_ + 1 < tokens_.size() &&
          tokens_[pos_ + 1].type == Type::kSymbol && tokens_[pos_ + 1].text == "=") {
        std::string key = tokens_[pos_].text;
        pos_ += 2;
        auto value = ParseExpression();
        if (!value.ok()) return value.status();
        expr->keywords.emplace_back(std::move(key), *std::move(value));
      } else {
        auto value = ParseExpression();
        if (!value.ok()) return value.status();
        expr->items.push_back(*std::move(value));
      }
      if (IsSymbol(",")) {
        ++pos_;
      } else if (!IsSymbol(")")) {
        return Error("expected ',' or ')' in argument list");
      }
    }
    ++pos_;
    return absl::OkStatus();
  }

  absl::StatusOr<ExprPtr> ParsePrimary() {
    if (AtEnd()) return Error("unexpected end of template");
    const Token& token = tokens_[pos_];
    switch (token.type) {
      case Type::kInteger: {
        ++pos_;
        return Literal(Value::Int(std::strtoll(token.text.c_str(), nullptr, 10)));
      }
      case Type::kFloat: {
        ++pos_;
        return Literal(Value::Float(std::strtod(token.text.c_str(), nullptr)));
      }
      case Type::kString: {
        // Adjacent string literals concatenate.
        std::string text;
        while (Peek().type == Type::kString) text += tokens_[pos_++].text;
        return Literal(Value::String(std::move(text)));
      }
      case Type::kName: {
        ++pos_;
        if (token.text == "true" || token.text == "True") return Literal(Value::Bool(true));
        if (token.text == "false" || token.text == "False") return Literal(Value::Bool(false));
        if (token.text == "none" || token.text == "None") return Literal(Value::None());
        auto name = NewExpr(Expr::Kind::kName);
        name->name = token.text;
        return name;
      }
      case Type::kSymbol: {
        if (token.text == "(") {
          ++pos_;
          auto first = ParseExpression();
          if (!first.ok()) return first;
          if (IsSymbol(")")) {
            ++pos_;
            return first;
          }
          auto tuple = NewExpr(Expr::Kind::kTuple);
          tuple->items.push_back(*std::move(first));
          while (IsSymbol(",")) {
            ++pos_;
            if (IsSymbol(")")) break;
            auto item = ParseExpression();
            if (!item.ok()) return item;
            tuple->items.push_back(*std::move(item));
          }
          absl::Status status = ExpectSymbol(")");
          if (!status.ok()) return status;
          return tuple;
        }
        if (token.text == "[") {
          ++pos_;
          auto list = NewExpr(Expr::Kind::kList);
          while (!IsSymbol("]")) {
            auto item = ParseExpression();
            if (!item.ok()) return item;
            list->items.push_back(*std::move(item));
            if (IsSymbol(",")) {
              ++pos_;
            } else if (!IsSymbol("]")) {
              return Error("expected ',' or ']' in list");
            }
          }
          ++pos_;
          return list;
        }
        if (token.text == "{") {
          ++pos_;
          auto dict = NewExpr(Expr::Kind::kDict);
          while (!IsSymbol("}")) {
            auto key = ParseExpression();
            if (!key.ok()) return key;
            absl::Status status = ExpectSymbol(":");
            if (!status.ok()) return status;
            auto value = ParseExpression();
            if (!value.ok()) return value;
            dict->keys.push_back(*std::move(key));
            dict->items.push_back(*std::move(value));
            if (IsSymbol(",")) {
              ++pos_;
            } else if (!IsSymbol("}")) {
              return Error("expected ',' or '}' in dict");
            }
          }
          ++pos_;
          return dict;
        }
        break;
      }
      default:
        break;
    }
    return Error("unexpected token in expression");
  }

  ExprPtr NewExpr(Expr::Kind kind) {
    auto expr = std::make_unique<Expr>();
    expr->kind = kind;
    expr->offset = AtEnd() ? 0 : tokens_[pos_].offset;
    return expr;
  }
  ExprPtr Literal(Value value) {
    auto expr = NewExpr(Expr::Kind::kLiteral);
    expr->value = std::move(value);
    return expr;
  }
  ExprPtr Binary(const std::string& op, ExprPtr left, ExprPtr right) {
    auto expr = NewExpr(Expr::Kind::kBinary);
    expr->name = op;
    expr->left = std::move(left);
    expr->right = std::move(right);
    return expr;
  }

  bool AtEnd() const { return pos_ >= tokens_.size(); }
  const Token& Peek() const {
    static const Token* end = new Token{Type::kText, "", 0};
    return AtEnd() ? *end : tokens_[pos_];
  }
  bool IsSymbol(const char* text) const {
    return !AtEnd() && tokens_[pos_].type == Type::kSymbol && tokens_[pos_].text == text;
  }
  bool IsName(const char* text) const {
    return !AtEnd() && tokens_[pos_].type == Type::kName && tokens_[pos_].text == text;
  }
  absl::Status Expect(Type type, const char* what) {
    if (AtEnd() || tokens_[pos_].type != type) return Error(absl::StrCat("expected '", what, "'"));
    ++pos_;
    return absl::OkStatus();
  }
  absl::Status ExpectSymbol(const char* text) {
    if (!IsSymbol(text)) return Error(absl::StrCat("expected '", text, "'"));
    ++pos_;
    return absl::OkStatus();
  }
  absl::Status Error(const std::string& what) const {
    if (AtEnd())
      return absl::InvalidArgumentError(
          absl::StrCat("template syntax error: ", what, " at end of template"));
    return absl::InvalidArgumentError(absl::StrCat("template syntax error at offset ",
                                                   tokens_[pos_].offset, " near '",
                                                   tokens_[pos_].text, "': ", what));
  }

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<StmtList> ParseTemplate(absl::string_view source) {
  auto tokens = Tokenize(source);
  if (!tokens.ok()) return tokens.status();
  Parser parser(*std::move(tokens));
  return parser.ParseAll();
}

}  // namespace deepinfer::tokenizer::jinja
