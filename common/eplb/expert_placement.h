// ExpertPlacement: which logical expert each physical expert slot of every MoE layer hosts,
// the output of the EPLB planner and the input of MoE dispatch.
//
// Per layer: phy2log[p] is the logical expert in physical slot p; log2phy[e] lists the
// physical slots holding a replica of logical expert e (replica r of e is log2phy[e][r];
// dispatch picks a replica by a deterministic function of the token, so the order is part
// of the placement); logcnt[e] is the number of replicas of e. Slots are laid out over
// GPUs (ranks) in order: slot p lives on GPU p / (num_physical / num_gpus), so every GPU
// hosts the same number of slots. The number of GPUs is not part of the placement (the
// same placement describes 1 GPU or num_physical GPUs); functions that need it take it.
#ifndef DEEPINFER_COMMON_EPLB_EXPERT_PLACEMENT_H_
#define DEEPINFER_COMMON_EPLB_EXPERT_PLACEMENT_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace deepinfer {

class ExpertPlacement {
 public:
  // Builds a placement from phy2log alone: replica lists are ordered by slot index.
  // INVALID_ARGUMENT when layers differ in size, a slot names an expert outside
  // [0, num_logical), or a logical expert has no replica.
  static absl::StatusOr<ExpertPlacement> FromPhy2Log(std::vector<std::vector<int>> phy2log,
                                                     int num_logical);

  // Builds a placement from all three tables (as read from a file), keeping the replica
  // order of log2phy. Each log2phy row may be padded with -1 after its logcnt entries.
  // INVALID_ARGUMENT, saying where, when the tables disagree with each other.
  static absl::StatusOr<ExpertPlacement> FromTables(
      std::vector<std::vector<int>> phy2log, std::vector<std::vector<std::vector<int>>> log2phy,
      std::vector<std::vector<int>> logcnt);

  int num_layers() const { return static_cast<int>(phy2log_.size()); }
  int num_physical() const { return num_physical_; }
  int num_logical() const { return num_logical_; }

  const std::vector<std::vector<int>>& phy2log() const { return phy2log_; }
  // Unpadded: log2phy()[layer][e].size() == logcnt()[layer][e].
  const std::vector<std::vector<std::vector<int>>>& log2phy() const { return log2phy_; }
  const std::vector<std::vector<int>>& logcnt() const { return logcnt_; }
  // The largest replica count of any expert in any layer (the padded width of log2phy).
  int max_replicas() const;

  // INVALID_ARGUMENT unless num_gpus > 0 and divides num_physical(), with a message that
  // names the GPU counts that would.
  absl::Status CheckGpuCount(int num_gpus) const;
  // GPU hosting `slot`; num_gpus must have passed CheckGpuCount.
  int GpuOfSlot(int slot, int num_gpus) const;

  friend bool operator==(const ExpertPlacement& a, const ExpertPlacement& b) {
    return a.phy2log_ == b.phy2log_ && a.log2phy_ == b.log2phy_ && a.logcnt_ == b.logcnt_;
  }
  friend bool operator!=(const ExpertPlacement& a, const ExpertPlacement& b) { return !(a == b); }

 private:
  ExpertPlacement() = default;

  int num_physical_ = 0;
  int num_logical_ = 0;
  std::vector<std::vector<int>> phy2log_;
  std::vector<std::vector<std::vector<int>>> log2phy_;
  std::vector<std::vector<int>> logcnt_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_EPLB_EXPERT_PLACEMENT_H_
