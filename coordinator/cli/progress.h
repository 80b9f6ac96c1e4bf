// Progress of a job for people at a terminal: one line, redrawn in place, with
// requests done out of total, tokens per second, and an estimate of the time left.
// Silent when the output is not a terminal, so logs and pipes stay clean.
#ifndef DEEPINFER_COORDINATOR_CLI_PROGRESS_H_
#define DEEPINFER_COORDINATOR_CLI_PROGRESS_H_

#include <cstdio>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/job.pb.h"

namespace deepinfer {

// "37/120 requests (30.8%), 2 failed | 412.5 tok/s | ETA 1m12s" (no ETA before the first
// request finished).
std::string FormatProgress(const Job& job, absl::Duration elapsed);

class ProgressLine {
 public:
  // Draws on `out` only when `enabled`; use IsTerminal(stderr) for it.
  ProgressLine(FILE* out, bool enabled) : out_(out), enabled_(enabled), start_(absl::Now()) {}
  void Update(const Job& job);
  // Ends the line (a newline after the last drawing).
  void Finish();

  static bool IsTerminal(FILE* f);

 private:
  FILE* out_;
  bool enabled_;
  absl::Time start_;
  bool drawn_ = false;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_CLI_PROGRESS_H_
