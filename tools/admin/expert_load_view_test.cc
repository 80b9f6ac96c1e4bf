// expert-load views: loads unpacked from the response, per-GPU tokens of the contiguous layout
// and of a running placement (hand-computed), the table, and the heat map: cells in the colour
// of their hand-computed load (never the background, also with one GPU), the colour scale and
// its values, the title drawn from its lines, axis labels and tick numbers, and a PNG that zlib
// decodes to the same pixels.
#include "tools/admin/expert_load_view.h"

#include <zlib.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <tuple>

#include "common/eplb/placement_proto.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// 1 layer, 4 experts, 2 GPUs: expert 0 takes 60 tokens, the others 10 each.
GetExpertLoadResponse Response() {
  GetExpertLoadResponse r;
  r.set_window_steps(1000);
  r.set_num_steps(12);
  r.set_num_layers(1);
  r.set_num_experts(4);
  for (double v : {60.0, 10.0, 10.0, 10.0}) r.add_loads(v);
  r.set_num_gpus(2);
  return r;
}

TEST(ExpertLoadViewTest, ContiguousLayoutWithoutAPlacement) {
  GetExpertLoadResponse r = Response();
  auto loads = LoadsFromResponse(r);
  ASSERT_TRUE(loads.ok()) << loads.status();
  EXPECT_THAT((*loads)[0], ElementsAre(60, 10, 10, 10));
  auto gpus = GpuLoads(r);
  ASSERT_TRUE(gpus.ok()) << gpus.status();
  EXPECT_THAT(gpus->layers()[0].gpu_tokens, ElementsAre(70, 20));  // experts {0,1} and {2,3}
  auto table = FormatExpertLoadTable(r);
  ASSERT_TRUE(table.ok());
  EXPECT_THAT(*table, HasSubstr("experts in order, no placement"));
  EXPECT_THAT(*table, HasSubstr("70.0"));
  EXPECT_THAT(*table, HasSubstr("1.556"));  // 70 / 45
}

TEST(ExpertLoadViewTest, RunningPlacementSplitsReplicas) {
  GetExpertLoadResponse r = Response();
  // 6 slots: GPU 0 = {0, 1, 2}, GPU 1 = {0, 3, 3}: expert 0 split 30/30, expert 3 5/5 on GPU 1.
  auto p = ExpertPlacement::FromPhy2Log({{0, 1, 2, 0, 3, 3}}, 4);
  ASSERT_TRUE(p.ok());
  *r.mutable_placement() = PlacementToProto(*p, 2);
  r.set_active_epoch(1);  // handed out, not running yet: still the contiguous layout
  EXPECT_THAT(GpuLoads(r)->layers()[0].gpu_tokens, ElementsAre(70, 20));
  EXPECT_THAT(*FormatExpertLoadTable(r), HasSubstr("not running on every worker yet"));
  r.set_active_epoch(2);
  EXPECT_THAT(GpuLoads(r)->layers()[0].gpu_tokens, ElementsAre(50, 40));
  EXPECT_THAT(*FormatExpertLoadTable(r), HasSubstr("placement epoch 2"));
}

// 3 layers, 4 experts, 1 GPU: the GPU holds every expert, so its tokens per layer are the
// layers' totals, 90, 30 and 60.
GetExpertLoadResponse OneGpu() {
  GetExpertLoadResponse r;
  r.set_window_steps(1000);
  r.set_num_steps(40);
  r.set_num_layers(3);
  r.set_num_experts(4);
  for (double v : {30.0, 30.0, 20.0, 10.0, 5.0, 5.0, 10.0, 10.0, 20.0, 20.0, 10.0, 10.0}) {
    r.add_loads(v);
  }
  r.set_num_gpus(1);
  return r;
}

// 26 layers (as Moonlight's MoE layers), 16 experts, 4 GPUs: expert e of layer l takes
// 1 + (l * 7 + e * 3) % 11 tokens, and expert 5 of layer 9 a thousand more (GPU 1's).
GetExpertLoadResponse FourGpus() {
  GetExpertLoadResponse r;
  r.set_window_steps(1000);
  r.set_num_steps(1000);
  r.set_num_layers(26);
  r.set_num_experts(16);
  for (int l = 0; l < 26; ++l) {
    for (int e = 0; e < 16; ++e)
      r.add_loads(1 + (l * 7 + e * 3) % 11 + (l == 9 && e == 5 ? 1000 : 0));
  }
  r.set_num_gpus(4);
  return r;
}

