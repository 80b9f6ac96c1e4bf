// StepStats implementation.
#include "worker/engine/step_stats.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace deepinfer {
namespace {

// Nearest-rank percentile of sorted values; 0 for none.
double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * sorted.size()));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace

void StepStats::AddStep(absl::Time start, absl::Duration duration, int64_t decodes,
                        int64_t prefill_tokens, bool recorded_graph, bool graph_replayed) {
  const double seconds = absl::ToDoubleSeconds(duration);
  if (steps_ == 0) {
    first_start_ = start;
  } else {
    const double gap = std::max(0.0, absl::ToDoubleSeconds(start - last_end_));
    gap_s_ += gap;
    max_gap_s_ = std::max(max_gap_s_, gap);
  }
  last_end_ = start + duration;
  ++steps_;
  if (recorded_graph) {
    ++capture_steps_;
    capture_s_ += seconds;
  } else {
    step_s_ += seconds;
  }
  if (graph_replayed) {
    ++graph_steps_;
    graph_step_s_ += seconds;
  }
  decode_tokens_ += decodes;
  prefill_tokens_ += prefill_tokens;
  auto& [count, total] = histogram_[{decodes, prefill_tokens}];
  ++count;
  total += seconds;
}

std::string StepStats::ToJson() const {
  std::vector<double> ttft = ttft_s_;
  std::sort(ttft.begin(), ttft.end());
  const double span = steps_ > 0 ? absl::ToDoubleSeconds(last_end_ - first_start_) : 0;
  std::string histogram;
  for (const auto& [key, value] : histogram_) {
    absl::StrAppendFormat(&histogram, "%s[%d, %d, %d, %.6f]", histogram.empty() ? "" : ", ",
                          key.first, key.second, value.first, value.second);
  }
  return absl::StrFormat(
      "{\"async_scheduling\": %s, \"steps\": %d, \"capture_steps\": %d, \"step_s\": %.6f, "
      "\"capture_s\": %.6f, "
      "\"graph_steps\": %d, \"graph_step_s\": %.6f, "
      "\"gap_s\": %.6f, \"max_gap_s\": %.6f, \"span_s\": %.6f, \"first_step_unix\": %.6f, "
      "\"last_step_end_unix\": %.6f, \"decode_tokens\": %d, \"prefill_tokens\": %d, "
      "\"dropped_tokens\": %d, "
      "\"finished\": %d, \"generated_tokens\": %d, \"first_tokens\": %d, \"ttft_p50_s\": %.6f, "
      "\"ttft_p99_s\": %.6f, \"ttft_max_s\": %.6f, \"histogram\": [%s]}",
      async_scheduling_ ? "true" : "false", steps_, capture_steps_, step_s_, capture_s_,
      graph_steps_, graph_step_s_, gap_s_, max_gap_s_, span,
      steps_ > 0 ? absl::ToUnixMicros(first_start_) / 1e6 : 0.0,
      steps_ > 0 ? absl::ToUnixMicros(last_end_) / 1e6 : 0.0, decode_tokens_, prefill_tokens_,
      dropped_tokens_, finished_, generated_tokens_, static_cast<int64_t>(ttft.size()),
      Percentile(ttft, 50), Percentile(ttft, 99), ttft.empty() ? 0.0 : ttft.back(), histogram);
}

}  // namespace deepinfer
