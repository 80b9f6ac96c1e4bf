// Test helpers: whether a grammar accepts a byte string, through a matcher over a vocabulary
// of the 256 single bytes (so every string is spelled by exactly one token sequence).
#ifndef DEEPINFER_COMMON_GRAMMAR_GRAMMAR_TEST_UTIL_H_
#define DEEPINFER_COMMON_GRAMMAR_GRAMMAR_TEST_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include "common/grammar/compiled_grammar.h"
#include "common/grammar/grammar_matcher.h"
#include "common/grammar/token_vocabulary.h"

namespace deepinfer::grammar {

// 256 byte tokens (id = byte value) and a stop token 256.
inline std::shared_ptr<const TokenVocabulary> ByteVocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  bytes.push_back("");
  return TokenVocabulary::Create(std::move(bytes), {256});
}

// True when `text` is a complete sentence of the grammar.
inline bool Matches(const std::shared_ptr<const CompiledGrammar>& grammar,
                    const std::string& text) {
  auto cache = std::make_shared<TokenMaskCache>(grammar, ByteVocabulary());
  GrammarMatcher m(cache);
  return m.AcceptBytes(text) && m.IsComplete();
}

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_GRAMMAR_TEST_UTIL_H_