Rgb CellCentre(const ExpertLoadPicture& p, int layer, int gpu) {
  const HeatMapLayout& l = p.layout;
  return p.image.At(l.plot_x + gpu * l.cell_w + l.cell_w / 2,
                    l.plot_y + layer * l.cell_h + l.cell_h / 2);
}

// Pixels of the text colour in [x0, x1) x [y0, y1).
int InkIn(const RgbImage& img, int x0, int y0, int x1, int y1) {
  int n = 0;
  for (int y = std::max(0, y0); y < std::min(img.height(), y1); ++y) {
    for (int x = std::max(0, x0); x < std::min(img.width(), x1); ++x) {
      n += img.At(x, y) == kHeatMapInk;
    }
  }
  return n;
}

// For a person to look at: the test's PNGs among its outputs (bazel-testlogs/.../outputs.zip).
void Keep(const ExpertLoadPicture& p, const std::string& name) {
  const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR");
  if (dir == nullptr) return;
  auto png = p.image.EncodePng();
  ASSERT_TRUE(png.ok()) << png.status();
  std::ofstream(std::string(dir) + "/" + name, std::ios::binary) << *png;
}

TEST(ExpertLoadViewTest, HeatColoursAreViridisAndNeverTheBackground) {
  // matplotlib's viridis end points.
  EXPECT_EQ(HeatColour(0), (Rgb{68, 1, 84}));
  EXPECT_EQ(HeatColour(1), (Rgb{253, 231, 37}));
  EXPECT_EQ(HeatColour(-3), HeatColour(0));
  EXPECT_EQ(HeatColour(7), HeatColour(1));
  double last = -1;
  for (int i = 0; i <= 1000; ++i) {
    const Rgb c = HeatColour(i / 1000.0);
    EXPECT_NE(c, kHeatMapBackground) << i;
    EXPECT_NE(c, kHeatMapInk) << i;
    // Lighter with more load (Rec. 709 luma of the sRGB values).
    const double luma = 0.2126 * c.r + 0.7152 * c.g + 0.0722 * c.b;
    EXPECT_GE(luma, last - 0.5) << i;
    last = luma;
  }
}

TEST(ExpertLoadViewTest, OneGpuCellsShowTheirLoadNotTheBackground) {
  auto p = RenderExpertLoadPicture(OneGpu());
  ASSERT_TRUE(p.ok()) << p.status();
  Keep(*p, "heatmap-1gpu.png");
  EXPECT_EQ(p->layout.scale_max, 90);
  EXPECT_EQ(CellCentre(*p, 0, 0), HeatColour(1));  // the busiest cell
  EXPECT_NE(CellCentre(*p, 0, 0), kHeatMapBackground);
  EXPECT_EQ(CellCentre(*p, 1, 0), HeatColour(30.0 / 90));
  EXPECT_EQ(CellCentre(*p, 2, 0), HeatColour(60.0 / 90));
  // Every pixel of every cell (gaps aside) has its colour.
  const HeatMapLayout& l = p->layout;
  for (int layer = 0; layer < 3; ++layer) {
    for (int y = l.plot_y + layer * l.cell_h; y < l.plot_y + (layer + 1) * l.cell_h - 1; ++y) {
      for (int x = l.plot_x; x < l.plot_x + l.cell_w - 1; ++x) {
        ASSERT_EQ(p->image.At(x, y), CellCentre(*p, layer, 0)) << x << "," << y;
      }
    }
  }
}

TEST(ExpertLoadViewTest, TwoGpusCellsFollowTheContiguousLayout) {
  auto p = RenderExpertLoadPicture(Response());
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(CellCentre(*p, 0, 0), HeatColour(1));  // 70 tokens, the busiest
  EXPECT_EQ(CellCentre(*p, 0, 1), HeatColour(20.0 / 70));
}

