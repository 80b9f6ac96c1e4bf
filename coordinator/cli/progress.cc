#include "coordinator/cli/progress.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace deepinfer {
namespace {

std::string ShortDuration(absl::Duration d) {
  int64_t s = absl::ToInt64Seconds(d);
  if (s < 60) return absl::StrCat(s, "s");
  if (s < 3600) return absl::StrCat(s / 60, "m", absl::StrFormat("%02d", s % 60), "s");
  return absl::StrCat(s / 3600, "h", absl::StrFormat("%02d", (s % 3600) / 60), "m");
}

}  // namespace

void TokenRate::Add(absl::Time when, int64_t tokens) {
  if (!last_tokens_.has_value() || *last_tokens_ == tokens) {
    last_tokens_ = tokens;
    return;
  }
  last_tokens_ = tokens;
  changes_.emplace_back(when, tokens);
  // Keep the newest change at or before the window's start, so the window stays covered.
  while (changes_.size() > 2 && when - changes_[1].first >= window_) changes_.pop_front();
}

std::optional<double> TokenRate::PerSecond(absl::Time now) const {
  if (!changes_.empty() && now - changes_.back().first >= window_) return 0.0;
  if (changes_.size() < 2) return std::nullopt;
  const double seconds = absl::ToDoubleSeconds(changes_.back().first - changes_.front().first);
  if (seconds < 1) return std::nullopt;
  return (changes_.back().second - changes_.front().second) / seconds;
}

std::optional<TokensLeft> EstimateTokensLeft(const Job& job) {
  const int64_t unfinished =
      job.total_requests() - job.completed_requests() - job.failed_requests();
  if (unfinished <= 0) return TokensLeft{0, false};
  const int64_t running = job.running_generated_tokens();
  const std::optional<int64_t> bound =
      job.unfinished_max_tokens() > 0
          ? std::optional<int64_t>(std::max<int64_t>(0, job.unfinished_max_tokens() - running))
          : std::nullopt;
  if (job.completed_requests() > 0) {
    const double per_request =
        static_cast<double>(job.generated_tokens()) / job.completed_requests();
    int64_t tokens = std::max<int64_t>(0, static_cast<int64_t>(per_request * unfinished) - running);
    if (bound.has_value()) tokens = std::min(tokens, *bound);
    return TokensLeft{tokens, false};
  }
  if (bound.has_value()) return TokensLeft{*bound, true};
  return std::nullopt;
}

std::string FormatProgress(const Job& job, std::optional<double> tokens_per_s) {
  const int64_t done = job.completed_requests() + job.failed_requests();
  const int64_t total = job.total_requests();
  std::string out = absl::StrFormat("%d/%d done (%.1f%%), %d running", done, total,
                                    total > 0 ? 100.0 * done / total : 0.0, job.running_requests());
  if (job.failed_requests() > 0) absl::StrAppend(&out, ", ", job.failed_requests(), " failed");
  absl::StrAppend(&out, " | ", job.generated_tokens() + job.running_generated_tokens(), " tokens");
  if (tokens_per_s.has_value())
    absl::StrAppend(&out, absl::StrFormat(", %.1f tok/s", *tokens_per_s));
  const std::optional<TokensLeft> left = EstimateTokensLeft(job);
  if (done < total && left.has_value() && tokens_per_s.has_value() && *tokens_per_s > 0) {
    absl::StrAppend(
        &out, " | ETA ", left->upper_bound ? "<= " : "",
        ShortDuration(absl::Ceil(absl::Seconds(left->tokens / *tokens_per_s), absl::Seconds(1))));
  }
  return out;
}

bool ProgressLine::IsTerminal(FILE* f) { return isatty(fileno(f)) == 1; }

void ProgressLine::PrintWhenNew(const std::string& notice, const char* prefix, std::string* last) {
  if (!notice.empty() && notice != *last) {
    // On a line of its own, above the progress line (which the next drawing restores).
    if (drawn_) std::fputs("\r\033[K", out_);
    std::fprintf(out_, "%s: %s%s\n", command_.c_str(), prefix, notice.c_str());
    std::fflush(out_);
  }
  *last = notice;
}

void ProgressLine::Update(const Job& job) {
  const absl::Time now = absl::Now();
  rate_.Add(now, job.generated_tokens() + job.running_generated_tokens());
  PrintWhenNew(job.cluster_notice(), "", &notice_);
  PrintWhenNew(job.stalled_reason(), "stalled: ", &stalled_);
  if (!enabled_) return;
  std::string line = FormatProgress(job, rate_.PerSecond(now));
  // \r and clear-to-end redraw the line in place.
  std::fprintf(out_, "\r%s\033[K", line.c_str());
  std::fflush(out_);
  drawn_ = true;
}

void ProgressLine::Finish() {
  if (enabled_ && drawn_) {
    std::fputc('\n', out_);
    std::fflush(out_);
  }
  drawn_ = false;
}

}  // namespace deepinfer
