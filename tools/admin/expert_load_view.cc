#include "tools/admin/expert_load_view.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/eplb/placement_proto.h"
#include "tools/admin/png_writer.h"

namespace deepinfer {
namespace {

// Whether the group runs the coordinator's placement (every member reports its epoch).
bool RunsPlacement(const GetExpertLoadResponse& r) {
  return r.placement().layers_size() > 0 && r.placement().epoch() > 0 &&
         r.active_epoch() >= r.placement().epoch();
}

std::string LayoutName(const GetExpertLoadResponse& r) {
  if (RunsPlacement(r)) return absl::StrCat("placement epoch ", r.placement().epoch());
  if (r.placement().epoch() > 0) {
    return absl::StrCat("experts in order (placement epoch ", r.placement().epoch(),
                        " handed out, not running on every worker yet)");
  }
  return "experts in order, no placement";
}

}  // namespace

absl::StatusOr<ExpertLoads> LoadsFromResponse(const GetExpertLoadResponse& r) {
  if (r.num_steps() == 0 || r.loads_size() == 0) {
    return absl::FailedPreconditionError(
        "no expert load statistics yet (the group has not run any step since it formed)");
  }
  const int L = r.num_layers(), E = r.num_experts();
  if (L < 1 || E < 1 || r.loads_size() != static_cast<int64_t>(L) * E) {
    return absl::InvalidArgumentError(absl::StrCat("expert load response has ", r.loads_size(),
                                                   " loads for ", L, " layers x ", E, " experts"));
  }
  ExpertLoads loads(L, std::vector<double>(E));
  for (int l = 0; l < L; ++l) {
    for (int e = 0; e < E; ++e) loads[l][e] = r.loads(l * E + e);
  }
  if (absl::Status st = ValidateExpertLoads(loads); !st.ok()) return st;
  return loads;
}

absl::StatusOr<BalanceReport> GpuLoads(const GetExpertLoadResponse& r) {
  absl::StatusOr<ExpertLoads> loads = LoadsFromResponse(r);
  if (!loads.ok()) return loads.status();
  if (r.num_gpus() < 1) {
    return absl::FailedPreconditionError("no serving expert-parallel group: no GPUs to show");
  }
  if (RunsPlacement(r)) {
    absl::StatusOr<ExpertPlacement> placement = PlacementFromProto(r.placement());
    if (!placement.ok()) return placement.status();
    return BalanceReport::ForPlacement(*placement, *loads, r.num_gpus());
  }
  return BalanceReport::ForContiguous(*loads, r.num_gpus());
}

absl::StatusOr<std::string> FormatExpertLoadTable(const GetExpertLoadResponse& r) {
  absl::StatusOr<BalanceReport> report = GpuLoads(r);
  if (!report.ok()) return report.status();
  std::string out =
      absl::StrCat("expert load: last ", r.num_steps(), " steps (window ", r.window_steps(), "), ",
                   r.num_layers(), " MoE layers x ", r.num_experts(), " experts, ", r.num_gpus(),
                   " GPUs; layout: ", LayoutName(r), "\ntokens per GPU:\n");
  absl::StrAppendFormat(&out, "%-8s", "layer");
  for (int g = 0; g < r.num_gpus(); ++g)
    absl::StrAppendFormat(&out, " %10s", absl::StrCat("gpu", g));
  absl::StrAppendFormat(&out, " %12s %12s %9s\n", "max", "mean", "max/mean");
  for (size_t l = 0; l < report->layers().size(); ++l) {
    const BalanceReport::Layer& layer = report->layers()[l];
    absl::StrAppendFormat(&out, "%-8d", static_cast<int>(l));
    for (double t : layer.gpu_tokens) absl::StrAppendFormat(&out, " %10.1f", t);
    absl::StrAppendFormat(&out, " %12.1f %12.1f %9.3f\n", layer.max_tokens, layer.mean_tokens,
                          layer.imbalance());
  }
  absl::StrAppendFormat(&out, "%-8s", "overall");
  for (int g = 0; g < r.num_gpus(); ++g) absl::StrAppendFormat(&out, " %10s", "");
  absl::StrAppendFormat(&out, " %12.1f %12.1f %9.3f\n", report->total_max_tokens(),
                        report->total_mean_tokens(), report->imbalance());
  return out;
}

absl::StatusOr<std::string> RenderExpertLoadPng(const GetExpertLoadResponse& r) {
  absl::StatusOr<BalanceReport> report = GpuLoads(r);
  if (!report.ok()) return report.status();
  const int gpus = r.num_gpus();
  const int layers = static_cast<int>(report->layers().size());
  const int cell_w = std::max(4, 512 / gpus), cell_h = std::max(2, std::min(24, 480 / layers));
  const int width = gpus * cell_w, height = layers * (cell_h + 1);
  double peak = 0;
  for (const BalanceReport::Layer& layer : report->layers())
    peak = std::max(peak, layer.max_tokens);
  std::vector<uint8_t> rgb(static_cast<size_t>(width) * height * 3, 255);
  for (int l = 0; l < layers; ++l) {
    for (int g = 0; g < gpus; ++g) {
      const double v = peak > 0 ? report->layers()[l].gpu_tokens[g] / peak : 0;
      // Black -> red -> yellow -> white, a third of the range each.
      const double x = std::clamp(v, 0.0, 1.0) * 3;
      const uint8_t red = static_cast<uint8_t>(255 * std::min(1.0, x));
      const uint8_t green = static_cast<uint8_t>(255 * std::clamp(x - 1, 0.0, 1.0));
      const uint8_t blue = static_cast<uint8_t>(255 * std::clamp(x - 2, 0.0, 1.0));
      for (int y = l * (cell_h + 1); y < l * (cell_h + 1) + cell_h; ++y) {
        for (int px = g * cell_w; px < (g + 1) * cell_w; ++px) {
          uint8_t* p = rgb.data() + (static_cast<size_t>(y) * width + px) * 3;
          p[0] = red;
          p[1] = green;
          p[2] = blue;
        }
      }
    }
  }
  return EncodePng(width, height, rgb);
}

}  // namespace deepinfer
