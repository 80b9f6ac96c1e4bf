#include "tokenizer/jinja/lexer.h"

#include <cctype>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer::jinja {
namespace {

// JavaScript's whitespace (\s, String.prototype.trim), which @huggingface/jinja uses around
// whitespace-control markers: byte length of such a character at text[pos], or 0.
size_t JsSpaceAt(absl::string_view text, size_t pos) {
  const size_t length = ValidUtf8SequenceLength(text, pos);
  if (length == 0) return 0;
  size_t n;
  const char32_t c = DecodeCodePoint(text, pos, &n);
  return c == 0xFEFF || (c != 0x85 && IsUnicodeWhitespace(c)) ? length : 0;
}

void TrimJsSpaceEnd(std::string* text) {
  while (!text->empty()) {
    size_t start = text->size() - 1;
    while (start > 0 && (static_cast<uint8_t>((*text)[start]) & 0xC0) == 0x80) --start;
    if (JsSpaceAt(*text, start) != text->size() - start) return;
    text->resize(start);
  }
}

// lstrip_blocks: spaces/tabs at a line start before "{%" / "{#" go; trim_blocks: a newline
// right after "%}" / "#}" goes. A single trailing newline of the template goes too.
std::string Preprocess(absl::string_view source) {
  if (!source.empty() && source.back() == '\n') source.remove_suffix(1);
  std::string lstripped;
  lstripped.reserve(source.size());
  size_t i = 0;
  while (i < source.size()) {
    const bool line_start = i == 0 || source[i - 1] == '\n' || source[i - 1] == '\r';
    if (line_start) {
      size_t j = i;
      while (j < source.size() && (source[j] == ' ' || source[j] == '\t')) ++j;
      if (j + 1 < source.size() && source[j] == '{' &&
          (source[j + 1] == '%' || source[j + 1] == '#' || source[j + 1] == '-')) {
        i = j;
      }
    }
    // Copy up to and including the next line break.
    while (i < source.size()) {
      const char c = source[i++];
      lstripped.push_back(c);
      if (c == '\n' || c == '\r') break;
    }
  }
  std::string out;
  out.reserve(lstripped.size());
  for (size_t k = 0; k < lstripped.size(); ++k) {
    out.push_back(lstripped[k]);
    if (lstripped[k] == '}' && k > 0 && k + 1 < lstripped.size() && lstripped[k + 1] == '\n' &&
        (lstripped[k - 1] == '%' || lstripped[k - 1] == '#' || lstripped[k - 1] == '-')) {
      ++k;
    }
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<Token>> Tokenize(absl::string_view raw_source) {
  const std::string source = Preprocess(raw_source);
  std::vector<Token> tokens;
  size_t pos = 0;
  bool in_tag = false;
  auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(
        absl::StrCat("template syntax error at offset ", pos, ": ", what));
  };
  auto strip_trailing_text = [&tokens] {
    if (!tokens.empty() && tokens.back().type == Token::Type::kText) {
      std::string& text = tokens.back().text;
      TrimJsSpaceEnd(&text);
      if (text.empty()) tokens.pop_back();
    }
  };
  auto skip_space = [&] {
    while (pos < source.size()) {
      const size_t n = JsSpaceAt(source, pos);
      if (n == 0) break;
      pos += n;
    }
  };
  int brace_depth = 0;
  while (pos < source.size()) {
    if (!in_tag) {
      const size_t start = pos;
      while (pos < source.size() &&
             !(source[pos] == '{' && pos + 1 < source.size() &&
               (source[pos + 1] == '%' || source[pos + 1] == '{' || source[pos + 1] == '#'))) {
        ++pos;
      }
      if (pos > start)
        tokens.push_back({Token::Type::kText, source.substr(start, pos - start), start});
      if (pos >= source.size()) break;
      if (source[pos + 1] == '#') {
        const size_t end = source.find("#}", pos + 2);
        if (end == std::string::npos) return error("missing end of comment tag");
        if (source[pos + 2] == '-') strip_trailing_text();
        const bool strip_after = end > pos + 2 && source[end - 1] == '-';
        pos = end + 2;
        if (strip_after) skip_space();
        continue;
      }
      const bool statement = source[pos + 1] == '%';
      const size_t open_at = pos;
      pos += 2;
      if (pos < source.size() && source[pos] == '-') {
        strip_trailing_text();
        ++pos;
      }
      tokens.push_back({statement ? Token::Type::kOpenStatement : Token::Type::kOpenExpression,
                        statement ? "{%" : "{{", open_at});
      in_tag = true;
      brace_depth = 0;
      continue;
    }
    skip_space();
    if (pos >= source.size()) return error("unexpected end of template inside a tag");
    const char c = source[pos];
    const size_t start = pos;
    // Closing markers, optionally with whitespace control.
    if (c == '-' && pos + 2 < source.size() + 0 && pos + 2 <= source.size()) {
      if (source.compare(pos, 3, "-%}") == 0 ||
          (brace_depth == 0 && source.compare(pos, 3, "-}}") == 0)) {
        const bool statement = source[pos + 1] == '%';
        tokens.push_back({statement ? Token::Type::kCloseStatement : Token::Type::kCloseExpression,
                          statement ? "%}" : "}}", pos});
        pos += 3;
        skip_space();
        in_tag = false;
        continue;
      }
    }
    if (source.compare(pos, 2, "%}") == 0 ||
        (brace_depth == 0 && source.compare(pos, 2, "}}") == 0)) {
      const bool statement = c == '%';
      tokens.push_back({statement ? Token::Type::kCloseStatement : Token::Type::kCloseExpression,
                        statement ? "%}" : "}}", pos});
      pos += 2;
      in_tag = false;
      continue;
    }
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      while (pos < source.size() &&
             (std::isalnum(static_cast<unsigned char>(source[pos])) || source[pos] == '_')) {
        ++pos;
      }
      tokens.push_back({Token::Type::kName, source.substr(start, pos - start), start});
      continue;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      while (pos < source.size() && std::isdigit(static_cast<unsigned char>(source[pos]))) ++pos;
      bool is_float = false;
      const bool after_dot = !tokens.empty() && tokens.back().type == Token::Type::kSymbol &&
                             tokens.back().text == ".";
      if (!after_dot && pos + 1 < source.size() && source[pos] == '.' &&
          std::isdigit(static_cast<unsigned char>(source[pos + 1]))) {
        is_float = true;
        ++pos;
        while (pos < source.size() && std::isdigit(static_cast<unsigned char>(source[pos]))) ++pos;
      }
      if (pos < source.size() && (source[pos] == 'e' || source[pos] == 'E')) {
        size_t k = pos + 1;
        if (k < source.size() && (source[k] == '+' || source[k] == '-')) ++k;
        if (k < source.size() && std::isdigit(static_cast<unsigned char>(source[k]))) {
          is_float = true;
          pos = k;
          while (pos < source.size() && std::isdigit(static_cast<unsigned char>(source[pos])))
            ++pos;
        }
      }
      tokens.push_back({is_float ? Token::Type::kFloat : Token::Type::kInteger,
                        source.substr(start, pos - start), start});
      continue;
    }
    if (c == '\'' || c == '"') {
      std::string value;
      ++pos;
      while (true) {
        if (pos >= source.size()) return error("unterminated string literal");
        const char d = source[pos++];
        if (d == c) break;
        if (d != '\\') {
          value.push_back(d);
          continue;
        }
        if (pos >= source.size()) return error("unterminated string literal");
        const char e = source[pos++];
        switch (e) {
          case 'n':
            value.push_back('\n');
            break;
          case 't':
            value.push_back('\t');
            break;
          case 'r':
            value.push_back('\r');
            break;
          case 'b':
            value.push_back('\b');
            break;
          case 'f':
            value.push_back('\f');
            break;
          case 'v':
            value.push_back('\v');
            break;
          case '\\':
            value.push_back('\\');
            break;
          case '\'':
            value.push_back('\'');
            break;
          case '"':
            value.push_back('"');
            break;
          default:
            return error(absl::StrCat("unexpected escaped character '", std::string(1, e), "'"));
        }
      }
      tokens.push_back({Token::Type::kString, std::move(value), start});
      continue;
    }
    static const char* const kSymbols[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                           "]",  "{",  "}",  ",",  ".",  ":",  "|"};
    bool matched = false;
    for (const char* symbol : kSymbols) {
      const size_t length = std::char_traits<char>::length(symbol);
      if (source.compare(pos, length, symbol) == 0) {
        if (symbol[0] == '{' && length == 1) ++brace_depth;
        if (symbol[0] == '}' && length == 1) --brace_depth;
        tokens.push_back({Token::Type::kSymbol, symbol, pos});
        pos += length;
        matched = true;
        break;
      }
    }
    if (!matched) return error(absl::StrCat("unexpected character '", std::string(1, c), "'"));
  }
  if (in_tag) return error("unexpected end of template inside a tag");
  return tokens;
}

}  // namespace deepinfer::tokenizer::jinja
