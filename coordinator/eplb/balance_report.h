// BalanceReport: how evenly a placement spreads expert load over GPUs, per MoE layer and
// overall, in tokens per GPU (max and mean). Used to show a placement "before" and
// "after" planning. A token routed to an expert with k replicas counts 1/k on each
// replica's GPU: dispatch spreads an expert's tokens evenly over its replicas.
#ifndef DEEPINFER_COORDINATOR_EPLB_BALANCE_REPORT_H_
#define DEEPINFER_COORDINATOR_EPLB_BALANCE_REPORT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/eplb/expert_placement.h"
#include "coordinator/eplb/expert_loads.h"

namespace deepinfer {

class BalanceReport {
 public:
  struct Layer {
    std::vector<double> gpu_tokens;  // per GPU
    double max_tokens = 0;
    double mean_tokens = 0;
    // max / mean; 1 for a layer without load.
    double imbalance() const;
  };

  // Load of `placement` on `num_gpus` GPUs. INVALID_ARGUMENT when `loads` does not match
  // the placement's layers and logical experts, or the slots do not divide over the GPUs.
  static absl::StatusOr<BalanceReport> ForPlacement(const ExpertPlacement& placement,
                                                    const ExpertLoads& loads, int num_gpus);

  // Load without EPLB: no replicas, logical experts in order, GPU g hosting experts
  // [g * E / num_gpus, (g + 1) * E / num_gpus). INVALID_ARGUMENT for bad loads or
  // num_gpus < 1.
  static absl::StatusOr<BalanceReport> ForContiguous(const ExpertLoads& loads, int num_gpus);

  const std::vector<Layer>& layers() const { return layers_; }
  int num_gpus() const { return num_gpus_; }
  // Every layer waits for its busiest GPU, so the step is set by the sum of per-layer
  // maxima: overall imbalance is sum(max) / sum(mean), not an average of ratios.
  double total_max_tokens() const;
  double total_mean_tokens() const;
  double imbalance() const;

 private:
  static BalanceReport FromGpuTokens(std::vector<std::vector<double>> gpu_tokens);

  int num_gpus_ = 0;
  std::vector<Layer> layers_;
};

// A table for terminals: per layer, max/mean tokens per GPU and their ratio before and
// after, then the overall line. Both reports must have the same number of layers.
std::string FormatBalanceComparison(const BalanceReport& before, const BalanceReport& after);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_EPLB_BALANCE_REPORT_H_
