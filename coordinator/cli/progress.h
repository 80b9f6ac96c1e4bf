// Progress of a job for the person running `deepinfer run` or `deepinfer wait`: one line on
// a terminal, redrawn in place, with requests done / running / failed, tokens generated so
// far (finished requests plus what running ones generated, from the workers' heartbeats),
// tokens per second and an estimate of the time left. The line is drawn only on a terminal,
// so logs and pipes stay clean; the coordinator's cluster notice (a worker left out of the
// expert-parallel group, no group serving) and why the job is stalled (the coordinator cannot
// write to its state directory) are printed on lines of their own either way.
#ifndef DEEPINFER_COORDINATOR_CLI_PROGRESS_H_
#define DEEPINFER_COORDINATOR_CLI_PROGRESS_H_

#include <cstdint>
#include <cstdio>
#include <deque>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "proto/job.pb.h"

namespace deepinfer {

// Tokens per second from the token counts a client sees. Counts move in steps (each
// worker heartbeat, about once a second), so the rate is taken between the moments a new
// count was first seen: (count at the newest change - count at the oldest change kept) /
// the time between them, over the changes of the last `window`. The count seen first is not
// a change (it may have stood for long, e.g. while the workers loaded the model).
class TokenRate {
 public:
  explicit TokenRate(absl::Duration window) : window_(window) {}
  void Add(absl::Time when, int64_t tokens);
  // Unknown until two changes lie at least a second apart; 0 when the count has not changed
  // for a whole window.
  std::optional<double> PerSecond(absl::Time now) const;

 private:
  const absl::Duration window_;
  std::optional<int64_t> last_tokens_;
  std::deque<std::pair<absl::Time, int64_t>> changes_;
};

// Tokens the job still has to generate, estimated. Once requests completed: the average
// generated per completed request times the requests without a result, less what the
// running ones generated so far; never above the max_tokens bound. Before that: the bound
// itself (the max_tokens of the unfinished requests less what the running ones generated),
// marked `upper_bound`. Nullopt when the job reports neither.
struct TokensLeft {
  int64_t tokens = 0;
  bool upper_bound = false;
};
std::optional<TokensLeft> EstimateTokensLeft(const Job& job);

// "40/120 done (33.3%), 8 running, 10 failed | 1234 tokens, 40.0 tok/s | ETA 40s": the ETA
// is EstimateTokensLeft / `tokens_per_s`, rounded up to a second ("ETA <= 5m00s" for the
// upper bound), left out while the rate is unknown or zero.
std::string FormatProgress(const Job& job, std::optional<double> tokens_per_s);

class ProgressLine {
 public:
  // Draws the line on `out` only when `enabled` (use IsTerminal(stderr)); cluster notices
  // go to `out` as "`command`: NOTICE" lines whenever they change, stalled reasons as
  // "`command`: stalled: REASON".
  ProgressLine(FILE* out, bool enabled, std::string command)
      : out_(out), enabled_(enabled), command_(std::move(command)) {}
  void Update(const Job& job);
  // Ends the line (a newline after the last drawing).
  void Finish();

  static bool IsTerminal(FILE* f);

 private:
  // Prints `prefix` `notice` on a line of its own when it is set and not `*last`; then sets
  // `*last` to it.
  void PrintWhenNew(const std::string& notice, const char* prefix, std::string* last);

  FILE* out_;
  bool enabled_;
  const std::string command_;
  TokenRate rate_{absl::Seconds(20)};
  std::string notice_;
  std::string stalled_;
  bool drawn_ = false;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_CLI_PROGRESS_H_
