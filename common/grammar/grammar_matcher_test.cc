#include "common/grammar/grammar_matcher.h"

#include <algorithm>
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

// Tokens spelled from pieces that exercise the trie walk: multi-byte UTF-8 characters, their
// partial byte sequences, quotes and escapes inside and at the ends of tokens, long tokens
// sharing long prefixes, and tokens with the same bytes as another; plus every single byte.
std::shared_ptr<const TokenVocabulary> TrieVocabulary(uint32_t seed) {
  const std::vector<std::string> pieces = {"a",
                                           "b",
                                           "x",
                                           "0",
                                           "1",
                                           "9",
                                           " ",
                                           "\"",
                                           "\\",
                                           ",",
                                           ":",
                                           "{",
                                           "}",
                                           "[",
                                           "]",
                                           "-",
                                           ".",
                                           "e",
                                           "n",
                                           "u",
                                           "l",
                                           "t",
                                           "r",
                                           "f",
                                           "\n",
                                           "\xc3\xa9",
                                           "\xe4\xb8\xad",
                                           "\xf0\x9f\x98\x80",
                                           "\xe4",
                                           "\xb8",
                                           "\xad\xe4",
                                           "\xc3",
                                           "\\u00",
                                           "\\n",
                                           "true",
                                           "null",
                                           "abc"};
  std::mt19937 rng(seed);
  std::vector<std::string> tokens = {"", ""};
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  for (int i = 0; i < 1200; ++i) {
    std::string t;
    const int len = 1 + rng() % 6;
    for (int k = 0; k < len; ++k) t += pieces[rng() % pieces.size()];
    tokens.push_back(t);
    // A longer token extending this one, and now and then one with the same bytes.
    if (rng() % 3 == 0) tokens.push_back(t + pieces[rng() % pieces.size()] + t);
    if (rng() % 50 == 0) tokens.push_back(t);
  }
  return TokenVocabulary::Create(std::move(tokens), {0});
}

TEST(TokenVocabularyTest, TrieSubtreesHoldTheTokensWithTheirPrefix) {
  auto vocab = TrieVocabulary(3);
  const std::vector<int32_t>& sorted = vocab->sorted();
  std::string path;
  for (int32_t i = 0; i < vocab->trie_size(); ++i) {
    const TokenVocabulary::TrieNode& t = vocab->trie(i);
    path.resize(t.depth - 1);
    path.push_back(static_cast<char>(t.byte));
    int32_t first = -1, last = -1, here = 0;
    for (int32_t k = 0; k < static_cast<int32_t>(sorted.size()); ++k) {
      const std::string& bytes = vocab->bytes(sorted[k]);
      if (bytes.compare(0, path.size(), path) != 0) continue;
      if (first < 0) first = k;
      ASSERT_TRUE(last < 0 || last == k - 1)
          << "tokens with prefix '" << path << "' not contiguous";
      last = k;
      here += bytes == path;
    }
    ASSERT_GE(first, 0) << "node " << i << " '" << path << "' has no token";
    EXPECT_EQ(t.token_begin, first) << path;
    EXPECT_EQ(vocab->trie_token_end(i), last + 1) << path;
    EXPECT_EQ(vocab->trie_tokens_here(i), here) << path;
    uint64_t below[4] = {0, 0, 0, 0};
    for (int32_t k = first; k <= last; ++k) {
      const std::string& bytes = vocab->bytes(sorted[k]);
      for (size_t d = path.size(); d < bytes.size(); ++d) {
        const uint8_t b = static_cast<uint8_t>(bytes[d]);
        below[b >> 6] |= uint64_t{1} << (b & 63);
      }
    }
    for (int w = 0; w < 4; ++w) EXPECT_EQ(vocab->trie_subtree_bytes(i)[w], below[w]) << path;
    // The subtree's nodes are those whose depth is greater, up to subtree_end.
    for (int32_t j = i + 1; j < t.subtree_end; ++j) ASSERT_GT(vocab->trie(j).depth, t.depth);
    if (t.subtree_end < vocab->trie_size()) {
      EXPECT_LE(vocab->trie(t.subtree_end).depth, t.depth);
    }
  }
}

