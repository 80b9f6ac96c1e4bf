// Token masks over the real DeepSeek-V3 vocabulary (129,280 rows; installed by
// tools/ci/setup.d/tokenizer_npm.sh) agree, token by token, with AcceptToken on every grammar
// state along valid documents: the cache's trie walks decide exactly what a walk of each
// token's bytes decides.
#include <memory>
#include <string>
#include <vector>

#include "common/grammar/grammar_matcher.h"
#include "common/grammar/structured_output.h"
#include "common/grammar/token_vocabulary.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/reference_runner.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::grammar {
namespace {

struct Case {
  StructuredOutput::Kind kind;
  const char* spec;
  const char* document;
};

const Case kCases[] = {
    {StructuredOutput::Kind::kJsonSchema,
     R"j({"type":"object","properties":{"name":{"type":"string"},"nick":{"type":"string","maxLength":12},"age":{"type":"integer","minimum":0,"maximum":150},"tags":{"type":"array","items":{"enum":["a b","c\"d"]}},"when":{"type":"string","format":"date-time"},"home":{"anyOf":[{"type":"string"},{"type":"null"}]}},"required":["name","age"],"additionalProperties":false})j",
     R"j({"name": "Zoë \"Ada\" 中文\n", "nick": "é中😀x", "age": 36, "tags": ["a b", "c\"d"], "when": "2025-03-04T09:30:00Z", "home": null})j"},
    {StructuredOutput::Kind::kJsonObject, "",
     R"j({"answer": "Canberra, 澳大利亚", "n": [1, -2.5e3, true, null], "o": {"k\\": "\u00e9"}})j"},
    {StructuredOutput::Kind::kRegex, R"j(\(\d{3}\) [a-zé]+ \w{2,5}-\d{4})j",
     "(555) abcé word-1234"},
    {StructuredOutput::Kind::kGrammar,
     R"g(root ::= item ("," " "? item)*
item ::= [0-9]+ | "\"" [^"\\]* "\""
)g",
     R"g(12, "x y", 345,"中")g"},
};

TEST(GrammarMatcherTokenizerTest, MasksAgreeWithAcceptTokenAlongDocuments) {
  absl::StatusOr<std::string> dir = tokenizer::testing::ReferenceModelDir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto tok = tokenizer::Tokenizer::FromDirectory(*dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::optional<uint32_t> eos = (*tok)->TokenToId("<｜end▁of▁sentence｜>");
  ASSERT_TRUE(eos.has_value());
  auto vocab = TokenVocabulary::FromTokenizer(**tok, 129280, {static_cast<int32_t>(*eos)});
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  int states = 0;
  for (const Case& c : kCases) {
    StructuredOutput spec;
    spec.kind = c.kind;
    spec.text = c.spec;
    auto grammar = CompileStructuredOutput(spec);
    ASSERT_TRUE(grammar.ok()) << grammar.status();
    auto cache = std::make_shared<TokenMaskCache>(*grammar, *vocab);
    GrammarMatcher m(cache);
    std::vector<int32_t> document;
    for (uint32_t id : (*tok)->Encode(c.document, false)) document.push_back(id);
    document.push_back(static_cast<int32_t>(*eos));
    std::vector<uint32_t> mask((*vocab)->mask_words());
    for (size_t step = 0; step < document.size(); ++step) {
      m.FillNextTokenBitmask(mask.data());
      for (int32_t t = 0; t < (*vocab)->size(); ++t) {
        const bool in_mask = mask[t >> 5] >> (t & 31) & 1;
        const bool accepted = m.AcceptToken(t);
        if (accepted) m.Rollback(1);
        ASSERT_EQ(in_mask, accepted) << c.document << ": step " << step << ", token " << t << " '"
                                     << (*vocab)->bytes(t) << "'";
      }
      ++states;
      ASSERT_TRUE(m.AcceptToken(document[step]))
          << c.document << ": token " << step << " of the document is not allowed";
    }
    EXPECT_TRUE(m.IsTerminated()) << c.document;
  }
  EXPECT_GT(states, 60);
}

}  // namespace
}  // namespace deepinfer::grammar
