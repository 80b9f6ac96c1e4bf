#include "coordinator/cli/progress.h"

#include <unistd.h>

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

std::string FormatProgress(const Job& job, absl::Duration elapsed) {
  const int64_t done = job.completed_requests() + job.failed_requests();
  const int64_t total = job.total_requests();
  std::string out = absl::StrFormat("%d/%d requests (%.1f%%)", done, total,
                                    total > 0 ? 100.0 * done / total : 0.0);
  if (job.failed_requests() > 0) absl::StrAppend(&out, ", ", job.failed_requests(), " failed");
  const double seconds = absl::ToDoubleSeconds(elapsed);
  if (seconds > 0) {
    absl::StrAppend(&out, absl::StrFormat(" | %.1f tok/s", job.generated_tokens() / seconds));
  }
  if (done > 0 && done < total && seconds > 0) {
    absl::StrAppend(&out, " | ETA ",
                    ShortDuration(absl::Seconds(seconds * (total - done) / done)));
  }
  return out;
}

bool ProgressLine::IsTerminal(FILE* f) { return isatty(fileno(f)) == 1; }

void ProgressLine::Update(const Job& job) {
  if (!enabled_) return;
  std::string line = FormatProgress(job, absl::Now() - start_);
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