TEST(GrammarMatcherTest, MaskAgreesWithAcceptTokenOnStringsAndUtf8) {
  absl::StatusOr<Grammar> json = JsonSchemaGrammar(nlohmann::ordered_json::parse(R"({
    "type": "object",
    "properties": {"s": {"type": "string"},
                   "short": {"type": "string", "maxLength": 4},
                   "list": {"type": "array", "items": {"anyOf": [{"type": "string"},
                                                                 {"type": "number"},
                                                                 {"type": "null"}]}},
                   "flag": {"type": "boolean"}},
    "required": ["s", "short"], "additionalProperties": false})"));
  ASSERT_TRUE(json.ok()) << json.status();
  auto g = CompiledGrammar::Compile(*json);
  ASSERT_TRUE(g.ok()) << g.status();
  CheckMasksAgainstAcceptToken(*g, TrieVocabulary(4), 13);
}

TEST(GrammarMatcherTest, MaskAgreesWithAcceptTokenOnAnyJsonObject) {
  auto g = CompiledGrammar::Compile(JsonObjectGrammar());
  ASSERT_TRUE(g.ok()) << g.status();
  CheckMasksAgainstAcceptToken(*g, TrieVocabulary(5), 14);
}

TEST(GrammarMatcherTest, MaskAgreesWithAcceptTokenOnNullableCalls) {
  // Rules that may be empty, called in a row, so a token can finish several of them.
  auto g = CompileEbnf(R"g(
    root  ::= item ("," item)* tail
    item  ::= sign? digit* word?
    sign  ::= "-"
    digit ::= [0-9]
    word  ::= [a-z\u00e9\u4e2d]+ | "\"" [^"]* "\""
    tail  ::= "" | "." tail
  )g");
  CheckMasksAgainstAcceptToken(g, TrieVocabulary(6), 15);
}

// Tokens spelled from pieces at the edges of the JSON string's units: exact UTF-8 at the ends
// of each lead byte's ranges and just past them (overlong forms, surrogates, above U+10FFFF,
// lone and cut sequences), escapes whole, cut and wrong, quotes, controls and DEL; plus every
// single byte.
std::shared_ptr<const TokenVocabulary> UnitVocabulary(uint32_t seed) {
  const std::vector<std::string> pieces = {"a",
                                           "Z",
                                           " ",
                                           "\"",
                                           "\\",
                                           "\\\"",
                                           "\\\\",
                                           "\\/",
                                           "\\n",
                                           "\\t",
                                           "\\u",
                                           "\\u00e9",
                                           "\\uD83D",
                                           "\\u12",
                                           "\\x",
                                           "\\uZ",
                                           "\n",
                                           "\t",
                                           "\x01",
                                           "\x1f",
                                           "\x7f",
                                           "}",
                                           ",",
                                           ":",
                                           "0",
                                           "e",
                                           "\xc2\x80",
                                           "\xdf\xbf",
                                           "\xc3\xa9",
                                           "\xc0\xaf",
                                           "\xc1\xbf",
                                           "\xe0\xa0\x80",
                                           "\xe0\x9f\xbf",
                                           "\xe4\xb8\xad",
                                           "\xed\x9f\xbf",
                                           "\xed\xa0\x80",
                                           "\xee\x80\x80",
                                           "\xef\xbf\xbf",
                                           "\xf0\x90\x80\x80",
                                           "\xf0\x8f\xbf\xbf",
                                           "\xf0\x9f\x98\x80",
                                           "\xf3\xbf\xbf\xbf",
                                           "\xf4\x8f\xbf\xbf",
                                           "\xf4\x90\x80\x80",
                                           "\xf5\x80\x80\x80",
                                           "\xe4",
                                           "\xe4\xb8",
                                           "\xf0\x9f",
                                           "\xb8",
                                           "\x80",
                                           "\xff"};
  std::mt19937 rng(seed);
  std::vector<std::string> tokens = {"", ""};
  for (int b = 0; b < 256; ++b) tokens.push_back(std::string(1, static_cast<char>(b)));
  for (int i = 0; i < 1500; ++i) {
    std::string t;
    const int len = 1 + rng() % 7;
    for (int k = 0; k < len; ++k) t += pieces[rng() % pieces.size()];
    tokens.push_back(t);
    if (rng() % 40 == 0) tokens.push_back(t);  // the same bytes twice
  }
  // Runs of one unit, up to past StringUnitTable::kMaxUnits, whole and then leaving.
  for (int n = 1; n <= 24; ++n) {
    tokens.push_back(std::string(n, 'a'));
    tokens.push_back(std::string(n, 'b') + "\"");
    tokens.push_back(std::string(n, 'c') + "\xe4\xb8");
  }
  return TokenVocabulary::Create(std::move(tokens), {0});
}

std::vector<int32_t> Sorted(std::vector<int32_t> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::vector<int32_t> AcceptedIds(const NodeTokenMasks& m) {
  if (m.accepted_bits.empty()) return Sorted(m.accepted_ids);
  std::vector<int32_t> ids;
  for (size_t w = 0; w < m.accepted_bits.size(); ++w) {
    for (int b = 0; b < 32; ++b) {
      if (m.accepted_bits[w] >> b & 1) ids.push_back(static_cast<int32_t>(w * 32 + b));
    }
  }
  return ids;
}

// Every node's entry as Get computes it equals the plain trie walk's; returns how many came
// from the string-unit tables.
int CheckEntriesAgainstTrieWalk(const std::shared_ptr<const CompiledGrammar>& g,
                                const std::shared_ptr<const TokenVocabulary>& vocab) {
  auto cache = std::make_shared<TokenMaskCache>(g, vocab);
  int in_string_count = 0;
  for (int32_t node = 0; node < g->num_nodes(); ++node) {
    if (!g->has_byte_edges(node)) continue;
    bool in_string = false, walked = false;
    std::unique_ptr<NodeTokenMasks> fast = cache->ComputeForTesting(node, false, &in_string);
    std::unique_ptr<NodeTokenMasks> walk = cache->ComputeForTesting(node, true, &walked);
    EXPECT_FALSE(walked);
    in_string_count += in_string;
    EXPECT_EQ(AcceptedIds(*fast), AcceptedIds(*walk)) << "node " << node;
    EXPECT_EQ(Sorted(fast->undecided_ids), Sorted(walk->undecided_ids)) << "node " << node;
  }
  return in_string_count;
}

std::shared_ptr<const CompiledGrammar> CompileSchema(const std::string& schema) {
  absl::StatusOr<Grammar> json = JsonSchemaGrammar(nlohmann::ordered_json::parse(schema));
  EXPECT_TRUE(json.ok()) << json.status();
  absl::StatusOr<std::shared_ptr<const CompiledGrammar>> c = CompiledGrammar::Compile(*json);
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(GrammarMatcherTest, StringPositionsMatchTheTrieWalk) {
  for (uint32_t seed : {7u, 8u}) {
    auto vocab = UnitVocabulary(seed);
    // maxLength below, at and above the units a mask explores ahead (16): each
    // position of a bounded string is its own node, so every remaining count is checked.
    for (const char* schema :
         {R"({"type": "string"})", R"({"type": "string", "maxLength": 1})",
          R"({"type": "string", "maxLength": 5})",
          R"({"type": "string", "minLength": 2, "maxLength": 4})",
          R"({"type": "string", "minLength": 3})", R"({"type": "string", "maxLength": 16})",
          R"({"type": "string", "minLength": 1, "maxLength": 30})",
          R"({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "null"}]})",
          R"({"type": "object", "properties": {"k": {"type": "string",
                                   "maxLength": 6}, "v": {"type": "array", "items":
                                   {"type": "string"}}}, "required": ["k"]})",
          R"({"type": "string", "pattern": "^[a-z]+$"})",
          R"({"enum": ["ab", "a\"c", "\u00e9"]})"}) {
      SCOPED_TRACE(schema);
      const int in_string = CheckEntriesAgainstTrieWalk(CompileSchema(schema), vocab);
      if (std::string(schema).find("\"type\": \"string\"") != std::string::npos &&
          std::string(schema).find("pattern") == std::string::npos) {
        EXPECT_GT(in_string, 0);
      }
    }
    auto object = CompiledGrammar::Compile(JsonObjectGrammar());
    ASSERT_TRUE(object.ok()) << object.status();
    EXPECT_GT(CheckEntriesAgainstTrieWalk(*object, vocab), 0);
    // Strings whose inside is wider or narrower than the JSON string's units.
    for (const char* ebnf :
         {R"g(root ::= "\"" [^"]* "\"")g", R"g(root ::= "\"" [^"\\\x00-\x1f]{0,3} "\"" [a-z]*)g",
          R"g(root ::= "<" [^>]* ">")g", R"g(root ::= "'" ([^'\\] | "\\" [\x20-\x7e])* "'")g"}) {
      SCOPED_TRACE(ebnf);
      CheckEntriesAgainstTrieWalk(CompileEbnf(ebnf), vocab);
    }
  }
}

TEST(GrammarMatcherTest, MaskAgreesWithAcceptTokenInBoundedStrings) {
  auto g = CompileSchema(R"({"type": "object", "properties": {
      "a": {"type": "string", "minLength": 1, "maxLength": 3},
      "b": {"type": "string", "maxLength": 14}}, "required": ["a", "b"],
      "additionalProperties": false})");
  CheckMasksAgainstAcceptToken(g, UnitVocabulary(9), 16);
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
