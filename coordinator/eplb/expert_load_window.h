// ExpertLoadWindow: the coordinator's sliding window of EPLB load statistics. Ranks report
// how many tokens they routed to each logical expert of each MoE layer over some consecutive
// steps (a heartbeat's worth); the window keeps, per rank, the reports that cover its last
// `window_steps` steps and sums them over ranks into the planner's ExpertLoads. A report that
// straddles the window's edge counts pro rata (its steps are assumed alike), so loads may be
// fractional. Ranks of one group step together, so their windows cover the same steps.
//
// Statistics belong to one group: a report from a newer group generation clears the window,
// one from an older generation is dropped. Thread-safe.
#ifndef DEEPINFER_COORDINATOR_EPLB_EXPERT_LOAD_WINDOW_H_
#define DEEPINFER_COORDINATOR_EPLB_EXPERT_LOAD_WINDOW_H_

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/eplb/expert_loads.h"

namespace deepinfer {

class ExpertLoadWindow {
 public:
  // window_steps >= 1.
  explicit ExpertLoadWindow(int64_t window_steps);

  // `counts` is [num_layers][num_experts] row-major over `num_steps` steps of global rank
  // `rank`. INVALID_ARGUMENT (window unchanged) for negative steps or counts, a size that is
  // not num_layers * num_experts, or a shape other than the window's earlier reports of the
  // same generation. A report of 0 steps is ignored.
  absl::Status Add(int rank, uint64_t generation, int64_t num_steps, int num_layers,
                   int num_experts, const std::vector<int64_t>& counts);

  struct Snapshot {
    uint64_t generation = 0;
    int64_t num_steps = 0;  // steps covered (the most any rank covers), <= window_steps
    int num_layers = 0;
    int num_experts = 0;
    ExpertLoads loads;  // [num_layers][num_experts]; empty before any report
  };
  Snapshot Get() const;
  int64_t window_steps() const { return window_steps_; }

 private:
  struct Report {
    int64_t steps = 0;
    std::vector<int64_t> counts;
  };
  struct RankWindow {
    std::deque<Report> reports;  // oldest first
    int64_t steps = 0;           // sum over reports
  };

  const int64_t window_steps_;
  mutable absl::Mutex mu_;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int num_layers_ ABSL_GUARDED_BY(mu_) = 0;
  int num_experts_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int, RankWindow> ranks_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_EPLB_EXPERT_LOAD_WINDOW_H_
