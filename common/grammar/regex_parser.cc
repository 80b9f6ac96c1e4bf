#include "common/grammar/regex_parser.h"

#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace deepinfer::grammar {
namespace {

absl::Status ErrorAt(size_t pos, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("regex: ", what, " at offset ", pos));
}

const CodepointRanges& Digits() {
  static const CodepointRanges* r = new CodepointRanges{{'0', '9'}};
  return *r;
}
const CodepointRanges& WordChars() {
  static const CodepointRanges* r =
      new CodepointRanges{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return *r;
}
const CodepointRanges& Spaces() {
  static const CodepointRanges* r = new CodepointRanges{{'\t', '\r'}, {' ', ' '}};
  return *r;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Reads `count` hex digits at text[*pos].
absl::StatusOr<uint32_t> ReadHex(absl::string_view text, size_t* pos, int count) {
  uint32_t v = 0;
  for (int i = 0; i < count; ++i) {
    if (*pos >= text.size() || HexValue(text[*pos]) < 0) return ErrorAt(*pos, "bad hex escape");
    v = v * 16 + HexValue(text[(*pos)++]);
  }
  return v;
}

// An escape after '\' at text[*pos]: either a class (\d, \w, \s and negations) or one code
// point.
struct Escape {
  bool is_class = false;
  CodepointRanges ranges;
  uint32_t cp = 0;
};

absl::StatusOr<Escape> ParseEscape(absl::string_view text, size_t* pos) {
  if (*pos >= text.size()) return ErrorAt(*pos, "pattern ends with a backslash");
  const size_t at = *pos;
  const char c = text[(*pos)++];
  Escape e;
  switch (c) {
    case 'd':
    case 'D':
    case 'w':
    case 'W':
    case 's':
    case 'S': {
      const char lower = c | 0x20;
      const CodepointRanges& base = lower == 'd' ? Digits() : lower == 'w' ? WordChars() : Spaces();
      e.is_class = true;
      e.ranges = c == lower ? base : ComplementRanges(NormalizeRanges(base));
      return e;
    }
    case 'n':
      e.cp = '\n';
      return e;
    case 't':
      e.cp = '\t';
      return e;
    case 'r':
      e.cp = '\r';
      return e;
    case 'f':
      e.cp = '\f';
      return e;
    case 'v':
      e.cp = '\v';
      return e;
    case '0':
      e.cp = 0;
      return e;
    case 'x': {
      absl::StatusOr<uint32_t> v = ReadHex(text, pos, 2);
      if (!v.ok()) return v.status();
      e.cp = *v;
      return e;
    }
    case 'u': {
      if (*pos < text.size() && text[*pos] == '{') {
        ++*pos;
        uint32_t v = 0;
        int digits = 0;
        while (*pos < text.size() && HexValue(text[*pos]) >= 0 && digits < 6) {
          v = v * 16 + HexValue(text[(*pos)++]);
          ++digits;
        }
        if (digits == 0 || *pos >= text.size() || text[*pos] != '}' || v > kMaxCodepoint) {
          return ErrorAt(at, "bad \\u{...} escape");
        }
        ++*pos;
        e.cp = v;
        return e;
      }
      absl::StatusOr<uint32_t> v = ReadHex(text, pos, 4);
      if (!v.ok()) return v.status();
      e.cp = *v;
      return e;
    }
    case 'b':
    case 'B':
      return ErrorAt(at, "word boundaries (\\b, \\B) are not supported");
    case 'A':
    case 'z':
    case 'Z':
      return ErrorAt(at, "anchors (\\A, \\z, \\Z) are not supported");
    case 'p':
    case 'P':
      return ErrorAt(at, "Unicode property classes (\\p, \\P) are not supported");
    default:
      if (c >= '1' && c <= '9') return ErrorAt(at, "backreferences are not supported");
      if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
        return ErrorAt(at, absl::StrCat("unknown escape \\", std::string(1, c)));
      }
      --*pos;
      e.cp = NextCodepoint(text, pos);
      return e;
  }
}

// Bounds the parser's recursion on hostile input.
constexpr int kMaxNesting = 200;

class RegexParser {
 public:
  RegexParser(Grammar* g, absl::string_view text, RegexTarget target)
      : g_(g), text_(text), target_(target) {}

  absl::StatusOr<int32_t> Parse() {
    if (!text_.empty() && text_[0] == '^') pos_ = 1;
    absl::StatusOr<int32_t> e = ParseAlternation();
    if (!e.ok()) return e;
    if (pos_ < text_.size()) {
      if (text_[pos_] == ')') return ErrorAt(pos_, "unbalanced ')'");
      return ErrorAt(pos_, "unexpected character");
    }
    return e;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }

  absl::StatusOr<int32_t> ParseAlternation() {
    std::vector<int32_t> alts;
    while (true) {
      absl::StatusOr<int32_t> s = ParseSequence();
      if (!s.ok()) return s;
      alts.push_back(*s);
      if (AtEnd() || text_[pos_] != '|') break;
      ++pos_;
    }
    return g_->Alternation(std::move(alts));
  }

  absl::StatusOr<int32_t> ParseSequence() {
    std::vector<int32_t> items;
    while (!AtEnd() && text_[pos_] != '|' && text_[pos_] != ')') {
      if (text_[pos_] == '$') {
        // Only as the last character of the pattern (or of a top-level alternative).
        if (pos_ + 1 == text_.size() || (depth_ == 0 && text_[pos_ + 1] == '|')) {
          ++pos_;
          continue;
        }
        return ErrorAt(pos_, "'$' is only supported at the end of the pattern");
      }
      if (text_[pos_] == '^') {
        if (depth_ == 0 && items.empty() && pos_ > 0 && text_[pos_ - 1] == '|') {
          ++pos_;
          continue;
        }
        return ErrorAt(pos_, "'^' is only supported at the start of the pattern");
      }
      absl::StatusOr<int32_t> atom = ParseAtom();
      if (!atom.ok()) return atom;
      absl::StatusOr<int32_t> q = ParseQuantifiers(*atom);
      if (!q.ok()) return q;
      items.push_back(*q);
    }
    return g_->Sequence(std::move(items));
  }

  absl::StatusOr<int32_t> ParseQuantifiers(int32_t atom) {
    int32_t e = atom;
    for (int count = 0; !AtEnd(); ++count) {
      // Each quantifier nests the expression once more; bounds the compile's recursion.
      if (count > 4) return ErrorAt(pos_, "more than 4 quantifiers in a row");
      const char c = text_[pos_];
      int32_t min, max;
      const size_t at = pos_;
      if (c == '*') {
        min = 0, max = kUnbounded;
        ++pos_;
      } else if (c == '+') {
        min = 1, max = kUnbounded;
        ++pos_;
      } else if (c == '?') {
        min = 0, max = 1;
        ++pos_;
      } else if (c == '{') {
        size_t p = pos_ + 1;
        auto number = [&](int32_t* out) {
          size_t start = p;
          int64_t v = 0;
          while (p < text_.size() && text_[p] >= '0' && text_[p] <= '9' && v < 100000) {
            v = v * 10 + (text_[p++] - '0');
          }
          *out = static_cast<int32_t>(v);
          return p > start;
        };
        if (!number(&min)) return ErrorAt(at, "bad repetition {m,n}");
        max = min;
        if (p < text_.size() && text_[p] == ',') {
          ++p;
          if (!number(&max)) max = kUnbounded;
        }
        if (p >= text_.size() || text_[p] != '}') return ErrorAt(at, "bad repetition {m,n}");
        if (max != kUnbounded && max < min) return ErrorAt(at, "repetition {m,n} with n < m");
        pos_ = p + 1;
      } else {
        break;
      }
      if (!AtEnd() && text_[pos_] == '?') ++pos_;  // lazy: same strings
      if (!AtEnd() && text_[pos_] == '+') {
        return ErrorAt(pos_, "possessive quantifiers are not supported");
      }
      e = g_->Repeat(e, min, max);
    }
    return e;
  }

  int32_t Chars(const CodepointRanges& ranges) {
    if (target_ == RegexTarget::kJsonString) return JsonStringChars(g_, NormalizeRanges(ranges));
    return g_->CharClass(ranges);
  }

  absl::StatusOr<int32_t> ParseAtom() {
    const size_t at = pos_;
    const char c = text_[pos_];
    if (c == '(') {
      ++pos_;
      if (!AtEnd() && text_[pos_] == '?') {
        ++pos_;
        if (!AtEnd() && text_[pos_] == ':') {
          ++pos_;
        } else if (!AtEnd() && (text_[pos_] == '<' || text_[pos_] == 'P') &&
                   !(text_[pos_] == '<' && pos_ + 1 < text_.size() &&
                     (text_[pos_ + 1] == '=' || text_[pos_ + 1] == '!'))) {
          if (text_[pos_] == 'P') ++pos_;
          if (AtEnd() || text_[pos_] != '<') return ErrorAt(at, "bad named group");
          const size_t close = text_.find('>', pos_);
          if (close == absl::string_view::npos) return ErrorAt(at, "bad named group");
          pos_ = close + 1;
        } else if (!AtEnd() && (text_[pos_] == '=' || text_[pos_] == '!' || text_[pos_] == '<')) {
          return ErrorAt(at, "lookaround assertions are not supported");
        } else {
          return ErrorAt(at, "inline flags and other (?...) groups are not supported");
        }
      }
      if (++depth_ > kMaxNesting) return ErrorAt(at, "groups are nested too deeply");
      absl::StatusOr<int32_t> inner = ParseAlternation();
      --depth_;
      if (!inner.ok()) return inner;
      if (AtEnd() || text_[pos_] != ')') return ErrorAt(at, "unclosed '('");
      ++pos_;
      return inner;
    }
    if (c == '[') {
      absl::StatusOr<CodepointRanges> r = ParseCharClass(text_, &pos_);
      if (!r.ok()) return r.status();
      return Chars(*r);
    }
    if (c == '.') {
      ++pos_;
      return Chars(ComplementRanges(CodepointRanges{{'\n', '\n'}}));
    }
    if (c == '*' || c == '+' || c == '?' || c == '{') {
      return ErrorAt(at, "quantifier without anything to repeat");
    }
    if (c == '\\') {
      ++pos_;
      absl::StatusOr<Escape> e = ParseEscape(text_, &pos_);
      if (!e.ok()) return e.status();
      if (e->is_class) return Chars(e->ranges);
      return Chars({{e->cp, e->cp}});
    }
    const uint32_t cp = NextCodepoint(text_, &pos_);
    return Chars({{cp, cp}});
  }

  Grammar* g_;
  absl::string_view text_;
  RegexTarget target_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

uint32_t NextCodepoint(absl::string_view text, size_t* pos) {
  const unsigned char c = text[*pos];
  int len = c < 0x80             ? 1
            : (c & 0xE0) == 0xC0 ? 2
            : (c & 0xF0) == 0xE0 ? 3
            : (c & 0xF8) == 0xF0 ? 4
                                 : 0;
  if (len == 0 || *pos + len > text.size()) {
    ++*pos;
    return 0xFFFD;
  }
  uint32_t cp = len == 1 ? c : len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int i = 1; i < len; ++i) {
    const unsigned char cc = text[*pos + i];
    if ((cc & 0xC0) != 0x80) {
      ++*pos;
      return 0xFFFD;
    }
    cp = (cp << 6) | (cc & 0x3F);
  }
  *pos += len;
  return cp;
}

std::string EncodeCodepoint(uint32_t cp) {
  std::string out;
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
  return out;
}

int32_t JsonStringChars(Grammar* g, const CodepointRanges& ranges) {
  // Raw: everything but '"', '\\' and control characters.
  CodepointRanges raw_allowed =
      ComplementRanges(NormalizeRanges({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}));
  CodepointRanges raw;
  std::vector<int32_t> alts;
  for (const auto& [lo, hi] : ranges) {
    for (const auto& [alo, ahi] : raw_allowed) {
      const uint32_t l = std::max(lo, alo), h = std::min(hi, ahi);
      if (l <= h) raw.emplace_back(l, h);
    }
    for (uint32_t c = lo; c <= hi && c <= 0x5C; ++c) {
      if (c >= 0x20 && c != '"' && c != '\\') continue;
      std::string esc;
      switch (c) {
        case '"':
          esc = "\\\"";
          break;
        case '\\':
          esc = "\\\\";
          break;
        case '\n':
          esc = "\\n";
          break;
        case '\t':
          esc = "\\t";
          break;
        case '\r':
          esc = "\\r";
          break;
        case '\b':
          esc = "\\b";
          break;
        case '\f':
          esc = "\\f";
          break;
        default:
          esc = absl::StrFormat("\\u%04x", c);
      }
      alts.push_back(g->Bytes(esc));
    }
  }
  if (!raw.empty()) alts.insert(alts.begin(), g->CharClass(raw));
  if (alts.empty()) return g->CharClass({});
  return g->Alternation(std::move(alts));
}

absl::StatusOr<CodepointRanges> ParseCharClass(absl::string_view text, size_t* pos) {
  const size_t at = *pos;
  ++*pos;  // '['
  bool negated = false;
  if (*pos < text.size() && text[*pos] == '^') {
    negated = true;
    ++*pos;
  }
  CodepointRanges ranges;
  bool first = true;
  while (true) {
    if (*pos >= text.size()) return ErrorAt(at, "unclosed '['");
    if (text[*pos] == ']' && !first) {
      ++*pos;
      break;
    }
    first = false;
    uint32_t lo;
    if (text[*pos] == '\\') {
      ++*pos;
      absl::StatusOr<Escape> e = ParseEscape(text, pos);
      if (!e.ok()) return e.status();
      if (e->is_class) {
        ranges.insert(ranges.end(), e->ranges.begin(), e->ranges.end());
        continue;
      }
      lo = e->cp;
    } else if (text[*pos] == '[' && *pos + 1 < text.size() && text[*pos + 1] == ':') {
      return ErrorAt(*pos, "POSIX classes ([:alpha:]) are not supported");
    } else {
      lo = NextCodepoint(text, pos);
    }
    uint32_t hi = lo;
    if (*pos + 1 < text.size() && text[*pos] == '-' && text[*pos + 1] != ']') {
      ++*pos;
      if (text[*pos] == '\\') {
        ++*pos;
        absl::StatusOr<Escape> e = ParseEscape(text, pos);
        if (!e.ok()) return e.status();
        if (e->is_class) return ErrorAt(*pos, "a class escape cannot end a range");
        hi = e->cp;
      } else {
        hi = NextCodepoint(text, pos);
      }
      if (hi < lo) return ErrorAt(at, "character range out of order");
    }
    ranges.emplace_back(lo, hi);
  }
  ranges = NormalizeRanges(std::move(ranges));
  if (negated) ranges = ComplementRanges(ranges);
  return ranges;
}

absl::StatusOr<int32_t> AddRegex(Grammar* grammar, absl::string_view pattern, RegexTarget target) {
  return RegexParser(grammar, pattern, target).Parse();
}

absl::StatusOr<Grammar> RegexGrammar(absl::string_view pattern) {
  Grammar g;
  absl::StatusOr<int32_t> e = AddRegex(&g, pattern);
  if (!e.ok()) return e.status();
  const int32_t root = g.Rule("root");
  g.SetBody(root, *e);
  g.SetRoot(root);
  return g;
}

}  // namespace deepinfer::grammar
