// The template interpreter: every statement and expression kind, and the filters and tests
// that HF chat templates use, evaluated over Value. Over 800 lines because the evaluator's
// node kinds, filters and tests share the Context and Value helpers defined only in this
// file; splitting it by node family would first have to export those helpers.
#include "tokenizer/jinja/template.h"

#include <locale.h>
#include <wctype.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "tokenizer/jinja/parser.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer::jinja {
namespace {

// Variables of one frame; frames chain to the enclosing one (for-loops and macro calls open
// frames, as in Jinja, so a plain "set" inside a loop does not leak out of it).
class Scope {
 public:
  explicit Scope(std::shared_ptr<Scope> parent) : parent_(std::move(parent)) {}
  const Value* Lookup(const std::string& name) const {
    for (const Scope* scope = this; scope != nullptr; scope = scope->parent_.get()) {
      auto it = scope->variables_.find(name);
      if (it != scope->variables_.end()) return &it->second;
    }
    return nullptr;
  }
  void Set(const std::string& name, Value value) { variables_[name] = std::move(value); }

 private:
  std::shared_ptr<Scope> parent_;
  absl::flat_hash_map<std::string, Value> variables_;
};

enum class Flow { kNormal, kBreak, kContinue };

absl::Status TypeError(const std::string& what) { return absl::InvalidArgumentError(what); }

bool IsWhitespace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

// JavaScript's String.prototype.trim whitespace (what @huggingface/jinja's trim/strip use).
bool IsJsWhitespace(char32_t c) { return c == 0xFEFF || (c != 0x85 && IsUnicodeWhitespace(c)); }

// trim / strip / lstrip / rstrip. @huggingface/jinja ignores a "chars" argument of strip().
std::string Strip(const std::string& s, bool left, bool right) {
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t n = ValidUtf8SequenceLength(s, begin);
      if (n == 0 || !IsJsWhitespace(DecodeCodePoint(s, begin, &n))) break;
      begin += n;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
      size_t n = ValidUtf8SequenceLength(s, start);
      if (n == 0 || !IsJsWhitespace(DecodeCodePoint(s, start, &n))) break;
      end = start;
    }
  }
  return s.substr(begin, end - begin);
}

bool IsJsWordChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// JS value.replace(/\b\w/g, upper): the first word character of each word is upper-cased,
// the rest is left alone.
std::string Title(const std::string& s) {
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i) {
    if (IsJsWordChar(out[i]) && (i == 0 || !IsJsWordChar(out[i - 1]))) {
      out[i] = absl::ascii_toupper(out[i]);
    }
  }
  return out;
}

// Unicode case mapping as JavaScript's toUpperCase / toLowerCase: glibc's simple mappings
// (C.UTF-8 locale) plus the unconditional multi-character ones of SpecialCasing.txt that occur
// in practice, and the final-sigma rule. ASCII only if the locale is missing.
locale_t Utf8Locale() {
  static const locale_t locale = newlocale(LC_CTYPE_MASK, "C.UTF-8", static_cast<locale_t>(0));
  return locale;
}

const char* SpecialUpper(char32_t c) {
  switch (c) {
    case 0xDF:
      return "SS";
    case 0x149:
      return "\u02BCN";
    case 0x1F0:
      return "J\u030C";
    case 0x390:
      return "\u0399\u0308\u0301";
    case 0x3B0:
      return "\u03A5\u0308\u0301";
    case 0x587:
      return "\u0535\u0552";
    case 0x1E96:
      return "H\u0331";
    case 0x1E97:
      return "T\u0308";
    case 0x1E98:
      return "W\u030A";
    case 0x1E99:
      return "Y\u030A";
    case 0x1E9A:
      return "A\u02BE";
    case 0xFB00:
      return "FF";
    case 0xFB01:
      return "FI";
    case 0xFB02:
      return "FL";
    case 0xFB03:
      return "FFI";
    case 0xFB04:
      return "FFL";
    case 0xFB05:
      return "ST";
    case 0xFB06:
      return "ST";
    case 0xFB13:
      return "\u0544\u0546";
    case 0xFB14:
      return "\u0544\u0535";
    case 0xFB15:
      return "\u0544\u053B";
    case 0xFB16:
      return "\u054E\u0546";
    case 0xFB17:
      return "\u0544\u053D";
    default:
      return nullptr;
  }
}

std::vector<char32_t> CodePoints(const std::string& s) {
  std::vector<char32_t> out;
  for (size_t pos = 0; pos < s.size();) {
    size_t length = ValidUtf8SequenceLength(s, pos);
    if (length == 0) {
      out.push_back(0xFFFD);
      ++pos;
    } else {
      out.push_back(DecodeCodePoint(s, pos, &length));
      pos += length;
    }
  }
  return out;
}

bool IsCased(char32_t c, locale_t locale) {
  return towupper_l(c, locale) != c || towlower_l(c, locale) != c;
}

std::string JsToUpper(const std::string& s) {
  const locale_t locale = Utf8Locale();
  if (locale == static_cast<locale_t>(0)) return absl::AsciiStrToUpper(s);
  std::string out;
  for (char32_t c : CodePoints(s)) {
    const char* special = SpecialUpper(c);
    if (special != nullptr) {
      out += special;
    } else {
      AppendCodePoint(static_cast<char32_t>(towupper_l(c, locale)), &out);
    }
  }
  return out;
}

std::string JsToLower(const std::string& s) {
  const locale_t locale = Utf8Locale();
  if (locale == static_cast<locale_t>(0)) return absl::AsciiStrToLower(s);
  const std::vector<char32_t> cps = CodePoints(s);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    const char32_t c = cps[i];
    if (c == 0x130) {  // İ
      out += "i\u0307";
    } else if (c == 0x3A3 && i > 0 && IsCased(cps[i - 1], locale) &&
               !(i + 1 < cps.size() && IsCased(cps[i + 1], locale))) {
      out += "\u03C2";  // final sigma
    } else {
      AppendCodePoint(static_cast<char32_t>(towlower_l(c, locale)), &out);
    }
  }
  return out;
}

