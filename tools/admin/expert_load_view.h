// `deepinfer-admin expert-load`: the coordinator's EPLB load window (GetExpertLoadResponse)
// as a terminal table of tokens per GPU per MoE layer, as the loads JSON `plan --load`
// reads, and as a heat-map PNG (rows: layers, columns: GPUs, with axes, a colour scale and a
// title).
//
// Tokens per GPU follow the layout the group runs: the coordinator's placement once every
// member runs its epoch, experts in order before that (a token routed to an expert with k
// replicas counts 1/k on each replica's GPU, as BalanceReport models dispatch).
#ifndef DEEPINFER_TOOLS_ADMIN_EXPERT_LOAD_VIEW_H_
#define DEEPINFER_TOOLS_ADMIN_EXPERT_LOAD_VIEW_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/eplb/balance_report.h"
#include "coordinator/eplb/expert_loads.h"
#include "proto/admin.pb.h"
#include "tools/admin/rgb_image.h"

namespace deepinfer {

// FAILED_PRECONDITION when the window is empty; INVALID_ARGUMENT for a malformed response.
absl::StatusOr<ExpertLoads> LoadsFromResponse(const GetExpertLoadResponse& response);

// Per GPU load of the running layout; FAILED_PRECONDITION without a group (num_gpus 0).
absl::StatusOr<BalanceReport> GpuLoads(const GetExpertLoadResponse& response);

// The table (a header line with the window and the layout, one row per layer, an overall row).
absl::StatusOr<std::string> FormatExpertLoadTable(const GetExpertLoadResponse& response);

// The heat map's colours: a white background, dark grey text and lines.
inline constexpr Rgb kHeatMapBackground{255, 255, 255};
inline constexpr Rgb kHeatMapInk{40, 40, 40};

// The colour of a cell with `fraction` (clamped to [0, 1]) of the busiest cell's tokens:
// viridis, dark purple (no tokens) through blue and green to yellow (the busiest), ordered in
// lightness and never the background.
Rgb HeatColour(double fraction);

// Where the heat map's parts are, in pixels.
struct HeatMapLayout {
  // Cell (layer l, GPU g) covers x in [plot_x + g * cell_w, + cell_w) and y in
  // [plot_y + l * cell_h, + cell_h), less a one-pixel gap at its right and bottom edge when
  // cells are large enough to show one.
  int plot_x = 0, plot_y = 0, cell_w = 0, cell_h = 0;
  // The colour scale: top row HeatColour(1) = scale_max tokens, bottom row HeatColour(0) = 0.
  int bar_x = 0, bar_y = 0, bar_w = 0, bar_h = 0;
  double scale_max = 0;
  // The title's lines: each drawn at (title_x, title_y + i * title_line_h).
  int title_x = 0, title_y = 0, title_line_h = 0;
  int text_scale = 0;  // font pixels are text_scale x text_scale
};

struct ExpertLoadPicture {
  RgbImage image;
  HeatMapLayout layout;
  std::vector<std::string> title;
};

// The heat map: one cell per (MoE layer, GPU) coloured by that GPU's tokens in that layer; a
// title with the window and max/mean tokens per GPU (the imbalance), the layer axis (rows) and
// GPU axis (columns) with labels and tick numbers, and a colour scale from 0 to the busiest
// cell's tokens. Same errors as GpuLoads.
absl::StatusOr<ExpertLoadPicture> RenderExpertLoadPicture(const GetExpertLoadResponse& response);

// RenderExpertLoadPicture as PNG bytes.
absl::StatusOr<std::string> RenderExpertLoadPng(const GetExpertLoadResponse& response);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_ADMIN_EXPERT_LOAD_VIEW_H_
