#include "tools/bench/constrained_requests.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/grammar/structured_output.h"
#include "common/grammar/token_vocabulary.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {

absl::StatusOr<std::unique_ptr<ConstrainedRequests>> ConstrainedRequests::Create(
    const std::string& tokenizer_dir, const std::string& schema_path, int64_t vocab_size) {
  auto tokenizer = tokenizer::Tokenizer::FromDirectory(tokenizer_dir);
  if (!tokenizer.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tokenizer '", tokenizer_dir, "': ", tokenizer.status().message()));
  }
  std::vector<int32_t> stops;
  if (auto eos = tokenizer::TokenContent((*tokenizer)->config(), "eos_token")) {
    if (auto id = (*tokenizer)->TokenToId(*eos)) stops.push_back(static_cast<int32_t>(*id));
  }
  if (stops.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tokenizer '", tokenizer_dir, "': tokenizer_config.json names no known eos_token"));
  }
  auto vocab = grammar::TokenVocabulary::FromTokenizer(
      **tokenizer, static_cast<int32_t>(vocab_size), std::move(stops));
  if (!vocab.ok()) return vocab.status();
  grammar::StructuredOutput spec;
  if (schema_path.empty()) {
    spec.kind = grammar::StructuredOutput::Kind::kJsonObject;
  } else {
    std::ifstream in(schema_path);
    if (!in) {
      return absl::InvalidArgumentError(
          absl::StrCat("--constrained-spec '", schema_path, "' cannot be read"));
    }
    std::stringstream text;
    text << in.rdbuf();
    spec.kind = grammar::StructuredOutput::Kind::kJsonSchema;
    spec.text = text.str();
  }
  auto compiled = grammar::CompileStructuredOutput(spec);
  if (!compiled.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--constrained-spec '", schema_path, "': ", compiled.status().message()));
  }
  std::unique_ptr<ConstrainedRequests> out(new ConstrainedRequests());
  out->cache_ = std::make_shared<grammar::TokenMaskCache>(*compiled, *vocab);
  return out;
}

void ConstrainedRequests::Attach(double fraction, std::vector<SequenceStep>* seqs) {
  rows_.clear();
  matchers_.clear();
  const int64_t n = static_cast<int64_t>(seqs->size());
  const int64_t k = std::min<int64_t>(n, std::llround(fraction * n));
  for (int64_t j = 0; j < k; ++j) {
    const int64_t row = j * n / k;  // evenly spread, row 0 first
    rows_.push_back(row);
    matchers_.push_back(std::make_unique<grammar::GrammarMatcher>(cache_));
    grammar::GrammarMatcher* matcher = matchers_.back().get();
    (*seqs)[row].fill_allowed_tokens = [this, matcher](uint32_t* words) {
      const auto t0 = std::chrono::steady_clock::now();
      matcher->FillNextTokenBitmask(words);
      fill_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      return true;  // a matcher that is not terminated always allows some token
    };
  }
}

absl::Status ConstrainedRequests::Advance(const StepOutput& out) {
  for (size_t j = 0; j < rows_.size(); ++j) {
    grammar::GrammarMatcher& m = *matchers_[j];
    const int32_t token = out.sampled[rows_[j]].token;
    if (!m.AcceptToken(token)) {
      return absl::InternalError(absl::StrCat("constrained request ", rows_[j], " sampled token ",
                                              token, ", which its grammar does not allow"));
    }
    if (m.IsTerminated()) m.Rollback(m.NumAcceptedTokens());  // a new document
  }
  return absl::OkStatus();
}

double ConstrainedRequests::TakeFillSeconds() {
  const double s = fill_seconds_;
  fill_seconds_ = 0;
  return s;
}

}  // namespace deepinfer