// JavaScript charAt(0).toUpperCase() + slice(1).
std::string Capitalize(const std::string& s) {
  if (s.empty()) return s;
  size_t length = ValidUtf8SequenceLength(s, 0);
  if (length == 0) length = 1;
  return JsToUpper(s.substr(0, length)) + s.substr(length);
}

// JavaScript String(value) for primitives, which @huggingface/jinja's "+" on strings uses.
std::string JsString(const Value& v) {
  if (v.kind() == Value::Kind::kFloat) {
    std::string text = FormatFloat(v.number());
    if (text.size() > 2 && text.compare(text.size() - 2, 2, ".0") == 0)
      text.resize(text.size() - 2);
    return text;
  }
  return v.ToString();
}

// JavaScript "==" as @huggingface/jinja applies it to the wrapped values: none equals
// undefined, numbers / booleans / numeric strings compare as numbers, containers by identity.
bool LooseEquals(const Value& a, const Value& b) {
  const bool a_null = a.is_none() || a.is_undefined(), b_null = b.is_none() || b.is_undefined();
  if (a_null || b_null) return a_null && b_null;
  if (a.is_string() && b.is_string()) return a.string_value() == b.string_value();
  auto to_number = [](const Value& v, double* out) {
    if (v.is_number()) {
      *out = v.number();
    } else if (v.kind() == Value::Kind::kBool) {
      *out = v.bool_value() ? 1 : 0;
    } else if (v.is_string()) {
      const std::string trimmed = Strip(v.string_value(), true, true);
      if (trimmed.empty()) {
        *out = 0;
        return true;
      }
      char* end = nullptr;
      *out = std::strtod(trimmed.c_str(), &end);
      return end == trimmed.c_str() + trimmed.size();
    } else {
      return false;
    }
    return true;
  };
  double x, y;
  if (to_number(a, &x) && to_number(b, &y)) return x == y;
  if (a.is_array() && b.is_array()) return &a.array() == &b.array();
  if (a.is_object() && b.is_object()) return &a.object() == &b.object();
  return false;
}

// JavaScript "===" on wrapped values (what "x in list" uses).
bool StrictEquals(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.number() == b.number();
  if (a.kind() != b.kind()) return false;
  return LooseEquals(a, b);
}

// Strings are measured, indexed and sliced in UTF-16 code units, as JavaScript (and so
// @huggingface/jinja) does: '你好😀'|length is 4.
std::u16string ToUtf16(const std::string& s) {
  std::u16string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    size_t length = ValidUtf8SequenceLength(s, pos);
    char32_t cp = 0xFFFD;
    if (length == 0) {
      length = 1;
    } else {
      cp = DecodeCodePoint(s, pos, &length);
    }
    if (cp >= 0x10000) {
      out.push_back(static_cast<char16_t>(0xD800 + ((cp - 0x10000) >> 10)));
      out.push_back(static_cast<char16_t>(0xDC00 + ((cp - 0x10000) & 0x3FF)));
    } else {
      out.push_back(static_cast<char16_t>(cp));
    }
    pos += length;
  }
  return out;
}

// Lone surrogates (half of a sliced pair) become U+FFFD.
std::string FromUtf16(const std::u16string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const char16_t unit = s[i];
    if (unit >= 0xD800 && unit <= 0xDBFF && i + 1 < s.size() && s[i + 1] >= 0xDC00 &&
        s[i + 1] <= 0xDFFF) {
      AppendCodePoint(0x10000 + ((unit - 0xD800) << 10) + (s[i + 1] - 0xDC00), &out);
      ++i;
    } else if (unit >= 0xD800 && unit <= 0xDFFF) {
      AppendCodePoint(0xFFFD, &out);
    } else {
      AppendCodePoint(unit, &out);
    }
  }
  return out;
}

int64_t Utf16Length(const std::string& s) { return static_cast<int64_t>(ToUtf16(s).size()); }

// Python-style index normalization for subscripts and slices.
int64_t NormalizeIndex(int64_t index, int64_t size) { return index < 0 ? index + size : index; }

class Interpreter {
 public:
  static constexpr int kMaxMacroDepth = 100;
  static constexpr int64_t kMaxRangeLength = 10'000'000;

  absl::Status Execute(const StmtList& body, const std::shared_ptr<Scope>& scope, std::string* out,
                       Flow* flow) {
    for (const auto& stmt : body) {
      absl::Status status = ExecuteOne(*stmt, scope, out, flow);
      if (!status.ok()) return status;
      if (*flow != Flow::kNormal) return absl::OkStatus();
    }
    return absl::OkStatus();
  }

 private:
  absl::Status ExecuteOne(const Stmt& stmt, const std::shared_ptr<Scope>& scope, std::string* out,
                          Flow* flow) {
    switch (stmt.kind) {
      case Stmt::Kind::kText:
        *out += stmt.text;
        return absl::OkStatus();
      case Stmt::Kind::kOutput: {
        auto value = Evaluate(*stmt.expr, scope);
        if (!value.ok()) return value.status();
        *out += value->ToString();
        return absl::OkStatus();
      }
      case Stmt::Kind::kSet: {
        Value value;
        if (stmt.expr != nullptr) {
          auto evaluated = Evaluate(*stmt.expr, scope);
          if (!evaluated.ok()) return evaluated.status();
          value = *std::move(evaluated);
        } else {
          std::string text;
          Flow inner = Flow::kNormal;
          absl::Status status = Execute(stmt.body, scope, &text, &inner);
          if (!status.ok()) return status;
          value = Value::String(std::move(text));
        }
        return Assign(*stmt.target, std::move(value), scope);
      }
      case Stmt::Kind::kIf: {
        for (const auto& [condition, body] : stmt.branches) {
          auto value = Evaluate(*condition, scope);
          if (!value.ok()) return value.status();
          if (value->Truthy()) return Execute(body, scope, out, flow);
        }
        return Execute(stmt.else_body, scope, out, flow);
      }
      case Stmt::Kind::kFor:
        return ExecuteFor(stmt, scope, out);
      case Stmt::Kind::kMacro:
        scope->Set(stmt.name, MakeMacro(stmt, scope));
        return absl::OkStatus();
      case Stmt::Kind::kBreak:
        *flow = Flow::kBreak;
        return absl::OkStatus();
      case Stmt::Kind::kContinue:
        *flow = Flow::kContinue;
        return absl::OkStatus();
    }
    return absl::InternalError("unknown statement");
  }

