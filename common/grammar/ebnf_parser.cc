#include "common/grammar/ebnf_parser.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/grammar/regex_parser.h"

namespace deepinfer::grammar {
namespace {

// Bounds the parser's recursion on hostile input.
constexpr int kMaxNesting = 200;

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }
bool IsNameChar(char c) { return absl::ascii_isalnum(c) || c == '_' || c == '-' || c == '.'; }

class EbnfParser {
 public:
  explicit EbnfParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<Grammar> Parse() {
    SkipSpace();
    if (AtEnd()) return Error("the grammar is empty");
    while (!AtEnd()) {
      if (Peek() == '%') {
        size_t end = pos_ + 1;
        while (end < text_.size() && IsNameChar(text_[end])) ++end;
        return Error(
            absl::StrCat("directive '", text_.substr(pos_, end - pos_), "' is not supported"));
      }
      if (Peek() == '?' || Peek() == '!') ++pos_;  // Lark: inline / keep-tokens rule
      std::string name;
      if (!ReadName(&name)) return Error("expected a rule name");
      SkipSpace();
      if (!ReadDefinition()) return Error(absl::StrCat("expected '::=' after '", name, "'"));
      const int32_t rule = g_.Rule(name);
      if (defined_.size() <= static_cast<size_t>(rule)) defined_.resize(rule + 1, 0);
      if (defined_[rule]) return Error(absl::StrCat("rule '", name, "' is defined twice"));
      defined_[rule] = 1;
      absl::StatusOr<int32_t> body = ParseAlternation();
      if (!body.ok()) return body.status();
      g_.SetBody(rule, *body);
      SkipSpace();
    }
    if (IsDefined("root")) {
      g_.SetRoot(g_.Rule("root"));
    } else if (IsDefined("start")) {
      g_.SetRoot(g_.Rule("start"));
    } else {
      return absl::InvalidArgumentError("grammar: there is no rule named 'root' (or 'start')");
    }
    if (absl::Status s = g_.Validate(); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("grammar: ", s.message()));
    }
    return std::move(g_);
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  bool IsDefined(absl::string_view name) {
    if (!g_.HasRule(name)) return false;
    const size_t rule = static_cast<size_t>(g_.Rule(name));
    return rule < defined_.size() && defined_[rule];
  }
  char Peek() const { return text_[pos_]; }

  absl::Status Error(absl::string_view what) const {
    int line = 1;
    for (size_t i = 0; i < pos_ && i < text_.size(); ++i) line += text_[i] == '\n';
    return absl::InvalidArgumentError(absl::StrCat("grammar: line ", line, ": ", what));
  }

