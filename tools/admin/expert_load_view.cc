#include "tools/admin/expert_load_view.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/eplb/placement_proto.h"

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

Rgb HeatColour(double fraction) {
  // matplotlib's viridis at 0, 1/8, ..., 1; linear in between.
  static constexpr Rgb kStops[] = {{68, 1, 84},    {71, 45, 123},  {59, 82, 139},
                                   {44, 114, 142}, {33, 145, 140}, {40, 174, 128},
                                   {94, 201, 98},  {173, 220, 48}, {253, 231, 37}};
  constexpr int kLast = static_cast<int>(sizeof(kStops) / sizeof(kStops[0])) - 1;
  const double x = std::clamp(std::isnan(fraction) ? 0.0 : fraction, 0.0, 1.0) * kLast;
  const int i = std::min(static_cast<int>(x), kLast - 1);
  const double t = x - i;
  auto mix = [t](uint8_t a, uint8_t b) {
    return static_cast<uint8_t>(std::lround(a + (static_cast<double>(b) - a) * t));
  };
  return {mix(kStops[i].r, kStops[i + 1].r), mix(kStops[i].g, kStops[i + 1].g),
          mix(kStops[i].b, kStops[i + 1].b)};
}

namespace {

// "45", "12.5", "13.4K", "2.31M": short enough for an axis, in the unit `scale` would take
// (so that one scale reads 0, 7.4K, 14.7K).
std::string ShortCount(double v, double scale) {
  if (v == 0) return "0";
  if (scale >= 1e6) return absl::StrFormat("%.2fM", v / 1e6);
  if (scale >= 1e4) return absl::StrFormat("%.1fK", v / 1e3);
  if (v == std::floor(v)) return absl::StrFormat("%.0f", v);
  return absl::StrFormat("%.1f", v);
}

// The smallest of 1, 2, 5, 10, 20, 50, ... whose `step * pitch` is at least `room` pixels.
int TickStep(int pitch, int room) {
  for (int decade = 1;; decade *= 10) {
    for (int m : {1, 2, 5}) {
      if (static_cast<int64_t>(m) * decade * pitch >= room) return m * decade;
    }
  }
}

}  // namespace