  absl::Status Assign(const Expr& target, Value value, const std::shared_ptr<Scope>& scope) {
    if (target.kind == Expr::Kind::kName) {
      scope->Set(target.name, std::move(value));
      return absl::OkStatus();
    }
    if (target.kind == Expr::Kind::kMember) {
      const Value* object = scope->Lookup(target.object->name);
      if (object == nullptr || !object->is_object()) {
        return TypeError(absl::StrCat("cannot set attribute '", target.name, "' of ",
                                      target.object->name, ": not a namespace or object"));
      }
      object->Set(target.name, std::move(value));
      return absl::OkStatus();
    }
    // Tuple unpacking.
    if (!value.is_array() || value.array().size() != target.items.size()) {
      return TypeError("cannot unpack value: wrong number of items");
    }
    for (size_t i = 0; i < target.items.size(); ++i) {
      scope->Set(target.items[i]->name, value.array()[i]);
    }
    return absl::OkStatus();
  }

  absl::Status ExecuteFor(const Stmt& stmt, const std::shared_ptr<Scope>& scope, std::string* out) {
    auto iterable = Evaluate(*stmt.expr, scope);
    if (!iterable.ok()) return iterable.status();
    std::vector<Value> items;
    if (iterable->is_array()) {
      items = iterable->array();
    } else if (iterable->is_object()) {
      for (const auto& entry : iterable->object()) items.push_back(Value::String(entry.first));
    } else if (iterable->is_string()) {
      for (char c : iterable->string_value()) items.push_back(Value::String(std::string(1, c)));
    } else if (iterable->is_undefined() || iterable->is_none()) {
      return TypeError(absl::StrCat("cannot iterate over ", iterable->TypeName()));
    } else {
      return TypeError(absl::StrCat("cannot iterate over ", iterable->TypeName()));
    }
    auto bind = [&](const std::shared_ptr<Scope>& frame, const Value& item) -> absl::Status {
      if (stmt.targets.size() == 1) {
        frame->Set(stmt.targets[0], item);
        return absl::OkStatus();
      }
      if (!item.is_array() || item.array().size() != stmt.targets.size()) {
        return TypeError("cannot unpack loop item: wrong number of values");
      }
      for (size_t i = 0; i < stmt.targets.size(); ++i) frame->Set(stmt.targets[i], item.array()[i]);
      return absl::OkStatus();
    };
    if (stmt.filter != nullptr) {
      std::vector<Value> kept;
      for (const Value& item : items) {
        auto frame = std::make_shared<Scope>(scope);
        absl::Status status = bind(frame, item);
        if (!status.ok()) return status;
        auto keep = Evaluate(*stmt.filter, frame);
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Flow flow = Flow::kNormal;
      return Execute(stmt.else_body, scope, out, &flow);
    }
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      auto frame = std::make_shared<Scope>(scope);
      absl::Status status = bind(frame, items[i]);
      if (!status.ok()) return status;
      frame->Set("loop", Value::NewObject({
                             {"index", Value::Int(i + 1)},
                             {"index0", Value::Int(i)},
                             {"revindex", Value::Int(length - i)},
                             {"revindex0", Value::Int(length - i - 1)},
                             {"first", Value::Bool(i == 0)},
                             {"last", Value::Bool(i == length - 1)},
                             {"length", Value::Int(length)},
                             {"previtem", i > 0 ? items[i - 1] : Value()},
                             {"nextitem", i + 1 < length ? items[i + 1] : Value()},
                         }));
      Flow flow = Flow::kNormal;
      status = Execute(stmt.body, frame, out, &flow);
      if (!status.ok()) return status;
      if (flow == Flow::kBreak) break;
    }
    return absl::OkStatus();
  }

  Value MakeMacro(const Stmt& stmt, const std::shared_ptr<Scope>& defining_scope) {
    const Stmt* macro = &stmt;
    std::weak_ptr<Scope> weak_scope = defining_scope;
    return Value::NewFunction(
        [this, macro, weak_scope](const CallArguments& arguments) -> absl::StatusOr<Value> {
          auto frame = std::make_shared<Scope>(weak_scope.lock());
          if (arguments.positional.size() > macro->params.size()) {
            return TypeError(
                absl::StrCat("macro ", macro->name, " takes ", macro->params.size(), " arguments"));
          }
          for (size_t i = 0; i < macro->params.size(); ++i) {
            const auto& [name, fallback] = macro->params[i];
            Value value;
            if (i < arguments.positional.size()) {
              value = arguments.positional[i];
            } else {
              bool found = false;
              for (const auto& [key, keyword_value] : arguments.keyword) {
                if (key == name) {
                  value = keyword_value;
                  found = true;
                }
              }
              if (!found && fallback != nullptr) {
                auto evaluated = Evaluate(*fallback, frame);
                if (!evaluated.ok()) return evaluated.status();
                value = *std::move(evaluated);
              }
            }
            frame->Set(name, std::move(value));
          }
          std::string text;
          Flow flow = Flow::kNormal;
          // Unbounded recursion would overflow the stack; the reference fails too.
          if (macro_depth_ >= kMaxMacroDepth) {
            return absl::ResourceExhaustedError(
                absl::StrCat("macro ", macro->name, ": recursion deeper than ", kMaxMacroDepth));
          }
          ++macro_depth_;
          absl::Status status = Execute(macro->body, frame, &text, &flow);
          --macro_depth_;
          if (!status.ok()) return status;
          return Value::String(std::move(text));
        });
  }