TEST(ExpertLoadViewTest, ColourScaleRunsFromTheBusiestCellToZeroWithValues) {
  auto p = RenderExpertLoadPicture(OneGpu());
  ASSERT_TRUE(p.ok()) << p.status();
  const HeatMapLayout& l = p->layout;
  ASSERT_GE(l.bar_h, 100);
  const int x = l.bar_x + l.bar_w / 2;
  EXPECT_EQ(p->image.At(x, l.bar_y), HeatColour(1));
  EXPECT_EQ(p->image.At(x, l.bar_y + l.bar_h - 1), HeatColour(0));
  EXPECT_EQ(p->image.At(x, l.bar_y + (l.bar_h - 1) / 2), HeatColour(0.5));
  std::set<std::tuple<int, int, int>> colours;
  for (int y = l.bar_y; y < l.bar_y + l.bar_h; ++y) {
    const Rgb c = p->image.At(x, y);
    colours.insert({c.r, c.g, c.b});
  }
  EXPECT_GE(colours.size(), 50u);  // a gradient, not a few blocks
  // The values "90", "45" and "0" right of the bar, at its top, middle and bottom.
  const int text_h = RgbImage::TextHeight(l.text_scale);
  const int x0 = l.bar_x + l.bar_w + 2, x1 = p->image.width();
  for (int y : {l.bar_y, l.bar_y + l.bar_h / 2, l.bar_y + l.bar_h - 1}) {
    EXPECT_GT(InkIn(p->image, x0, y - text_h / 2, x1, y + text_h / 2 + 1), 10) << y;
  }
  // Nothing in between them.
  EXPECT_EQ(InkIn(p->image, x0 + 8, l.bar_y + text_h, x1, l.bar_y + l.bar_h / 2 - text_h), 0);
}

TEST(ExpertLoadViewTest, TitleSaysTheImbalanceAndIsDrawn) {
  auto p = RenderExpertLoadPicture(Response());
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_EQ(p->title.size(), 3u);
  EXPECT_THAT(p->title[0], HasSubstr("LAST 12 STEPS"));
  EXPECT_THAT(p->title[1], HasSubstr("MAX/MEAN 1.556"));  // 70 / 45
  EXPECT_THAT(p->title[1], HasSubstr("MAX 70, MEAN 45"));
  EXPECT_THAT(p->title[2], HasSubstr("1 LAYER X 2 GPUS, EXPERTS IN ORDER"));
  // The title's pixels are its lines in the font, at the layout's place.
  const HeatMapLayout& l = p->layout;
  RgbImage expected(p->image.width(), p->image.height(), kHeatMapBackground);
  for (size_t i = 0; i < p->title.size(); ++i) {
    expected.DrawText(l.title_x, l.title_y + static_cast<int>(i) * l.title_line_h, p->title[i],
                      l.text_scale, kHeatMapInk);
  }
  const int band_end = l.title_y + 3 * l.title_line_h;
  int ink = 0;
  for (int y = 0; y < band_end; ++y) {
    for (int x = 0; x < p->image.width(); ++x) {
      ASSERT_EQ(p->image.At(x, y), expected.At(x, y)) << x << "," << y;
      ink += expected.At(x, y) == kHeatMapInk;
    }
  }
  EXPECT_GT(ink, 1000);
}

TEST(ExpertLoadViewTest, AxesHaveLabelsAndTickNumbers) {
  auto p = RenderExpertLoadPicture(FourGpus());
  ASSERT_TRUE(p.ok()) << p.status();
  Keep(*p, "heatmap-4gpu.png");
  const HeatMapLayout& l = p->layout;
  const RgbImage& img = p->image;
  const int text_h = RgbImage::TextHeight(l.text_scale);
  const int plot_bottom = l.plot_y + 26 * l.cell_h;
  // The busiest cell is GPU 1 (experts 4..7) in layer 9.
  EXPECT_EQ(CellCentre(*p, 9, 1), HeatColour(1));
  // Layer numbers left of the plot: at least every fifth row of 26 carries one, the header
  // "LAYER" sits above them.
  int labelled_rows = 0;
  for (int layer = 0; layer < 26; ++layer) {
    const int mid = l.plot_y + layer * l.cell_h + l.cell_h / 2;
    labelled_rows += InkIn(img, 0, mid - 1, l.plot_x - 2, mid + 2) > 0;
  }
  EXPECT_GE(labelled_rows, 6);
  EXPECT_GT(InkIn(img, 0, l.plot_y - text_h - 8, l.plot_x - 2, l.plot_y - 2), 20);  // LAYER
  // A number under every GPU column, "GPU" under them.
  for (int gpu = 0; gpu < 4; ++gpu) {
    EXPECT_GT(InkIn(img, l.plot_x + gpu * l.cell_w, plot_bottom + 2,
                    l.plot_x + (gpu + 1) * l.cell_w, plot_bottom + 8 + text_h),
              5)
        << gpu;
  }
  EXPECT_GT(InkIn(img, l.plot_x, plot_bottom + 10 + text_h, l.plot_x + 4 * l.cell_w,
                  plot_bottom + 16 + 2 * text_h),
            20);
  // A frame around the plot.
  EXPECT_EQ(img.At(l.plot_x - 1, l.plot_y + 5), kHeatMapInk);
  EXPECT_EQ(img.At(l.plot_x + 4 * l.cell_w, l.plot_y + 5), kHeatMapInk);
}