  void SkipSpace() {
    while (!AtEnd()) {
      const char c = Peek();
      if (absl::ascii_isspace(c)) {
        ++pos_;
      } else if (c == '#' || (c == '/' && pos_ + 1 < text_.size() && text_[pos_ + 1] == '/')) {
        while (!AtEnd() && Peek() != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  bool ReadName(std::string* name) {
    if (AtEnd() || !IsNameStart(Peek())) return false;
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(Peek())) ++pos_;
    *name = std::string(text_.substr(start, pos_ - start));
    return true;
  }

  bool ReadDefinition() {
    if (text_.substr(pos_, 3) == "::=") {
      pos_ += 3;
      return true;
    }
    if (!AtEnd() && Peek() == ':') {
      ++pos_;
      return true;
    }
    return false;
  }

  // A name followed by ::= or : starts the next rule.
  bool AtRuleStart() {
    size_t p = pos_;
    if (p < text_.size() && (text_[p] == '?' || text_[p] == '!')) ++p;
    if (p >= text_.size() || !IsNameStart(text_[p])) return false;
    while (p < text_.size() && IsNameChar(text_[p])) ++p;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return p < text_.size() && text_[p] == ':';
  }

  absl::StatusOr<int32_t> ParseAlternation() {
    std::vector<int32_t> alts;
    while (true) {
      absl::StatusOr<int32_t> s = ParseSequence();
      if (!s.ok()) return s;
      alts.push_back(*s);
      SkipSpace();
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    return g_.Alternation(std::move(alts));
  }

  absl::StatusOr<int32_t> ParseSequence() {
    std::vector<int32_t> items;
    while (true) {
      SkipSpace();
      if (AtEnd() || Peek() == '|' || Peek() == ')' || AtRuleStart()) break;
      absl::StatusOr<int32_t> atom = ParseAtom();
      if (!atom.ok()) return atom;
      absl::StatusOr<int32_t> q = ParseQuantifiers(*atom);
      if (!q.ok()) return q;
      items.push_back(*q);
    }
    return g_.Sequence(std::move(items));
  }

  absl::StatusOr<int32_t> ParseQuantifiers(int32_t atom) {
    int32_t e = atom;
    for (int count = 0; !AtEnd(); ++count) {
      // Each quantifier nests the expression once more; bounds the compile's recursion.
      if (count > 4) return Error("more than 4 quantifiers in a row");
      const char c = Peek();
      if (c == '*') {
        e = g_.Repeat(e, 0, kUnbounded);
      } else if (c == '+') {
        e = g_.Repeat(e, 1, kUnbounded);
      } else if (c == '?') {
        e = g_.Repeat(e, 0, 1);
      } else if (c == '{') {
        size_t p = pos_ + 1;
        auto number = [&](int32_t* out) {
          while (p < text_.size() && text_[p] == ' ') ++p;
          const size_t start = p;
          int64_t v = 0;
          while (p < text_.size() && absl::ascii_isdigit(text_[p]) && v < 100000) {
            v = v * 10 + (text_[p++] - '0');
          }
          *out = static_cast<int32_t>(v);
          while (p < text_.size() && text_[p] == ' ') ++p;
          return p > start;
        };
        int32_t min, max;
        if (!number(&min)) return Error("bad repetition {m,n}");
        max = min;
        if (p < text_.size() && text_[p] == ',') {
          ++p;
          if (!number(&max)) max = kUnbounded;
        }
        if (p >= text_.size() || text_[p] != '}') return Error("bad repetition {m,n}");
        if (max != kUnbounded && max < min) return Error("repetition {m,n} with n < m");
        pos_ = p;
        e = g_.Repeat(e, min, max);
      } else {
        break;
      }
      ++pos_;
    }
    return e;
  }

  absl::StatusOr<std::string> ParseString() {
    const char quote = Peek();
    ++pos_;
    std::string out;
    while (true) {
      if (AtEnd() || Peek() == '\n') return Error("unterminated string literal");
      const char c = Peek();
      if (c == quote) {
        ++pos_;
        break;
      }
      if (c != '\\') {
        out.push_back(c);
        ++pos_;
        continue;
      }
      ++pos_;
      if (AtEnd()) return Error("unterminated string literal");
      const char e = Peek();
      ++pos_;
      int hex_digits = 0;
      switch (e) {
        case 'n':
          out.push_back('\n');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'v':
          out.push_back('\v');
          break;
        case 'b':
          out.push_back('\b');
          break;
        case '0':
          out.push_back('\0');
          break;
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '/':
          out.push_back(e);
          break;
        case 'x':
          hex_digits = 2;
          break;
        case 'u':
          hex_digits = 4;
          break;
        case 'U':
          hex_digits = 8;
          break;
        default:
          return Error(absl::StrCat("unknown escape \\", std::string(1, e)));
      }
      if (hex_digits > 0) {
        uint32_t v = 0;
        for (int i = 0; i < hex_digits; ++i) {
          if (AtEnd() || !absl::ascii_isxdigit(Peek())) return Error("bad hex escape");
          const char h = Peek();
          v = v * 16 + (absl::ascii_isdigit(h) ? h - '0' : (absl::ascii_tolower(h) - 'a' + 10));
          ++pos_;
        }
        if (v > kMaxCodepoint) return Error("escape beyond U+10FFFF");
        if (e == 'x') {
          out.push_back(static_cast<char>(v));
        } else {
          out += EncodeCodepoint(v);
        }
      }
    }
    if (!AtEnd() && Peek() == 'i' && (pos_ + 1 >= text_.size() || !IsNameChar(text_[pos_ + 1]))) {
      return Error("case-insensitive literals (\"...\"i) are not supported");
    }
    return out;
  }

  absl::StatusOr<int32_t> ParseAtom() {
    const char c = Peek();
    if (c == '(') {
      if (++depth_ > kMaxNesting) return Error("groups are nested too deeply");
      ++pos_;
      absl::StatusOr<int32_t> inner = ParseAlternation();
      --depth_;
      if (!inner.ok()) return inner;
      SkipSpace();
      if (AtEnd() || Peek() != ')') return Error("unclosed '('");
      ++pos_;
      return inner;
    }
    if (c == '[') {
      absl::StatusOr<CodepointRanges> r = ParseCharClass(text_, &pos_);
      if (!r.ok()) return Error(r.status().message());
      return g_.CharClass(*r);
    }
    if (c == '"' || c == '\'') {
      absl::StatusOr<std::string> s = ParseString();
      if (!s.ok()) return s.status();
      return g_.Bytes(*s);
    }
    if (c == '/') {
      const size_t start = ++pos_;
      while (!AtEnd() && Peek() != '/' && Peek() != '\n') pos_ += Peek() == '\\' ? 2 : 1;
      if (AtEnd() || Peek() != '/') return Error("unterminated /regex/");
      const absl::string_view pattern = text_.substr(start, pos_ - start);
      ++pos_;
      if (!AtEnd() && absl::ascii_isalpha(Peek())) {
        return Error("regex flags (/.../i and others) are not supported");
      }
      absl::StatusOr<int32_t> e = AddRegex(&g_, pattern);
      if (!e.ok()) return Error(e.status().message());
      return *e;
    }
    if (IsNameStart(c)) {
      std::string name;
      ReadName(&name);
      return g_.Ref(g_.Rule(name));
    }
    return Error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }

  absl::string_view text_;
  size_t pos_ = 0;
  Grammar g_;
  std::vector<char> defined_;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Grammar> ParseEbnf(absl::string_view text) { return EbnfParser(text).Parse(); }

}  // namespace deepinfer::grammar