absl::StatusOr<ExpertLoadPicture> RenderExpertLoadPicture(const GetExpertLoadResponse& r) {
  absl::StatusOr<BalanceReport> report = GpuLoads(r);
  if (!report.ok()) return report.status();
  const int gpus = r.num_gpus();
  const int layers = static_cast<int>(report->layers().size());
  double peak = 0;
  for (const BalanceReport::Layer& layer : report->layers()) {
    peak = std::max(peak, layer.max_tokens);
  }

  std::vector<std::string> title = {
      absl::StrCat("EXPERT LOAD: TOKENS PER GPU AND MOE LAYER, LAST ", r.num_steps(), " STEPS"),
      absl::StrFormat("MAX/MEAN %.3f OVER ALL LAYERS (MAX %s, MEAN %s TOKENS PER GPU)",
                      report->imbalance(),
                      ShortCount(report->total_max_tokens(), report->total_max_tokens()),
                      ShortCount(report->total_mean_tokens(), report->total_mean_tokens())),
      absl::StrCat(layers, layers == 1 ? " LAYER X " : " LAYERS X ", gpus,
                   gpus == 1 ? " GPU, " : " GPUS, ", absl::AsciiStrToUpper(LayoutName(r)))};
  // Tick marks are kTick long and kGap away from their numbers, so that "-" never reads as
  // part of a number.
  constexpr int kScale = 2, kMargin = 16, kGap = 6, kTick = 4;
  const int text_h = RgbImage::TextHeight(kScale);
  HeatMapLayout lay;
  lay.text_scale = kScale;
  lay.title_x = kMargin;
  lay.title_y = kMargin;
  lay.title_line_h = text_h + kGap;
  int title_w = 0;
  for (const std::string& line : title)
    title_w = std::max(title_w, RgbImage::TextWidth(line, kScale));

  lay.cell_w = std::clamp(640 / gpus, 4, 128);
  lay.cell_h = std::clamp(448 / layers, 5, 96);
  const int plot_w = gpus * lay.cell_w, plot_h = layers * lay.cell_h;
  const std::string layer_label = "LAYER", gpu_label = "GPU", bar_label = "TOKENS";
  const int left =
      std::max(RgbImage::TextWidth(layer_label, kScale),
               RgbImage::TextWidth(absl::StrCat(layers - 1), kScale) + kTick + 2 * kGap);
  lay.plot_x = kMargin + left + kGap;
  // Title, a blank line, the axis headers, room for the colour scale's top value.
  lay.plot_y = lay.title_y + static_cast<int>(title.size()) * lay.title_line_h + text_h + kGap +
               text_h + 3 * kGap;
  lay.bar_w = 20;
  lay.bar_x = lay.plot_x + plot_w + 4 * kGap;
  lay.bar_y = lay.plot_y;
  lay.bar_h = std::max(plot_h, 120);
  lay.scale_max = peak;
  const std::vector<std::pair<double, std::string>> bar_ticks = {
      {1.0, ShortCount(peak, peak)}, {0.5, ShortCount(peak / 2, peak)}, {0.0, "0"}};
  int bar_text_w = RgbImage::TextWidth(bar_label, kScale) - lay.bar_w - kGap;
  for (const auto& [f, text] : bar_ticks) {
    bar_text_w = std::max(bar_text_w, kTick + kGap + RgbImage::TextWidth(text, kScale));
  }
  const int x_ticks_y = lay.plot_y + plot_h + kTick + kGap;
  const int gpu_label_y = x_ticks_y + text_h + kGap;
  const int width =
      std::max(lay.bar_x + lay.bar_w + kGap + bar_text_w, kMargin + title_w) + kMargin;
  const int height =
      std::max(gpu_label_y + text_h, lay.bar_y + lay.bar_h + text_h / 2 + 1) + kMargin;

  ExpertLoadPicture picture{RgbImage(width, height, kHeatMapBackground), lay, title};
  RgbImage& img = picture.image;
  for (size_t i = 0; i < title.size(); ++i) {
    img.DrawText(lay.title_x, lay.title_y + static_cast<int>(i) * lay.title_line_h, title[i],
                 kScale, kHeatMapInk);
  }
  // Cells, with a background gap between them where they are big enough to spare one.
  const int gap_x = lay.cell_w >= 12 ? 1 : 0, gap_y = lay.cell_h >= 12 ? 1 : 0;
  for (int l = 0; l < layers; ++l) {
    for (int g = 0; g < gpus; ++g) {
      const double tokens = report->layers()[l].gpu_tokens[g];
      img.FillRect(lay.plot_x + g * lay.cell_w, lay.plot_y + l * lay.cell_h, lay.cell_w - gap_x,
                   lay.cell_h - gap_y, HeatColour(peak > 0 ? tokens / peak : 0));
    }
  }
  img.StrokeRect(lay.plot_x - 1, lay.plot_y - 1, plot_w + 2, plot_h + 2, kHeatMapInk);
  // Layer axis: header above, numbers (every `step`-th layer) left of the rows.
  const int header_y = lay.plot_y - 3 * kGap - text_h;
  img.DrawText(kMargin, header_y, layer_label, kScale, kHeatMapInk);
  const int layer_step = TickStep(lay.cell_h, text_h + 4);
  for (int l = 0; l < layers; l += layer_step) {
    const int mid = lay.plot_y + l * lay.cell_h + (lay.cell_h - gap_y) / 2;
    const std::string n = absl::StrCat(l);
    img.FillRect(lay.plot_x - 1 - kTick, mid, kTick, 1, kHeatMapInk);
    img.DrawText(lay.plot_x - 1 - kTick - kGap - RgbImage::TextWidth(n, kScale), mid - text_h / 2,
                 n, kScale, kHeatMapInk);
  }
  // GPU axis: numbers (every `step`-th GPU) under the columns, the label under them.
  const int gpu_step =
      TickStep(lay.cell_w, RgbImage::TextWidth(absl::StrCat(gpus - 1), kScale) + 3 * kGap);
  for (int g = 0; g < gpus; g += gpu_step) {
    const int mid = lay.plot_x + g * lay.cell_w + (lay.cell_w - gap_x) / 2;
    const std::string n = absl::StrCat(g);
    img.FillRect(mid, lay.plot_y + plot_h + 1, 1, kTick, kHeatMapInk);
    img.DrawText(mid - RgbImage::TextWidth(n, kScale) / 2, x_ticks_y, n, kScale, kHeatMapInk);
  }
  img.DrawText(lay.plot_x + plot_w / 2 - RgbImage::TextWidth(gpu_label, kScale) / 2, gpu_label_y,
               gpu_label, kScale, kHeatMapInk);
  // Colour scale: a bar from the busiest cell's colour down to none, its header and values.
  for (int y = 0; y < lay.bar_h; ++y) {
    const double f = lay.bar_h > 1 ? 1.0 - static_cast<double>(y) / (lay.bar_h - 1) : 1.0;
    img.FillRect(lay.bar_x, lay.bar_y + y, lay.bar_w, 1, HeatColour(f));
  }
  img.StrokeRect(lay.bar_x - 1, lay.bar_y - 1, lay.bar_w + 2, lay.bar_h + 2, kHeatMapInk);
  img.DrawText(lay.bar_x, header_y, bar_label, kScale, kHeatMapInk);
  for (const auto& [f, text] : bar_ticks) {
    const int y = lay.bar_y + static_cast<int>(std::lround((1.0 - f) * (lay.bar_h - 1)));
    img.FillRect(lay.bar_x + lay.bar_w + 1, y, kTick, 1, kHeatMapInk);
    img.DrawText(lay.bar_x + lay.bar_w + 1 + kTick + kGap, y - text_h / 2, text, kScale,
                 kHeatMapInk);
  }
  return picture;
}

absl::StatusOr<std::string> RenderExpertLoadPng(const GetExpertLoadResponse& r) {
  absl::StatusOr<ExpertLoadPicture> picture = RenderExpertLoadPicture(r);
  if (!picture.ok()) return picture.status();
  return picture->image.EncodePng();
}

}  // namespace deepinfer