  absl::StatusOr<Value> Evaluate(const Expr& expr, const std::shared_ptr<Scope>& scope) {
    switch (expr.kind) {
      case Expr::Kind::kLiteral:
        return expr.value;
      case Expr::Kind::kName: {
        const Value* value = scope->Lookup(expr.name);
        if (value != nullptr) return *value;
        return Global(expr.name);
      }
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        Value::Array items;
        for (const auto& item : expr.items) {
          auto value = Evaluate(*item, scope);
          if (!value.ok()) return value;
          items.push_back(*std::move(value));
        }
        return Value::NewArray(std::move(items));
      }
      case Expr::Kind::kDict: {
        Value dict = Value::NewObject();
        for (size_t i = 0; i < expr.keys.size(); ++i) {
          auto key = Evaluate(*expr.keys[i], scope);
          if (!key.ok()) return key;
          auto value = Evaluate(*expr.items[i], scope);
          if (!value.ok()) return value;
          if (!key->is_string() && !key->is_number()) return TypeError("dict keys must be strings");
          dict.Set(key->ToString(), *std::move(value));
        }
        return dict;
      }
      case Expr::Kind::kMember:
        return EvaluateMember(expr, scope);
      case Expr::Kind::kSlice:
        return EvaluateSlice(expr, scope);
      case Expr::Kind::kCall:
        return EvaluateCall(expr, scope);
      case Expr::Kind::kFilter: {
        auto operand = Evaluate(*expr.object, scope);
        if (!operand.ok()) return operand;
        auto arguments = EvaluateArguments(expr, scope);
        if (!arguments.ok()) return arguments.status();
        return ApplyFilter(expr.name, *operand, *arguments, scope);
      }
      case Expr::Kind::kTest: {
        auto operand = Evaluate(*expr.object, scope);
        if (!operand.ok()) return operand;
        auto arguments = EvaluateArguments(expr, scope);
        if (!arguments.ok()) return arguments.status();
        auto result = ApplyTest(expr.name, *operand, *arguments);
        if (!result.ok()) return result.status();
        return Value::Bool(*result != expr.negated);
      }
      case Expr::Kind::kUnary: {
        auto operand = Evaluate(*expr.object, scope);
        if (!operand.ok()) return operand;
        if (expr.name == "not") return Value::Bool(!operand->Truthy());
        if (operand->kind() == Value::Kind::kInt) {
          return Value::Int(expr.name == "-" ? -operand->int_value() : operand->int_value());
        }
        if (operand->kind() == Value::Kind::kFloat) {
          return Value::Float(expr.name == "-" ? -operand->number() : operand->number());
        }
        return TypeError(absl::StrCat("unary ", expr.name, " on ", operand->TypeName()));
      }
      case Expr::Kind::kBinary:
        return EvaluateBinary(expr, scope);
      case Expr::Kind::kTernary: {
        auto condition = Evaluate(*expr.items[1], scope);
        if (!condition.ok()) return condition;
        if (condition->Truthy()) return Evaluate(*expr.items[0], scope);
        if (expr.items[2] == nullptr) return Value();
        return Evaluate(*expr.items[2], scope);
      }
    }
    return absl::InternalError("unknown expression");
  }

  absl::StatusOr<CallArguments> EvaluateArguments(const Expr& expr,
                                                  const std::shared_ptr<Scope>& scope) {
    CallArguments arguments;
    for (const auto& item : expr.items) {
      auto value = Evaluate(*item, scope);
      if (!value.ok()) return value.status();
      arguments.positional.push_back(*std::move(value));
    }
    for (const auto& [key, item] : expr.keywords) {
      auto value = Evaluate(*item, scope);
      if (!value.ok()) return value.status();
      arguments.keyword.emplace_back(key, *std::move(value));
    }
    return arguments;
  }

  absl::StatusOr<Value> Global(const std::string& name) {
    if (name == "raise_exception") {
      return Value::NewFunction([](const CallArguments& arguments) -> absl::StatusOr<Value> {
        return absl::AbortedError(arguments.positional.empty()
                                      ? std::string("raise_exception called")
                                      : arguments.positional[0].ToString());
      });
    }
    if (name == "namespace") {
      return Value::NewFunction([](const CallArguments& arguments) -> absl::StatusOr<Value> {
        Value object = Value::NewObject();
        if (!arguments.positional.empty() && arguments.positional[0].is_object()) {
          for (const auto& [key, value] : arguments.positional[0].object()) object.Set(key, value);
        }
        for (const auto& [key, value] : arguments.keyword) object.Set(key, value);
        return object;
      });
    }
    if (name == "range") {
      return Value::NewFunction([](const CallArguments& arguments) -> absl::StatusOr<Value> {
        std::vector<int64_t> bounds;
        for (const Value& v : arguments.positional) {
          if (v.kind() != Value::Kind::kInt) return TypeError("range() takes integers");
          bounds.push_back(v.int_value());
        }
        if (bounds.empty() || bounds.size() > 3) return TypeError("range() takes 1 to 3 integers");
        int64_t start = 0, stop = bounds[0], step = 1;
        if (bounds.size() >= 2) start = bounds[0], stop = bounds[1];
        if (bounds.size() == 3) step = bounds[2];
        if (step == 0) return TypeError("range() step must not be zero");
        const double count = (static_cast<double>(stop) - start) / step;
        if (count > kMaxRangeLength) {
          return absl::ResourceExhaustedError(
              absl::StrCat("range() of more than ", kMaxRangeLength, " items"));
        }
        Value::Array items;
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
          items.push_back(Value::Int(i));
        }
        return Value::NewArray(std::move(items));
      });
    }
    return Value();
  }

  absl::StatusOr<Value> EvaluateMember(const Expr& expr, const std::shared_ptr<Scope>& scope) {
    auto object = Evaluate(*expr.object, scope);
    if (!object.ok()) return object;
    Value key = Value::String(expr.name);
    if (!expr.items.empty()) {
      auto evaluated = Evaluate(*expr.items[0], scope);
      if (!evaluated.ok()) return evaluated;
      key = *std::move(evaluated);
    }
    return Member(*object, key);
  }

  // Attribute and subscript access, as lenient as @huggingface/jinja: a missing key, or any
  // attribute of undefined / none / a number, is undefined rather than an error.
  absl::StatusOr<Value> Member(const Value& object, const Value& key) {
    if (object.is_object()) {
      if (!key.is_string()) {
        return TypeError(absl::StrCat("cannot access a property with a ", key.TypeName()));
      }
      const Value* found = object.Find(key.string_value());
      if (found != nullptr) return *found;
      return Method(object, key.string_value());
    }
    if (object.is_array() || object.is_string()) {
      if (key.kind() == Value::Kind::kInt) {
        if (object.is_array()) {
          const int64_t size = object.array().size();
          const int64_t index = NormalizeIndex(key.int_value(), size);
          if (index < 0 || index >= size) return Value();
          return object.array()[index];
        }
        // JavaScript's String.prototype.at: UTF-16 code units.
        const std::u16string units = ToUtf16(object.string_value());
        const int64_t index = NormalizeIndex(key.int_value(), units.size());
        if (index < 0 || index >= static_cast<int64_t>(units.size())) return Value();
        return Value::String(FromUtf16(units.substr(index, 1)));
      }
      if (key.is_string()) {
        if (key.string_value() == "length") {
          return Value::Int(object.is_array() ? object.array().size()
                                              : Utf16Length(object.string_value()));
        }
        return Method(object, key.string_value());
      }
      return TypeError(
          absl::StrCat("cannot index a ", object.TypeName(), " with a ", key.TypeName()));
    }
    if (!key.is_string()) {
      return TypeError(absl::StrCat("cannot access a property with a ", key.TypeName()));
    }
    return Value();
  }

  absl::StatusOr<Value> EvaluateSlice(const Expr& expr, const std::shared_ptr<Scope>& scope) {
    auto object = Evaluate(*expr.object, scope);
    if (!object.ok()) return object;
    int64_t bounds[3] = {0, 0, 1};
    bool present[3] = {false, false, false};
    for (int i = 0; i < 3; ++i) {
      if (expr.items[i] == nullptr) continue;
      auto value = Evaluate(*expr.items[i], scope);
      if (!value.ok()) return value;
      if (value->is_undefined()) continue;
      if (value->kind() != Value::Kind::kInt) {
        return TypeError("slice bounds must be integers or undefined");
      }
      bounds[i] = value->int_value();
      present[i] = true;
    }
    if (!object->is_array() && !object->is_string()) {
      return TypeError(absl::StrCat("cannot slice a ", object->TypeName()));
    }
    // Strings slice by code point (the reference slices Array.from(string)).
    std::vector<std::string> chars;
    if (object->is_string()) {
      const std::string& s = object->string_value();
      for (size_t pos = 0; pos < s.size();) {
        size_t length = ValidUtf8SequenceLength(s, pos);
        if (length == 0) length = 1;
        chars.push_back(s.substr(pos, length));
        pos += length;
      }
    }
    const int64_t size = object->is_array() ? object->array().size() : chars.size();
    const int64_t step = present[2] ? bounds[2] : 1;
    if (step == 0) return TypeError("slice step must not be zero");
    // The reference's slice(): like Python, except that an explicit stop of -1 with a negative
    // step means "through the first item".
    int64_t start, stop;
    if (step > 0) {
      start = !present[0]     ? 0
              : bounds[0] < 0 ? std::max<int64_t>(size + bounds[0], 0)
                              : std::min<int64_t>(bounds[0], size);
      stop = !present[1]     ? size
             : bounds[1] < 0 ? std::max<int64_t>(size + bounds[1], 0)
                             : std::min<int64_t>(bounds[1], size);
    } else {
      start = !present[0]     ? size - 1
              : bounds[0] < 0 ? std::max<int64_t>(size + bounds[0], -1)
                              : std::min<int64_t>(bounds[0], size - 1);
      stop = !present[1]      ? -1
             : bounds[1] < -1 ? std::max<int64_t>(size + bounds[1], -1)
                              : std::min<int64_t>(bounds[1], size - 1);
    }
    Value::Array items;
    std::string text;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      if (object->is_array()) {
        items.push_back(object->array()[i]);
      } else {
        text += chars[i];
      }
    }
    if (object->is_array()) return Value::NewArray(std::move(items));
    return Value::String(std::move(text));
  }

  absl::StatusOr<Value> EvaluateCall(const Expr& expr, const std::shared_ptr<Scope>& scope) {
    auto callee = Evaluate(*expr.object, scope);
    if (!callee.ok()) return callee;
    if (!callee->is_function()) {
      return TypeError(absl::StrCat("cannot call a ", callee->TypeName()));
    }
    auto arguments = EvaluateArguments(expr, scope);
    if (!arguments.ok()) return arguments.status();
    return callee->function()(*arguments);
  }

  // Bound methods of strings, objects and arrays ("text.strip()", "message.get('x')").
  absl::StatusOr<Value> Method(const Value& object, const std::string& name) {
    auto bind = [object](auto body) {
      return Value::NewFunction([object, body](const CallArguments& args) -> absl::StatusOr<Value> {
        return body(object, args);
      });
    };
    auto string_arg = [](const CallArguments& args, size_t i) -> const std::string* {
      return i < args.positional.size() && args.positional[i].is_string()
                 ? &args.positional[i].string_value()
                 : nullptr;
    };
    if (object.is_string()) {
      if (name == "strip" || name == "lstrip" || name == "rstrip") {
        const bool left = name != "rstrip", right = name != "lstrip";
        return bind([=](const Value& self, const CallArguments&) -> absl::StatusOr<Value> {
          return Value::String(Strip(self.string_value(), left, right));
        });
      }
      if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
        return bind([name](const Value& self, const CallArguments&) -> absl::StatusOr<Value> {
          std::string s = self.string_value();
          if (name == "upper") return Value::String(JsToUpper(s));
          if (name == "lower") return Value::String(JsToLower(s));
          if (name == "title") return Value::String(Title(s));
          return Value::String(Capitalize(s));
        });
      }
      if (name == "startswith" || name == "endswith") {
        const bool starts = name == "startswith";
        return bind([=](const Value& self, const CallArguments& args) -> absl::StatusOr<Value> {
          // A string, or a list/tuple of strings any of which may match.
          std::vector<std::string> affixes;
          if (string_arg(args, 0) != nullptr) {
            affixes.push_back(*string_arg(args, 0));
          } else if (!args.positional.empty() && args.positional[0].is_array()) {
            for (const Value& item : args.positional[0].array()) {
              if (!item.is_string()) return TypeError(absl::StrCat(name, "() takes strings"));
              affixes.push_back(item.string_value());
            }
          } else {
            return TypeError(absl::StrCat(name, "() takes a string"));
          }
          for (const std::string& affix : affixes) {
            if (starts ? absl::StartsWith(self.string_value(), affix)
                       : absl::EndsWith(self.string_value(), affix)) {
              return Value::Bool(true);
            }
          }
          return Value::Bool(false);
        });
      }
      if (name == "split") {
        return bind([=](const Value& self, const CallArguments& args) -> absl::StatusOr<Value> {
          const std::string* separator = string_arg(args, 0);
          int64_t max_split = -1;
          if (args.positional.size() > 1 && args.positional[1].kind() == Value::Kind::kInt) {
            max_split = args.positional[1].int_value();
          }
          Value::Array parts;
          const std::string& s = self.string_value();
          if (separator == nullptr) {
            // Python: runs of whitespace, no empty strings.
            size_t pos = 0;
            while (pos < s.size()) {
              while (pos < s.size() && IsWhitespace(s[pos])) ++pos;
              if (pos >= s.size()) break;
              if (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split) {
                parts.push_back(Value::String(Strip(s.substr(pos), false, true)));
                break;
              }
              size_t end = pos;
              while (end < s.size() && !IsWhitespace(s[end])) ++end;
              parts.push_back(Value::String(s.substr(pos, end - pos)));
              pos = end;
            }
          } else {
            if (separator->empty()) return TypeError("split(): empty separator");
            size_t pos = 0;
            while (true) {
              const size_t next = s.find(*separator, pos);
              if (next == std::string::npos ||
                  (max_split >= 0 && static_cast<int64_t>(parts.size()) == max_split)) {
                parts.push_back(Value::String(s.substr(pos)));
                break;
              }
              parts.push_back(Value::String(s.substr(pos, next - pos)));
              pos = next + separator->size();
            }
          }
          return Value::NewArray(std::move(parts));
        });
      }
      if (name == "replace") {
        return bind([=](const Value& self, const CallArguments& args) -> absl::StatusOr<Value> {
          const std::string* from = string_arg(args, 0);
          const std::string* to = string_arg(args, 1);
          if (from == nullptr || to == nullptr) return TypeError("replace() takes two strings");
          int64_t count = -1;  // all
          if (args.positional.size() > 2 && args.positional[2].kind() == Value::Kind::kInt) {
            count = args.positional[2].int_value();
          }
          const std::string& s = self.string_value();
          if (from->empty() || count < 0) {
            return Value::String(absl::StrReplaceAll(s, {{*from, *to}}));
          }
          std::string out;
          size_t pos = 0;
          for (int64_t done = 0; done < count; ++done) {
            const size_t next = s.find(*from, pos);
            if (next == std::string::npos) break;
            out.append(s, pos, next - pos);
            out += *to;
            pos = next + from->size();
          }
          out.append(s, pos, std::string::npos);
          return Value::String(out);
        });
      }
    }
    if (object.is_object()) {
      if (name == "items" || name == "keys" || name == "values") {
        return bind([name](const Value& self, const CallArguments&) -> absl::StatusOr<Value> {
          Value::Array items;
          for (const auto& [key, value] : self.object()) {
            if (name == "items") {
              items.push_back(Value::NewArray({Value::String(key), value}));
            } else {
              items.push_back(name == "keys" ? Value::String(key) : value);
            }
          }
          return Value::NewArray(std::move(items));
        });
      }
      if (name == "get") {
        return bind([](const Value& self, const CallArguments& args) -> absl::StatusOr<Value> {
          if (args.positional.empty() || !args.positional[0].is_string()) {
            return TypeError("get() takes a key");
          }
          const Value* found = self.Find(args.positional[0].string_value());
          if (found != nullptr) return *found;
          return args.positional.size() > 1 ? args.positional[1] : Value::None();
        });
      }
      return Value();  // a missing key is undefined
    }
    return Value();  // no such method: undefined (calling it is the error)
  }

  absl::StatusOr<Value> EvaluateBinary(const Expr& expr, const std::shared_ptr<Scope>& scope) {
    const std::string& op = expr.name;
    auto left = Evaluate(*expr.left, scope);
    if (!left.ok()) return left;
    if (op == "and") return left->Truthy() ? Evaluate(*expr.right, scope) : *left;
    if (op == "or") return left->Truthy() ? *left : Evaluate(*expr.right, scope);
    auto right = Evaluate(*expr.right, scope);
    if (!right.ok()) return right;
    const Value& a = *left;
    const Value& b = *right;
    if (op == "==") return Value::Bool(LooseEquals(a, b));
    if (op == "!=") return Value::Bool(!LooseEquals(a, b));
    // @huggingface/jinja refuses every other operator on undefined or none, except that
    // "x in undefined" is false.
    if (a.is_undefined() || b.is_undefined()) {
      if (b.is_undefined() && (op == "in" || op == "not in")) return Value::Bool(op == "not in");
      return TypeError(absl::StrCat("cannot perform operation ", op, " on undefined values"));
    }
    if (a.is_none() || b.is_none()) return TypeError("cannot perform operation on null values");
    if (op == "~") return Value::String(JsString(a) + JsString(b));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (b.is_string() && a.is_string()) {
        found = absl::StrContains(b.string_value(), a.string_value());
      } else if (b.is_array()) {
        for (const Value& item : b.array()) found = found || StrictEquals(item, a);
      } else if (b.is_object() && a.is_string()) {
        found = b.Find(a.string_value()) != nullptr;
      } else {
        return TypeError(absl::StrCat("'in' needs a string, list or object, got ", b.TypeName()));
      }
      return Value::Bool(found != (op == "not in"));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      int order;
      if (a.is_number() && b.is_number()) {
        order = a.number() < b.number() ? -1 : a.number() > b.number() ? 1 : 0;
      } else {
        return TypeError(absl::StrCat("cannot compare ", a.TypeName(), " with ", b.TypeName()));
      }
      if (op == "<") return Value::Bool(order < 0);
      if (op == ">") return Value::Bool(order > 0);
      if (op == "<=") return Value::Bool(order <= 0);
      return Value::Bool(order >= 0);
    }
    if (op == "+") {
      if (a.is_string() || b.is_string()) return Value::String(JsString(a) + JsString(b));
      if (a.is_array() && b.is_array()) {
        Value::Array items = a.array();
        items.insert(items.end(), b.array().begin(), b.array().end());
        return Value::NewArray(std::move(items));
      }
    }
    if (a.is_number() && b.is_number()) {
      const bool ints = a.kind() == Value::Kind::kInt && b.kind() == Value::Kind::kInt;
      if (op == "+")
        return ints ? Value::Int(a.int_value() + b.int_value())
                    : Value::Float(a.number() + b.number());
      if (op == "-")
        return ints ? Value::Int(a.int_value() - b.int_value())
                    : Value::Float(a.number() - b.number());
      if (op == "*")
        return ints ? Value::Int(a.int_value() * b.int_value())
                    : Value::Float(a.number() * b.number());
      if (op == "**") {
        const double result = std::pow(a.number(), b.number());
        if (!std::isfinite(result)) return TypeError("exponentiation result is not finite");
        return ints && b.int_value() >= 0 ? Value::Int(static_cast<int64_t>(result))
                                          : Value::Float(result);
      }
      if (op == "/") {
        if (b.number() == 0) return TypeError("division by zero");
        return Value::Float(a.number() / b.number());
      }
      if (op == "//") {
        if (b.number() == 0) return TypeError("division by zero");
        const double q = std::floor(a.number() / b.number());
        return ints ? Value::Int(static_cast<int64_t>(q)) : Value::Float(q);
      }
      if (op == "%") {
        if (b.number() == 0) return TypeError("modulo by zero");
        // @huggingface/jinja follows JavaScript: the result takes the dividend's sign.
        return ints ? Value::Int(a.int_value() % b.int_value())
                    : Value::Float(std::fmod(a.number(), b.number()));
      }
    }
    return TypeError(absl::StrCat("unsupported operator \"", op, "\" between ", a.TypeName(),
                                  " and ", b.TypeName()));
  }

  absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& v,
                                 const CallArguments& args) {
    if (name == "defined") return !v.is_undefined();
    if (name == "undefined") return v.is_undefined();
    if (name == "none") return v.is_none();
    if (name == "string") return v.is_string();
    if (name == "number") return v.is_number();
    if (name == "integer") return v.kind() == Value::Kind::kInt;
    if (name == "float") return v.kind() == Value::Kind::kFloat;
    if (name == "boolean") return v.kind() == Value::Kind::kBool;
    if (name == "true") return v.kind() == Value::Kind::kBool && v.bool_value();
    if (name == "false") return v.kind() == Value::Kind::kBool && !v.bool_value();
    if (name == "mapping") return v.is_object();
    if (name == "iterable") return v.is_array() || v.is_object() || v.is_string();
    if (name == "sequence") return v.is_array() || v.is_string();
    if (name == "callable") return v.is_function();
    if (name == "odd" || name == "even") {
      if (v.kind() != Value::Kind::kInt)
        return TypeError(absl::StrCat("'", name, "' needs an integer"));
      return (v.int_value() % 2 != 0) == (name == "odd");
    }
    if (name == "equalto" || name == "eq" || name == "==") {
      if (args.positional.empty()) return TypeError("'equalto' needs a value");
      return v.Equals(args.positional[0]);
    }
    if (name == "ne" || name == "!=") {
      if (args.positional.empty()) return TypeError("'ne' needs a value");
      return !v.Equals(args.positional[0]);
    }
    return TypeError(absl::StrCat("unknown test '", name, "'"));
  }

  absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& v,
                                    const CallArguments& args,
                                    const std::shared_ptr<Scope>& scope) {
    auto keyword = [&args](const char* key, size_t position) -> const Value* {
      for (const auto& [k, value] : args.keyword) {
        if (k == key) return &value;
      }
      return position < args.positional.size() ? &args.positional[position] : nullptr;
    };
    if (name == "length" || name == "count") {
      if (v.is_string()) return Value::Int(Utf16Length(v.string_value()));
      if (v.is_array()) return Value::Int(v.array().size());
      if (v.is_object()) return Value::Int(v.object().size());
      return TypeError(absl::StrCat("cannot take the length of ", v.TypeName()));
    }
    if (name == "tojson") {
      const Value* indent = keyword("indent", 0);
      auto json = v.ToJson(indent != nullptr && indent->kind() == Value::Kind::kInt
                               ? static_cast<int>(indent->int_value())
                               : -1);
      if (!json.ok()) return json.status();
      return Value::String(*json);
    }
    if (name == "string") return Value::String(v.ToString());
    if (name == "default" || name == "d") {
      const Value* fallback = keyword("default_value", 0);
      const Value* boolean = keyword("boolean", 1);
      const bool use_fallback =
          (boolean != nullptr && boolean->Truthy()) ? !v.Truthy() : v.is_undefined();
      if (use_fallback) return fallback != nullptr ? *fallback : Value::String("");
      return v;
    }
    if (v.is_string()) {
      const std::string& s = v.string_value();
      if (name == "trim") return Value::String(Strip(s, true, true));
      if (name == "upper") return Value::String(JsToUpper(s));
      if (name == "lower") return Value::String(JsToLower(s));
      if (name == "title") return Value::String(Title(s));
      if (name == "capitalize") return Value::String(Capitalize(s));
      if (name == "safe" || name == "e" || name == "escape") {
        if (name == "safe") return v;
        return Value::String(absl::StrReplaceAll(
            s, {{"&", "&amp;"}, {"<", "&lt;"}, {">", "&gt;"}, {"\"", "&#34;"}, {"'", "&#39;"}}));
      }
      if (name == "replace") {
        if (args.positional.size() < 2 || !args.positional[0].is_string() ||
            !args.positional[1].is_string()) {
          return TypeError("replace needs two strings");
        }
        return Value::String(absl::StrReplaceAll(
            s, {{args.positional[0].string_value(), args.positional[1].string_value()}}));
      }
      if (name == "int") return Value::Int(std::strtoll(s.c_str(), nullptr, 10));
      if (name == "float") return Value::Float(std::strtod(s.c_str(), nullptr));
      if (name == "first") return s.empty() ? Value() : Value::String(s.substr(0, 1));
      if (name == "last") return s.empty() ? Value() : Value::String(s.substr(s.size() - 1));
      if (name == "list") {
        Value::Array chars;
        for (char c : s) chars.push_back(Value::String(std::string(1, c)));
        return Value::NewArray(std::move(chars));
      }
      if (name == "indent") {
        const Value* width = keyword("width", 0);
        const Value* first = keyword("first", 1);
        const std::string pad(
            width != nullptr && width->kind() == Value::Kind::kInt ? width->int_value() : 4, ' ');
        std::string out;
        bool line_start = first != nullptr && first->Truthy();
        for (char c : s) {
          if (line_start && c != '\n') out += pad;
          line_start = false;
          out.push_back(c);
          if (c == '\n') line_start = true;
        }
        return Value::String(out);
      }
    }
    if (v.is_number()) {
      if (name == "int") return Value::Int(static_cast<int64_t>(v.number()));
      if (name == "float") return Value::Float(v.number());
      if (name == "abs") {
        return v.kind() == Value::Kind::kInt ? Value::Int(std::llabs(v.int_value()))
                                             : Value::Float(std::fabs(v.number()));
      }
    }
    if (v.is_object() && name == "dictsort") {
      Value::Array items;
      std::vector<std::pair<std::string, Value>> entries = v.object();
      std::stable_sort(entries.begin(), entries.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
      for (const auto& [key, value] : entries) {
        items.push_back(Value::NewArray({Value::String(key), value}));
      }
      return Value::NewArray(std::move(items));
    }
    if (v.is_object() && name == "items") {
      Value::Array items;
      for (const auto& [key, value] : v.object()) {
        items.push_back(Value::NewArray({Value::String(key), value}));
      }
      return Value::NewArray(std::move(items));
    }
    if (v.is_array()) {
      const Value::Array& items = v.array();
      if (name == "first") return items.empty() ? Value() : items.front();
      if (name == "last") return items.empty() ? Value() : items.back();
      if (name == "list") return Value::NewArray(items);
      if (name == "reverse") return Value::NewArray(Value::Array(items.rbegin(), items.rend()));
      if (name == "join") {
        const Value* separator = keyword("d", 0);
        std::string out;
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0 && separator != nullptr) out += separator->ToString();
          out += items[i].ToString();
        }
        return Value::String(out);
      }
      if (name == "unique") {
        Value::Array out;
        for (const Value& item : items) {
          bool seen = false;
          for (const Value& kept : out) seen = seen || kept.Equals(item);
          if (!seen) out.push_back(item);
        }
        return Value::NewArray(std::move(out));
      }
      if (name == "sort") {
        Value::Array out = items;
        bool comparable = true;
        std::stable_sort(out.begin(), out.end(), [&comparable](const Value& a, const Value& b) {
          if (a.is_number() && b.is_number()) return a.number() < b.number();
          if (a.is_string() && b.is_string()) return a.string_value() < b.string_value();
          comparable = false;
          return false;
        });
        if (!comparable) return TypeError("sort: items are not comparable");
        return Value::NewArray(std::move(out));
      }
      if (name == "map") {
        const Value* attribute = keyword("attribute", 99);
        Value::Array out;
        for (const Value& item : items) {
          if (attribute != nullptr) {
            auto member = Member(item, *attribute);
            if (!member.ok()) return member;
            out.push_back(*std::move(member));
          } else {
            if (args.positional.empty() || !args.positional[0].is_string()) {
              return TypeError("map needs a filter name or attribute=");
            }
            CallArguments rest;
            rest.positional.assign(args.positional.begin() + 1, args.positional.end());
            auto mapped = ApplyFilter(args.positional[0].string_value(), item, rest, scope);
            if (!mapped.ok()) return mapped;
            out.push_back(*std::move(mapped));
          }
        }
        return Value::NewArray(std::move(out));
      }
      if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
        const bool by_attribute = name == "selectattr" || name == "rejectattr";
        const bool select = name == "selectattr" || name == "select";
        size_t next = 0;
        const Value* attribute = nullptr;
        if (by_attribute) {
          if (args.positional.empty()) return TypeError(absl::StrCat(name, " needs an attribute"));
          attribute = &args.positional[next++];
        }
        Value::Array out;
        for (const Value& item : items) {
          Value subject = item;
          if (attribute != nullptr) {
            auto member = Member(item, *attribute);
            if (!member.ok()) return member;
            subject = *std::move(member);
          }
          bool passed;
          if (next < args.positional.size()) {
            if (!args.positional[next].is_string()) return TypeError("test name must be a string");
            CallArguments rest;
            rest.positional.assign(args.positional.begin() + next + 1, args.positional.end());
            auto result = ApplyTest(args.positional[next].string_value(), subject, rest);
            if (!result.ok()) return result.status();
            passed = *result;
          } else {
            passed = subject.Truthy();
          }
          if (passed == select) out.push_back(item);
        }
        return Value::NewArray(std::move(out));
      }
    }
    return TypeError(absl::StrCat("unknown filter '", name, "' for a ", v.TypeName()));
  }

  int macro_depth_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Template>> Template::Parse(absl::string_view source) {
  auto body = ParseTemplate(source);
  if (!body.ok()) return body.status();
  return std::unique_ptr<Template>(new Template(*std::move(body)));
}

absl::StatusOr<std::string> Template::Render(const Value& context) const {
  auto globals = std::make_shared<Scope>(nullptr);
  if (context.is_object()) {
    for (const auto& [name, value] : context.object()) globals->Set(name, value);
  }
  Interpreter interpreter;
  std::string out;
  Flow flow = Flow::kNormal;
  absl::Status status = interpreter.Execute(body_, globals, &out, &flow);
  if (!status.ok()) return status;
  return out;
}

}  // namespace deepinfer::tokenizer::jinja
