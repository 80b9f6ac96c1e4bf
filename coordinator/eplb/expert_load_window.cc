#include "coordinator/eplb/expert_load_window.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deepinfer {

ExpertLoadWindow::ExpertLoadWindow(int64_t window_steps)
    : window_steps_(std::max<int64_t>(1, window_steps)) {}

absl::Status ExpertLoadWindow::Add(int rank, uint64_t generation, int64_t num_steps, int num_layers,
                                   int num_experts, const std::vector<int64_t>& counts) {
  if (num_steps < 0 || num_layers < 1 || num_experts < 1 ||
      counts.size() != static_cast<size_t>(num_layers) * num_experts) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert load report of rank ", rank, ": ", counts.size(), " counts for ",
                     num_layers, " layers x ", num_experts, " experts over ", num_steps, " steps"));
  }
  for (int64_t c : counts) {
    if (c < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("expert load report of rank ", rank, ": negative count ", c));
    }
  }
  absl::MutexLock lock(&mu_);
  if (generation < generation_) return absl::OkStatus();  // an old group's statistics
  if (generation > generation_) {
    ranks_.clear();
    generation_ = generation;
    num_layers_ = 0;
    num_experts_ = 0;
  }
  if (num_steps == 0) return absl::OkStatus();
  if (num_layers_ != 0 && (num_layers_ != num_layers || num_experts_ != num_experts)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert load report of rank ", rank, " has ", num_layers, " layers x ", num_experts,
        " experts; earlier reports of this group had ", num_layers_, " x ", num_experts_));
  }
  num_layers_ = num_layers;
  num_experts_ = num_experts;
  RankWindow& w = ranks_[rank];
  w.reports.push_back(Report{num_steps, counts});
  w.steps += num_steps;
  // Drop reports that lie wholly before the window.
  while (w.steps - w.reports.front().steps >= window_steps_) {
    w.steps -= w.reports.front().steps;
    w.reports.pop_front();
  }
  return absl::OkStatus();
}

ExpertLoadWindow::Snapshot ExpertLoadWindow::Get() const {
  absl::MutexLock lock(&mu_);
  Snapshot s;
  s.generation = generation_;
  s.num_layers = num_layers_;
  s.num_experts = num_experts_;
  if (ranks_.empty()) return s;
  s.loads.assign(num_layers_, std::vector<double>(num_experts_, 0.0));
  for (const auto& [rank, w] : ranks_) {
    int64_t left = window_steps_;
    for (auto it = w.reports.rbegin(); it != w.reports.rend() && left > 0; ++it) {
      const int64_t take = std::min(left, it->steps);
      const double share = static_cast<double>(take) / static_cast<double>(it->steps);
      for (int l = 0; l < num_layers_; ++l) {
        for (int e = 0; e < num_experts_; ++e) {
          s.loads[l][e] += share * static_cast<double>(it->counts[l * num_experts_ + e]);
        }
      }
      left -= take;
    }
    s.num_steps = std::max(s.num_steps, window_steps_ - left);
  }
  return s;
}

}  // namespace deepinfer