TEST(ExpertLoadViewTest, PngHoldsThePicture) {
  GetExpertLoadResponse r = FourGpus();
  auto p = RenderExpertLoadPicture(r);
  auto png = RenderExpertLoadPng(r);
  ASSERT_TRUE(p.ok() && png.ok());
  const int w = p->image.width(), h = p->image.height();
  // IHDR's size, then the IDAT chunks inflated by zlib: filter byte 0 and the pixels per row.
  auto u32 = [&](size_t at) {
    return (uint32_t(uint8_t((*png)[at])) << 24) | (uint32_t(uint8_t((*png)[at + 1])) << 16) |
           (uint32_t(uint8_t((*png)[at + 2])) << 8) | uint32_t(uint8_t((*png)[at + 3]));
  };
  EXPECT_EQ(u32(16), static_cast<uint32_t>(w));
  EXPECT_EQ(u32(20), static_cast<uint32_t>(h));
  std::string idat;
  for (size_t at = 8; at + 12 <= png->size();) {
    const uint32_t len = u32(at);
    if (png->substr(at + 4, 4) == "IDAT") idat += png->substr(at + 8, len);
    at += 12 + len;
  }
  std::vector<uint8_t> raw(static_cast<size_t>(h) * (1 + w * 3));
  uLongf raw_len = raw.size();
  ASSERT_EQ(
      uncompress(raw.data(), &raw_len, reinterpret_cast<const Bytef*>(idat.data()), idat.size()),
      Z_OK);
  ASSERT_EQ(raw_len, raw.size());
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      const uint8_t* px = raw.data() + static_cast<size_t>(y) * (1 + w * 3) + 1 + x * 3;
      ASSERT_EQ((Rgb{px[0], px[1], px[2]}), p->image.At(x, y)) << x << "," << y;
    }
  }
}

TEST(ExpertLoadViewTest, ManyGpusAndLayersKeepTheirTicksApart) {
  GetExpertLoadResponse r;
  r.set_num_steps(5);
  r.set_num_layers(58);
  r.set_num_experts(256);
  for (int i = 0; i < 58 * 256; ++i) r.add_loads(1 + i % 13);
  r.set_num_gpus(256);
  auto p = RenderExpertLoadPicture(r);
  ASSERT_TRUE(p.ok()) << p.status();
  Keep(*p, "heatmap-256gpu.png");
  const HeatMapLayout& l = p->layout;
  EXPECT_LE(p->image.width(), 1400);
  // Under the plot: columns with ink in the tick number band form the numbers. Inside a number
  // the blank columns are at most 3 font pixels wide (the spacing, plus a narrow digit's own);
  // between numbers there must be at least two characters' room.
  const int top = l.plot_y + 58 * l.cell_h + 2;
  const int text_h = RgbImage::TextHeight(l.text_scale);
  std::vector<int> labels;  // widths
  int start = -1, last_ink = -1;
  for (int x = 0; x < p->image.width(); ++x) {
    if (InkIn(p->image, x, top + 5, x + 1, top + 5 + text_h) == 0) continue;
    const int gap = x - last_ink - 1;
    if (last_ink >= 0 && gap > 3 * l.text_scale) {
      EXPECT_GE(gap, 2 * 6 * l.text_scale) << "numbers too close at x " << x;
      labels.push_back(last_ink - start + 1);
      start = -1;
    }
    if (start < 0) start = x;
    last_ink = x;
  }
  if (start >= 0) labels.push_back(last_ink - start + 1);
  EXPECT_GE(labels.size(), 5u);
  for (int w : labels) EXPECT_LE(w, RgbImage::TextWidth("255", l.text_scale));
}

TEST(ExpertLoadViewTest, EmptyWindowOrNoGroupAreClearErrors) {
  GetExpertLoadResponse empty;
  EXPECT_TRUE(absl::IsFailedPrecondition(LoadsFromResponse(empty).status()));
  GetExpertLoadResponse r = Response();
  r.set_num_gpus(0);
  EXPECT_THAT(std::string(GpuLoads(r).status().message()), HasSubstr("no serving"));
  r = Response();
  r.add_loads(1);
  EXPECT_TRUE(absl::IsInvalidArgument(LoadsFromResponse(r).status()));
}

}  // namespace
}  // namespace deepinfer
