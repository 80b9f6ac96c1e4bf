#include "worker/engine/structured_output_matchers.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grammar/structured_output.h"
#include "common/grammar/structured_output_proto.h"

namespace deepinfer {

StructuredOutputMatchers::StructuredOutputMatchers(const tokenizer::Tokenizer* tokenizer,
                                                   int32_t vocab_size,
                                                   std::vector<int32_t> stop_tokens)
    : tokenizer_(tokenizer), vocab_size_(vocab_size), stop_tokens_(std::move(stop_tokens)) {}

absl::StatusOr<std::unique_ptr<grammar::GrammarMatcher>> StructuredOutputMatchers::Create(
    const StructuredOutputSpec& spec) {
  if (vocabulary_ == nullptr) {
    absl::StatusOr<std::shared_ptr<const grammar::TokenVocabulary>> v =
        grammar::TokenVocabulary::FromTokenizer(*tokenizer_, vocab_size_, stop_tokens_);
    if (!v.ok()) return v.status();
    vocabulary_ = *std::move(v);
  }
  const std::string key = spec.SerializeAsString();
  auto it = caches_.find(key);
  if (it == caches_.end()) {
    absl::StatusOr<std::shared_ptr<const grammar::CompiledGrammar>> compiled =
        grammar::CompileStructuredOutput(grammar::FromProto(spec));
    if (!compiled.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("structured output: ", compiled.status().message()));
    }
    if (order_.size() >= kMaxGrammars) {
      caches_.erase(order_.front());  // matchers still using it keep it alive
      order_.pop_front();
    }
    it = caches_
             .emplace(key,
                      std::make_shared<grammar::TokenMaskCache>(*std::move(compiled), vocabulary_))
             .first;
    order_.push_back(key);
  }
  return std::make_unique<grammar::GrammarMatcher>(it->second);
}

}  // namespace deepinfer
