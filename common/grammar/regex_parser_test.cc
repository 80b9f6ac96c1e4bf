#include "common/grammar/regex_parser.h"

#include <random>
#include <regex>
#include <string>

#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar_test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::grammar {
namespace {

using ::testing::HasSubstr;

std::shared_ptr<const CompiledGrammar> CompileRegex(const std::string& pattern) {
  absl::StatusOr<Grammar> g = RegexGrammar(pattern);
  EXPECT_TRUE(g.ok()) << pattern << ": " << g.status();
  if (!g.ok()) return nullptr;
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Compile(*g);
  EXPECT_TRUE(c.ok()) << pattern << ": " << c.status();
  return c.ok() ? *c : nullptr;
}

// A random string the matcher allows, byte by byte, ended as soon as it is complete with
// probability 1/3 (nullopt when it ran past 64 bytes).
std::optional<std::string> RandomSentence(const std::shared_ptr<TokenMaskCache>& cache,
                                          std::mt19937* rng) {
  GrammarMatcher m(cache);
  std::vector<uint32_t> mask(m.vocabulary().mask_words());
  std::string out;
  while (out.size() < 64) {
    if (m.IsComplete() && (*rng)() % 3 == 0) return out;
    m.FillNextTokenBitmask(mask.data());
    std::vector<int> allowed;
    for (int b = 0; b < 256; ++b) {
      if (mask[b >> 5] >> (b & 31) & 1) allowed.push_back(b);
    }
    if (allowed.empty()) return m.IsComplete() ? std::optional<std::string>(out) : std::nullopt;
    const int b = allowed[(*rng)() % allowed.size()];
    EXPECT_TRUE(m.AcceptToken(b));
    out.push_back(static_cast<char>(b));
  }
  return std::nullopt;
}

// Code points of UTF-8 text (std::wregex works on code points, std::regex on bytes).
std::wstring Wide(const std::string& s) {
  std::wstring out;
  size_t pos = 0;
  while (pos < s.size()) out.push_back(static_cast<wchar_t>(NextCodepoint(s, &pos)));
  return out;
}

// Agreement with std::wregex (ECMAScript, whole-string match) on strings the grammar generates
// and on random strings over the pattern's alphabet.
TEST(RegexParserTest, AgreesWithStdRegex) {
  const std::vector<std::string> patterns = {
      "abc",
      "a|b|cd",
      "(ab)*c",
      "[a-c]+d?",
      "[^a]{2,3}b",
      "(a|b)(c|d){1,2}",
      "\\d{3}-\\d{4}",
      "\\w+@\\w+\\.com",
      "(?:ab|a)(?:bc|c)",
      "a.c",
      "[-a]x",
      "x{0,2}y{2,}",
      "(a*b*)*c",
      "\\(\\)\\[\\]\\.\\*",
      "[\\s]a\\S",
      "(0|[1-9][0-9]*)(\\.[0-9]+)?",
      "^ab$",
  };
  const std::string alphabet = "abcdxy0123456789-.@_ ()[]*\n";
  std::mt19937 rng(7);
  for (const std::string& p : patterns) {
    auto g = CompileRegex(p);
    ASSERT_NE(g, nullptr);
    std::wregex re(Wide(p), std::regex::ECMAScript);
    auto cache = std::make_shared<TokenMaskCache>(g, ByteVocabulary());
    int generated = 0;
    for (int i = 0; i < 200; ++i) {
      std::optional<std::string> s = RandomSentence(cache, &rng);
      if (!s) continue;
      ++generated;
      EXPECT_TRUE(std::regex_match(Wide(*s), re)) << p << " generated '" << *s << "'";
    }
    EXPECT_GT(generated, 20) << p;
    for (int i = 0; i < 1500; ++i) {
      std::string s;
      const int len = rng() % 8;
      for (int k = 0; k < len; ++k) s.push_back(alphabet[rng() % alphabet.size()]);
      EXPECT_EQ(Matches(g, s), std::regex_match(Wide(s), re)) << p << " on '" << s << "'";
    }
  }
}

TEST(RegexParserTest, UnicodeClasses) {
  auto g = CompileRegex("[^a]");
  ASSERT_NE(g, nullptr);
  for (const char* ok : {"b", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x98\x80", "\xEF\xBF\xBF"}) {
    EXPECT_TRUE(Matches(g, ok)) << ok;
  }
  // Not UTF-8: a lone continuation byte, an overlong form, a surrogate, beyond U+10FFFF.
  for (const char* bad : {"a", "\x80", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xC3"}) {
    EXPECT_FALSE(Matches(g, bad)) << bad;
  }
}

TEST(RegexParserTest, Errors) {
  auto error = [](const std::string& p) {
    absl::StatusOr<Grammar> g = RegexGrammar(p);
    return g.ok() ? std::string() : std::string(g.status().message());
  };
  EXPECT_THAT(error("(a)\\1"), HasSubstr("backreferences are not supported"));
  EXPECT_THAT(error("a(?=b)"), HasSubstr("lookaround"));
  EXPECT_THAT(error("\\bword"), HasSubstr("word boundaries"));
  EXPECT_THAT(error("a^b"), HasSubstr("'^' is only supported at the start"));
  EXPECT_THAT(error("a$b"), HasSubstr("'$' is only supported at the end"));
  EXPECT_THAT(error("(ab"), HasSubstr("unclosed '('"));
  EXPECT_THAT(error("ab)"), HasSubstr("unbalanced ')'"));
  EXPECT_THAT(error("*a"), HasSubstr("quantifier without anything to repeat"));
  EXPECT_THAT(error("a{3,1}"), HasSubstr("n < m"));
  EXPECT_THAT(error("[abc"), HasSubstr("unclosed '['"));
  EXPECT_THAT(error("(?i)a"), HasSubstr("inline flags"));
}

TEST(Utf8RangeSequencesTest, EveryCodePointEncodesIntoExactlyOneSequence) {
  const std::vector<std::pair<uint32_t, uint32_t>> ranges = {{0, 0x10FFFF},       {0x7F, 0x80},
                                                             {0x7FF, 0x801},      {0xD7FF, 0xE000},
                                                             {0x10000, 0x10FFFF}, {0x123, 0x4567}};
  for (const auto& [lo, hi] : ranges) {
    const auto seqs = Utf8RangeSequences(lo, hi);
    for (uint32_t cp = (lo > 0x200 ? lo - 0x200 : 0); cp <= std::min(hi + 0x200, kMaxCodepoint);
         cp += (cp < 0x20000 ? 1 : 97)) {
      const std::string enc = EncodeCodepoint(cp);
      int matched = 0;
      for (const auto& seq : seqs) {
        if (seq.size() != enc.size()) continue;
        bool ok = true;
        for (size_t i = 0; i < seq.size(); ++i) {
          const uint8_t b = static_cast<uint8_t>(enc[i]);
          ok = ok && b >= seq[i].first && b <= seq[i].second;
        }
        matched += ok;
      }
      const bool in = cp >= lo && cp <= hi && !(cp >= 0xD800 && cp <= 0xDFFF);
      EXPECT_EQ(matched, in ? 1 : 0) << std::hex << cp << " in [" << lo << ", " << hi << "]";
    }
  }
}

}  // namespace
}  // namespace deepinfer::grammar
