// StructuredOutputMatchers: a worker's grammar matchers for structured-output requests. Builds
// the tokenizer's TokenVocabulary on first use and keeps the compiled grammars with their token
// mask caches by spec, so the requests of a job that share a schema share its cache (the costly
// part of a mask is filling the cache, once per grammar node). Used from the engine's thread.
#ifndef DEEPINFER_WORKER_ENGINE_STRUCTURED_OUTPUT_MATCHERS_H_
#define DEEPINFER_WORKER_ENGINE_STRUCTURED_OUTPUT_MATCHERS_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/grammar/grammar_matcher.h"
#include "common/grammar/token_vocabulary.h"
#include "proto/common.pb.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

class StructuredOutputMatchers {
 public:
  // `tokenizer` must outlive this. vocab_size: the model's logits rows; stop_tokens: the ids
  // that end a request (allowed only once the grammar is complete).
  StructuredOutputMatchers(const tokenizer::Tokenizer* tokenizer, int32_t vocab_size,
                           std::vector<int32_t> stop_tokens);

  // A matcher at the start of `spec`'s grammar. INVALID_ARGUMENT naming the problem when the
  // spec does not compile (the coordinator checks this first; a worker checks again).
  absl::StatusOr<std::unique_ptr<grammar::GrammarMatcher>> Create(const StructuredOutputSpec& spec);

  // Grammars kept at most; the oldest goes first.
  static constexpr size_t kMaxGrammars = 64;

 private:
  const tokenizer::Tokenizer* const tokenizer_;
  const int32_t vocab_size_;
  const std::vector<int32_t> stop_tokens_;
  std::shared_ptr<const grammar::TokenVocabulary> vocabulary_;
  absl::flat_hash_map<std::string, std::shared_ptr<grammar::TokenMaskCache>> caches_;
  std::deque<std::string> order_;  // keys of caches_, oldest first
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_STRUCTURED_OUTPUT_MATCHERS_H_
