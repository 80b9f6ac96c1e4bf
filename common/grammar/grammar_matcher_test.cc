#include "common/grammar/grammar_matcher.h"

#include <random>
#include <string>
#include <vector>

#include "common/grammar/ebnf_parser.h"
#include "common/grammar/grammar_test_util.h"
#include "common/grammar/json_schema_grammar.h"
#include "gtest/gtest.h"

namespace deepinfer::grammar {
namespace {

std::shared_ptr<const CompiledGrammar> CompileEbnf(const std::string& text) {
  absl::StatusOr<Grammar> g = ParseEbnf(text);
  EXPECT_TRUE(g.ok()) << g.status();
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Compile(*g);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Tokens of 1-4 bytes over an alphabet the grammars use, plus the single bytes, and stop
// token 0 and an unusable token 1.
std::shared_ptr<const TokenVocabulary> MixedVocabulary(const std::string& alphabet, int count,
                                                       uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::string> tokens = {"", ""};
  for (char c : alphabet) tokens.push_back(std::string(1, c));
  for (int i = 0; i < count; ++i) {
    std::string t;
    const int len = 1 + rng() % 4;
    for (int k = 0; k < len; ++k) t.push_back(alphabet[rng() % alphabet.size()]);
    tokens.push_back(t);
  }
  return TokenVocabulary::Create(std::move(tokens), {0});
}

// The mask from the cache equals, token by token, what AcceptToken says, along random walks.
void CheckMasksAgainstAcceptToken(const std::shared_ptr<const CompiledGrammar>& g,
                                  const std::shared_ptr<const TokenVocabulary>& vocab,
                                  uint32_t seed) {
  auto cache = std::make_shared<TokenMaskCache>(g, vocab);
  std::mt19937 rng(seed);
  int completed = 0;
  for (int walk = 0; walk < 20; ++walk) {
    GrammarMatcher m(cache);
    std::vector<uint32_t> mask(vocab->mask_words());
    for (int step = 0; step < 40 && !m.IsTerminated(); ++step) {
      m.FillNextTokenBitmask(mask.data());
      std::vector<int32_t> allowed;
      for (int32_t t = 0; t < vocab->size(); ++t) {
        const bool in_mask = mask[t >> 5] >> (t & 31) & 1;
        const bool accepted = m.AcceptToken(t);
        if (accepted) m.Rollback(1);
        ASSERT_EQ(in_mask, accepted)
            << "token " << t << " '" << vocab->bytes(t) << "' step " << step;
        if (accepted) allowed.push_back(t);
      }
      ASSERT_FALSE(allowed.empty()) << "no token allowed at step " << step;
      // The stop token (id 0, first when allowed) is taken one time in four.
      const bool stop = allowed[0] == 0 && rng() % 4 == 0;
      ASSERT_TRUE(m.AcceptToken(stop ? 0 : allowed[rng() % allowed.size()]));
    }
    completed += m.IsTerminated();
  }
  EXPECT_GT(completed, 0);
}

TEST(GrammarMatcherTest, MaskAgreesWithAcceptTokenOnExpressions) {
  auto g = CompileEbnf(R"g(
    root   ::= expr
    expr   ::= term (("+" | "-") term)*
    term   ::= factor ("*" factor)*
    factor ::= [0-9]+ | "(" expr ")"
  )g");
  CheckMasksAgainstAcceptToken(g, MixedVocabulary("0123+-*()", 400, 1), 11);
}

TEST(GrammarMatcherTest, MaskAgreesWithAcceptTokenOnJson) {
  absl::StatusOr<Grammar> json = JsonSchemaGrammar(nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {"a": {"type": "integer", "minimum": -5, "maximum": 120},
                   "b": {"type": "array", "items": {"enum": ["x", "yz", null]}, "maxItems": 3},
                   "c": {"type": "string", "maxLength": 3}},
    "required": ["a"], "additionalProperties": false})"));
  ASSERT_TRUE(json.ok()) << json.status();
  auto g = CompiledGrammar::Compile(*json);
  ASSERT_TRUE(g.ok()) << g.status();
  CheckMasksAgainstAcceptToken(*g, MixedVocabulary("{}[]\":, abcxyz0129-nul\\", 600, 2), 12);
}

TEST(GrammarMatcherTest, StopTokenOnlyWhenComplete) {
  auto g = CompileEbnf("root ::= \"ab\" | \"abcd\"");
  auto cache = std::make_shared<TokenMaskCache>(g, ByteVocabulary());
  GrammarMatcher m(cache);
  EXPECT_FALSE(m.AcceptToken(256));
  EXPECT_TRUE(m.AcceptToken('a'));
  EXPECT_FALSE(m.IsComplete());
  EXPECT_TRUE(m.AcceptToken('b'));
  EXPECT_TRUE(m.IsComplete());
  std::vector<uint32_t> mask(m.vocabulary().mask_words());
  m.FillNextTokenBitmask(mask.data());
  EXPECT_TRUE(mask[256 >> 5] >> (256 & 31) & 1);
  EXPECT_TRUE(mask['c' >> 5] >> ('c' & 31) & 1);
  EXPECT_FALSE(mask['d' >> 5] >> ('d' & 31) & 1);
  EXPECT_TRUE(m.AcceptToken(256));
  EXPECT_TRUE(m.IsTerminated());
  EXPECT_FALSE(m.AcceptToken('c'));
  m.Rollback(1);
  EXPECT_FALSE(m.IsTerminated());
  EXPECT_TRUE(m.AcceptToken('c'));
  EXPECT_FALSE(m.IsComplete());
  m.Rollback(3);
  EXPECT_EQ(m.NumAcceptedTokens(), 0);
  EXPECT_FALSE(m.AcceptToken('b'));
  EXPECT_TRUE(m.AcceptBytes("abcd"));
  EXPECT_TRUE(m.IsComplete());
}

TEST(GrammarMatcherTest, RejectedTokenLeavesStateUnchanged) {
  auto g = CompileEbnf("root ::= \"x\"+ \"y\"");
  auto cache = std::make_shared<TokenMaskCache>(g, ByteVocabulary());
  GrammarMatcher m(cache);
  EXPECT_TRUE(m.AcceptBytes("xx"));
  EXPECT_FALSE(m.AcceptBytes("xz"));
  EXPECT_EQ(m.NumAcceptedTokens(), 1);
  EXPECT_TRUE(m.AcceptBytes("xy"));
  EXPECT_TRUE(m.IsComplete());
}

}  // namespace
}  // namespace deepinfer::grammar
