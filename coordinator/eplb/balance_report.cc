#include "coordinator/eplb/balance_report.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace deepinfer {

double BalanceReport::Layer::imbalance() const {
  return mean_tokens > 0 ? max_tokens / mean_tokens : 1.0;
}

BalanceReport BalanceReport::FromGpuTokens(std::vector<std::vector<double>> gpu_tokens) {
  BalanceReport report;
  report.num_gpus_ = gpu_tokens.empty() ? 0 : static_cast<int>(gpu_tokens[0].size());
  for (std::vector<double>& tokens : gpu_tokens) {
    Layer layer;
    layer.max_tokens = *std::max_element(tokens.begin(), tokens.end());
    layer.mean_tokens = std::accumulate(tokens.begin(), tokens.end(), 0.0) / tokens.size();
    layer.gpu_tokens = std::move(tokens);
    report.layers_.push_back(std::move(layer));
  }
  return report;
}

absl::StatusOr<BalanceReport> BalanceReport::ForPlacement(const ExpertPlacement& placement,
                                                          const ExpertLoads& loads, int num_gpus) {
  if (absl::Status s = ValidateExpertLoads(loads); !s.ok()) return s;
  if (static_cast<int>(loads.size()) != placement.num_layers() ||
      static_cast<int>(loads[0].size()) != placement.num_logical()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert loads have ", loads.size(), " layers of ", loads[0].size(),
                     " experts, the placement ", placement.num_layers(), " layers of ",
                     placement.num_logical()));
  }
  if (absl::Status s = placement.CheckGpuCount(num_gpus); !s.ok()) return s;
  std::vector<std::vector<double>> gpu_tokens(placement.num_layers(),
                                              std::vector<double>(num_gpus, 0.0));
  for (int layer = 0; layer < placement.num_layers(); ++layer) {
    for (int slot = 0; slot < placement.num_physical(); ++slot) {
      const int e = placement.phy2log()[layer][slot];
      gpu_tokens[layer][placement.GpuOfSlot(slot, num_gpus)] +=
          loads[layer][e] / placement.logcnt()[layer][e];
    }
  }
  return FromGpuTokens(std::move(gpu_tokens));
}

absl::StatusOr<BalanceReport> BalanceReport::ForContiguous(const ExpertLoads& loads, int num_gpus) {
  if (absl::Status s = ValidateExpertLoads(loads); !s.ok()) return s;
  if (num_gpus < 1) {
    return absl::InvalidArgumentError(absl::StrCat("need at least one GPU, got ", num_gpus));
  }
  const int64_t num_experts = loads[0].size();
  std::vector<std::vector<double>> gpu_tokens(loads.size(), std::vector<double>(num_gpus, 0.0));
  for (size_t layer = 0; layer < loads.size(); ++layer) {
    for (int gpu = 0; gpu < num_gpus; ++gpu) {
      for (int64_t e = gpu * num_experts / num_gpus; e < (gpu + 1) * num_experts / num_gpus; ++e) {
        gpu_tokens[layer][gpu] += loads[layer][e];
      }
    }
  }
  return FromGpuTokens(std::move(gpu_tokens));
}

double BalanceReport::total_max_tokens() const {
  double total = 0;
  for (const Layer& layer : layers_) total += layer.max_tokens;
  return total;
}

double BalanceReport::total_mean_tokens() const {
  double total = 0;
  for (const Layer& layer : layers_) total += layer.mean_tokens;
  return total;
}

double BalanceReport::imbalance() const {
  const double mean = total_mean_tokens();
  return mean > 0 ? total_max_tokens() / mean : 1.0;
}

std::string FormatBalanceComparison(const BalanceReport& before, const BalanceReport& after) {
  CHECK_EQ(before.layers().size(), after.layers().size());
  std::string out =
      absl::StrFormat("%-8s %14s %14s %9s   %14s %14s %9s\n", "layer", "before max", "before mean",
                      "max/mean", "after max", "after mean", "max/mean");
  auto row = [&](const std::string& name, double bmax, double bmean, double bratio, double amax,
                 double amean, double aratio) {
    absl::StrAppendFormat(&out, "%-8s %14.1f %14.1f %9.3f   %14.1f %14.1f %9.3f\n", name, bmax,
                          bmean, bratio, amax, amean, aratio);
  };
  for (size_t i = 0; i < before.layers().size(); ++i) {
    const BalanceReport::Layer& b = before.layers()[i];
    const BalanceReport::Layer& a = after.layers()[i];
    row(absl::StrCat(i), b.max_tokens, b.mean_tokens, b.imbalance(), a.max_tokens, a.mean_tokens,
        a.imbalance());
  }
  row("overall", before.total_max_tokens(), before.total_mean_tokens(), before.imbalance(),
      after.total_max_tokens(), after.total_mean_tokens(), after.imbalance());
  return out;
}

}  // namespace deepinfer
