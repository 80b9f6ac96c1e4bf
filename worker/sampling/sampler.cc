// Sampler: host-side sampling with an exponential race over counter-based noise.
#include "worker/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "worker/sampling/counter_rng.h"

namespace deepinfer {

RowSamplingParams ToRowSamplingParams(const SamplingParams& params, int64_t position) {
  RowSamplingParams row;
  row.temperature = params.temperature;
  row.top_k = params.top_k;
  row.top_p = params.top_p;
  row.seed = params.seed;
  row.position = position;
  return row;
}

absl::Status Sampler::Validate(const SamplingParams& params, int64_t vocab) {
  if (!(params.top_p > 0.0f && params.top_p <= 1.0f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("Sampler: top_p must be in (0, 1], got ", params.top_p));
  }
  if (std::isnan(params.temperature)) {
    return absl::InvalidArgumentError("Sampler: temperature is NaN");
  }
  if (params.num_logprobs < 0) {
    return absl::InvalidArgumentError("Sampler: num_logprobs must be >= 0");
  }
  int32_t previous = -1;
  for (const LogitAdjustment& a : params.adjustments) {
    if (a.token <= previous) {
      return absl::InvalidArgumentError("Sampler: adjustments must have ascending token ids");
    }
    previous = a.token;
    if (a.token >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sampler: adjusted token ", a.token, " outside the vocabulary of ", vocab));
    }
    if (!(a.repetition > 0.0f) || std::isnan(a.bias) || std::isnan(a.subtract)) {
      return absl::InvalidArgumentError(
          absl::StrCat("Sampler: invalid adjustment of token ", a.token));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<SampledToken> Sampler::Sample(const float* logits, int32_t vocab,
                                             const SamplingParams& params, int64_t position) {
  if (vocab <= 0) return absl::InvalidArgumentError("Sampler: empty vocabulary");
  if (absl::Status st = Validate(params, vocab); !st.ok()) return st;
  SampledToken out;
  // The token is picked from the adjusted row; log-probabilities come from the raw one.
  const float* raw = logits;
  std::vector<float> adjusted;
  if (!params.adjustments.empty()) {
    adjusted.assign(logits, logits + vocab);
    for (const LogitAdjustment& a : params.adjustments) {
      adjusted[a.token] = AdjustLogit(adjusted[a.token], a);
    }
    logits = adjusted.data();
  }
  // Log-softmax of the raw logits, in double for a stable normaliser.
  double mx = *std::max_element(raw, raw + vocab);
  double sum = 0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(raw[i] - mx);
  const double log_z = mx + std::log(sum);
  auto logprob = [&](int32_t i) { return static_cast<float>(raw[i] - log_z); };

  if (params.temperature <= 0.0f) {
    out.token = static_cast<int32_t>(std::max_element(logits, logits + vocab) - logits);
  } else {
    // Candidates sorted by logit (ties: lower id first) so top-k / top-p are well defined.
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    int32_t keep = vocab;
    if (params.top_k > 0) keep = std::min(keep, params.top_k);
    auto by_logit = [&](int32_t a, int32_t b) {
      return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
    };
    if (keep < vocab || params.top_p < 1.0f) {
      std::sort(order.begin(), order.end(), by_logit);
    }
    order.resize(keep);
    std::vector<double> p(keep);
    const double inv_t = 1.0 / params.temperature;
    double top = -1e300;
    for (int32_t i = 0; i < keep; ++i) top = std::max(top, logits[order[i]] * inv_t);
    double z = 0;
    for (int32_t i = 0; i < keep; ++i) z += (p[i] = std::exp(logits[order[i]] * inv_t - top));
    for (double& v : p) v /= z;
    if (params.top_p < 1.0f) {
      // Smallest prefix (in descending probability) whose mass reaches top_p.
      double cum = 0;
      int32_t n = 0;
      while (n < keep) {
        cum += p[n++];
        if (cum >= params.top_p) break;
      }
      keep = n;
    }
    double best = -1;
    for (int32_t i = 0; i < keep; ++i) {
      // 0 - log(u) rather than -log(u): equal for u < 1, but u == 1 gives E = +0, so the token
      // wins the race (race +inf) instead of losing it with -inf; with a single candidate that
      // left no winner at all (token -1).
      const double e =
          0.0 - std::log(static_cast<double>(CounterRng::Uniform(params.seed, position, order[i])));
      const double race = p[i] / e;
      if (race > best) {
        best = race;
        out.token = order[i];
      }
    }
  }
  out.logprob = logprob(out.token);
  if (params.num_logprobs > 0) {
    const int32_t n = std::min(params.num_logprobs, vocab);
    std::vector<int32_t> ids(vocab);
    std::iota(ids.begin(), ids.end(), 0);
    std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), [&](int32_t a, int32_t b) {
      return raw[a] > raw[b] || (raw[a] == raw[b] && a < b);
    });
    for (int32_t i = 0; i < n; ++i) out.top_logprobs.emplace_back(ids[i], logprob(ids[i]));
  }
  return out;
}

}  // namespace deepinfer
