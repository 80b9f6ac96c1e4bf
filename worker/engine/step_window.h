// StepWindow: tokens and decode rows of a rank's last steps, for the data-parallel attention
// balance that `deepinfer-admin status` shows (each rank runs its own requests' attention; the
// slowest rank sets every expert-parallel step's pace). Not thread-safe: the engine thread
// records, and EngineLoad carries a copy of Summary() to other threads.
#ifndef DEEPINFER_WORKER_ENGINE_STEP_WINDOW_H_
#define DEEPINFER_WORKER_ENGINE_STEP_WINDOW_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace deepinfer {

class StepWindow {
 public:
  struct Summary {
    int64_t steps = 0;             // steps in the window (at most its capacity)
    int64_t tokens_max = 0;        // most tokens of one step
    double tokens_mean = 0;        // mean tokens per step
    int64_t last_decode_rows = 0;  // decode rows (one token of a generating sequence) last step
  };

  explicit StepWindow(int capacity = 64) : tokens_(std::max(1, capacity), 0) {}

  // One step of `tokens` new tokens, `decode_rows` of them one-token decode rows.
  void Record(int64_t tokens, int64_t decode_rows) {
    tokens_[next_] = tokens;
    next_ = (next_ + 1) % tokens_.size();
    if (filled_ < tokens_.size()) ++filled_;
    last_decode_rows_ = decode_rows;
  }

  Summary summary() const {
    Summary s;
    s.steps = static_cast<int64_t>(filled_);
    s.last_decode_rows = last_decode_rows_;
    int64_t sum = 0;
    for (size_t i = 0; i < filled_; ++i) {
      sum += tokens_[i];
      s.tokens_max = std::max(s.tokens_max, tokens_[i]);
    }
    s.tokens_mean = filled_ > 0 ? static_cast<double>(sum) / static_cast<double>(filled_) : 0.0;
    return s;
  }

 private:
  std::vector<int64_t> tokens_;
  size_t next_ = 0;
  size_t filled_ = 0;
  int64_t last_decode_rows_ = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_STEP_WINDOW_H_
