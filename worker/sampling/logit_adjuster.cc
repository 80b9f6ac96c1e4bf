// LogitAdjuster: a sequence's logit adjustments (see logit_adjuster.h).
#include "worker/sampling/logit_adjuster.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace deepinfer {

absl::StatusOr<LogitAdjuster> LogitAdjuster::Create(LogitAdjusterParams params, int64_t vocab,
                                                    absl::Span<const int32_t> prompt) {
  for (const auto& [token, bias] : params.logit_bias) {
    if (token < 0 || token >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias: token id ", token, " is outside the vocabulary of ", vocab));
    }
    if (!std::isfinite(bias)) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias: the bias of token ", token, " is not finite"));
    }
  }
  if (!std::isfinite(params.presence_penalty)) {
    return absl::InvalidArgumentError("presence_penalty is not finite");
  }
  if (!std::isfinite(params.frequency_penalty)) {
    return absl::InvalidArgumentError("frequency_penalty is not finite");
  }
  if (!(params.repetition_penalty > 0.0f) || !std::isfinite(params.repetition_penalty)) {
    return absl::InvalidArgumentError(
        absl::StrCat("repetition_penalty must be > 0, got ", params.repetition_penalty));
  }
  if (params.min_tokens < 0) return absl::InvalidArgumentError("min_tokens < 0");
  LogitAdjuster adjuster(std::move(params));
  // Stop tokens outside the vocabulary can never be sampled: nothing to mask.
  std::vector<int32_t>& stops = adjuster.params_.stop_tokens;
  stops.erase(std::remove_if(stops.begin(), stops.end(),
                             [vocab](int32_t t) { return t < 0 || t >= vocab; }),
              stops.end());
  if (adjuster.params_.repetition_penalty != 1.0f) {
    adjuster.prompt_tokens_.insert(prompt.begin(), prompt.end());
  }
  return adjuster;
}

bool LogitAdjuster::active() const {
  return !params_.logit_bias.empty() || params_.presence_penalty != 0.0f ||
         params_.frequency_penalty != 0.0f || params_.repetition_penalty != 1.0f ||
         (params_.min_tokens > 0 && !params_.stop_tokens.empty());
}

bool LogitAdjuster::counts_tokens() const {
  return params_.presence_penalty != 0.0f || params_.frequency_penalty != 0.0f ||
         params_.repetition_penalty != 1.0f;
}

void LogitAdjuster::AddGenerated(int32_t token) {
  ++generated_;
  if (counts_tokens()) ++generated_counts_[token];
}

std::vector<LogitAdjustment> LogitAdjuster::EntriesAfter(int64_t pending) const {
  CHECK(pending == 0 || !counts_tokens()) << "LogitAdjuster: the pending tokens' ids are needed";
  std::map<int32_t, LogitAdjustment> by_token;
  auto entry = [&](int32_t token) -> LogitAdjustment& {
    LogitAdjustment& a = by_token[token];
    a.token = token;
    return a;
  };
  for (const auto& [token, bias] : params_.logit_bias) entry(token).bias += bias;
  if (generated_ + pending < params_.min_tokens) {
    for (int32_t token : params_.stop_tokens) {
      entry(token).bias = -std::numeric_limits<float>::infinity();
    }
  }
  const float rep = params_.repetition_penalty;
  if (rep != 1.0f) {
    for (int32_t token : prompt_tokens_) entry(token).repetition = rep;
  }
  for (const auto& [token, count] : generated_counts_) {
    LogitAdjustment& a = entry(token);
    a.repetition = rep;
    a.subtract = static_cast<float>(static_cast<double>(params_.frequency_penalty) * count +
                                    params_.presence_penalty);
  }
  std::vector<LogitAdjustment> out;
  out.reserve(by_token.size());
  for (const auto& [token, a] : by_token) out.push_back(a);
  return out;
}

}  // namespace deepinfer
