// Fp8WgmmaSwapGroupedGemm against the W8A8 product in double on the host: random e4m3
// activations with random per-row 1 x 128 block scales in Fp8QuantizeRows' grouped layout,
// random e4m3 expert weights with 128 x 128 block scales. The bound is 2^-9 of the sum of the
// terms' magnitudes (the tensor cores add one k block's 128 products with fewer bits than fp32;
// the promotion to fp32 is per block); a wrong swizzle, descriptor, fragment or scale index is
// off by about the sum itself. Both grid forms (persistent, one CTA per (weight tile, expert)),
// each launched with programmatic dependent launch and without, after a non-kernel predecessor
// (the inputs' upload, c's poisoning), are checked against it and are bit-identical. Also: rows
// past the groups and padding columns untouched, one CUDA-graph replay bit-identical, and the
// same bits behind a PDL kernel (kernels::DelayedCopy) that writes the offsets, activations and
// their scales just before the GEMM, eagerly and in a graph (a GEMM reading them before its
// griddepcontrol.wait would see zeros). The bf16 output (c_bf16), in both grid forms with and
// without PDL and in a graph replay: every value exactly the fp32 run's value rounded to the
// nearest bf16 (ties to even, rounded here on the host), the rest of the buffer untouched.
// Skips itself without a compute capability 9.0 device.
#include "kernels/gemm/fp8_wgmma_decode.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/pdl_chain.h"
#include "kernels/testing/fp8_test_util.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace kernels {
namespace {

using fp8_testing::HostFp8;
using testing::DeviceArray;

constexpr double kUnit = 1.0 / 512;

// fp32 to bf16 bits, nearest with ties to even (the values here are finite).
uint16_t RoundToBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

#define SKIP_WITHOUT_WGMMA()                                                               \
  do {                                                                                     \
    DEEPINFER_SKIP_WITHOUT_GPU();                                                          \
    if (!Fp8WgmmaSwapDeviceSupports()) GTEST_SKIP() << "no compute capability 9.0 device"; \
  } while (0)

// Groups cycle through `rows` (num_groups of them); group g multiplies weight g % weights (a few
// distinct matrices keep the host product cheap at 256 experts).
struct SwapCase {
  int32_t num_groups;
  std::vector<int32_t> rows;
  int32_t weights;
  int64_t n, k, split;
  int32_t hint;
  int64_t ldc_pad;
};

class Fp8WgmmaSwapTest : public ::testing::TestWithParam<SwapCase> {};

TEST_P(Fp8WgmmaSwapTest, EachGroupMatchesItsProductOnTheHost) {
  SKIP_WITHOUT_WGMMA();
  const SwapCase c = GetParam();
  const int64_t n = c.n, k = c.k, ldc = n + c.ldc_pad, blocks = Fp8ScaleCols(k);
  const int32_t G = c.num_groups;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);

  std::vector<int32_t> offsets(G + 1, 0);
  for (int32_t g = 0; g < G; ++g) offsets[g + 1] = offsets[g] + c.rows[g % c.rows.size()];
  const int32_t total = offsets[G];
  const int32_t max_rows = total + 5;  // rows past the groups: left untouched
  const int64_t lda = k;

  std::vector<HostFp8> w;
  for (int32_t i = 0; i < c.weights; ++i) {
    w.push_back(fp8_testing::MakeWeight(n, k, k, c.split, &gen));
  }
  // Activations: every row of the buffer random (the rows past the groups too, as stale data).
  const std::vector<uint8_t> a = fp8_testing::RandomFp8(size_t(max_rows) * lda, &gen);
  std::vector<float> sa(std::max<int64_t>(int64_t{total} * blocks, 1));
  {
    std::vector<float> r = fp8_testing::RandomScales(sa.size(), &gen);
    for (size_t i = 0; i < sa.size(); ++i) sa[i] = std::abs(r[i]) * 64.0f;
  }

  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> dw;
  std::vector<std::unique_ptr<DeviceArray<float>>> dws;
  std::vector<const uint8_t*> host_w(G);
  std::vector<const float*> host_s(G);
  for (int32_t i = 0; i < c.weights; ++i) {
    dw.push_back(std::make_unique<DeviceArray<uint8_t>>(w[i].data));
    dws.push_back(std::make_unique<DeviceArray<float>>(w[i].scales));
  }
  for (int32_t g = 0; g < G; ++g) {
    host_w[g] = dw[g % c.weights]->get();
    host_s[g] = dws[g % c.weights]->get();
  }
  DeviceArray<uint8_t> maps(Fp8WgmmaSwapWeightMapsBytes(G));
  DEEPINFER_CUDA_OK(Fp8WgmmaSwapBuildWeightMaps(G, host_w.data(), n, k, k, maps.get(), nullptr));
  DeviceArray<const float*> dscales(host_s);
  // What an earlier kernel writes (the offsets, the activations and their scales) in one region,
  // so that one copy kernel can write it all (below); each part 256-byte aligned.
  auto round_up = [](size_t x) { return (x + 255) / 256 * 256; };
  const size_t off_at = 0, a_at = round_up(offsets.size() * sizeof(int32_t));
  const size_t sa_at = a_at + round_up(a.size()), region_bytes = sa_at + round_up(sa.size() * 4);
  std::vector<uint8_t> region(region_bytes, 0);
  std::memcpy(region.data() + off_at, offsets.data(), offsets.size() * sizeof(int32_t));
  std::memcpy(region.data() + a_at, a.data(), a.size());
  std::memcpy(region.data() + sa_at, sa.data(), sa.size() * sizeof(float));
  DeviceArray<uint8_t> inputs(region);
  DeviceArray<float> dc(size_t(max_rows) * ldc);
  dc.Poison();

  Fp8WgmmaSwapGroupedGemmParams p;
  p.num_groups = G, p.max_rows = max_rows;
  p.offsets = reinterpret_cast<const int32_t*>(inputs.get() + off_at);
  p.n = n, p.k = k, p.a = inputs.get() + a_at, p.lda = lda;
  p.a_scales = reinterpret_cast<const float*>(inputs.get() + sa_at);
  p.weight_maps = maps.get(), p.scales = dscales.get();
  p.scale_ld = w[0].scale_ld, p.split_rows = c.split;
  p.c = dc.get(), p.ldc = ldc, p.rows_per_group_hint = c.hint;
  ASSERT_TRUE(Fp8WgmmaSwapGroupedGemmSupports(p));
  ASSERT_TRUE(p.pdl && p.persistent);  // the defaults

  // The host product's results and bounds, group by group.
  std::vector<std::vector<double>> want(G), bound(G);
  for (int32_t g = 0; g < G; ++g) {
    const int32_t r0 = offsets[g], count = offsets[g + 1] - r0;
    if (count == 0) continue;
    std::vector<double> x(int64_t{count} * k);
    for (int32_t i = 0; i < count; ++i) {
      for (int64_t q = 0; q < k; ++q) {
        x[i * k + q] = static_cast<double>(F8E4M3ToFloat(a[(r0 + i) * lda + q])) *
                       sa[int64_t{r0} * blocks + (q / kFp8BlockSize) * count + i];
      }
    }
    std::vector<double> mag;
    fp8_testing::DequantisedProduct(x, k, count, w[g % c.weights], &want[g], &mag);
    bound[g] = fp8_testing::Bound(mag, kUnit);
  }
  // c against the host product, and untouched past the groups and in the padding columns.
  auto check = [&](const std::vector<float>& got, const char* what) {
    SCOPED_TRACE(what);
    for (int32_t g = 0; g < G; ++g) {
      const int32_t r0 = offsets[g], count = offsets[g + 1] - r0;
      if (count == 0) continue;
      std::vector<float> gg(int64_t{count} * n);
      for (int32_t i = 0; i < count; ++i) {
        for (int64_t j = 0; j < n; ++j) gg[i * n + j] = got[(r0 + i) * ldc + j];
      }
      ASSERT_TRUE(fp8_testing::WithinBound(gg, want[g], bound[g]))
          << "group " << g << " of " << count << " rows";
    }
    for (int64_t r = 0; r < max_rows; ++r) {
      for (int64_t j = (r < total ? n : 0); j < ldc; ++j) {
        ASSERT_TRUE(std::isnan(got[r * ldc + j])) << "untouched row " << r << " column " << j;
      }
    }
  };
  auto run = [&](const Fp8WgmmaSwapGroupedGemmParams& q, std::vector<float>* got) {
    dc.Poison();
    DEEPINFER_CUDA_OK(Fp8WgmmaSwapGroupedGemm(q, nullptr));
    DEEPINFER_CUDA_OK(dc.Download(got));
  };

  std::vector<float> got;
  run(p, &got);
  check(got, "persistent, PDL");
  if (HasFatalFailure()) return;
  // Without PDL, and one CTA per (weight tile, expert) with and without it: the same bits.
  Fp8WgmmaSwapGroupedGemmParams plain = p;
  plain.pdl = false;
  Fp8WgmmaSwapGroupedGemmParams per_tile = p;
  per_tile.persistent = false;
  Fp8WgmmaSwapGroupedGemmParams per_tile_plain = per_tile;
  per_tile_plain.pdl = false;
  const std::pair<const Fp8WgmmaSwapGroupedGemmParams*, const char*> forms[] = {
      {&plain, "persistent, plain launch"},
      {&per_tile, "per tile, PDL"},
      {&per_tile_plain, "per tile, plain launch"}};
  for (const auto& [q, what] : forms) {
    std::vector<float> other;
    run(*q, &other);
    check(other, what);
    EXPECT_TRUE(testing::SameBits(got, other, got.size())) << what;
  }
  // Run again: the same bits.
  {
    std::vector<float> again;
    run(p, &again);
    EXPECT_TRUE(testing::SameBits(got, again, got.size()));
  }

  // The bf16 output, every form: got's values rounded to bf16, 0xFFFF (the poison) elsewhere.
  cudaStream_t stream;
  DEEPINFER_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  {
    DeviceArray<uint16_t> dc16(size_t(max_rows) * ldc);
    std::vector<uint16_t> want16(got.size(), 0xFFFFu);
    for (int64_t r = 0; r < total; ++r) {
      for (int64_t j = 0; j < n; ++j) want16[r * ldc + j] = RoundToBf16(got[r * ldc + j]);
    }
    auto check16 = [&](const std::vector<uint16_t>& got16, const char* what) {
      SCOPED_TRACE(what);
      ASSERT_EQ(got16.size(), want16.size());
      for (int64_t r = 0; r < max_rows; ++r) {
        for (int64_t j = 0; j < ldc; ++j) {
          const size_t at = r * ldc + j;
          ASSERT_EQ(got16[at], want16[at])
              << "row " << r << " column " << j << " (fp32 " << got[at] << ")";
        }
      }
    };
    const std::pair<const Fp8WgmmaSwapGroupedGemmParams*, const char*> forms16[] = {
        {&p, "bf16, persistent, PDL"},
        {&plain, "bf16, persistent, plain launch"},
        {&per_tile, "bf16, per tile, PDL"},
        {&per_tile_plain, "bf16, per tile, plain launch"}};
    for (const auto& [q, what] : forms16) {
      Fp8WgmmaSwapGroupedGemmParams q16 = *q;
      q16.c = nullptr;
      q16.c_bf16 = dc16.get();
      ASSERT_TRUE(Fp8WgmmaSwapGroupedGemmSupports(q16));
      dc16.Poison();
      DEEPINFER_CUDA_OK(Fp8WgmmaSwapGroupedGemm(q16, nullptr));
      std::vector<uint16_t> got16;
      DEEPINFER_CUDA_OK(dc16.Download(&got16));
      check16(got16, what);
      if (HasFatalFailure()) return;
    }
    Fp8WgmmaSwapGroupedGemmParams p16 = p;
    p16.c = nullptr;
    p16.c_bf16 = dc16.get();
    dc16.Poison();
    DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
    cudaGraph_t graph16;
    DEEPINFER_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    const cudaError_t launched16 = Fp8WgmmaSwapGroupedGemm(p16, stream);
    DEEPINFER_CUDA_OK(cudaStreamEndCapture(stream, &graph16));
    DEEPINFER_CUDA_OK(launched16);
    cudaGraphExec_t exec16;
    DEEPINFER_CUDA_OK(cudaGraphInstantiate(&exec16, graph16, 0));
    DEEPINFER_CUDA_OK(cudaGraphLaunch(exec16, stream));
    DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
    std::vector<uint16_t> replayed16;
    DEEPINFER_CUDA_OK(dc16.Download(&replayed16));
    check16(replayed16, "bf16, graph replay");
    cudaGraphExecDestroy(exec16);
    cudaGraphDestroy(graph16);
    if (HasFatalFailure()) return;
  }

  // Captured in a CUDA graph and replayed: the same bits.
  dc.Poison();
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
  cudaGraph_t graph;
  DEEPINFER_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launched = Fp8WgmmaSwapGroupedGemm(p, stream);
  DEEPINFER_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  DEEPINFER_CUDA_OK(launched);
  cudaGraphExec_t exec;
  DEEPINFER_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  DEEPINFER_CUDA_OK(cudaGraphLaunch(exec, stream));
  DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<float> replayed;
  DEEPINFER_CUDA_OK(dc.Download(&replayed));
  EXPECT_TRUE(testing::SameBits(got, replayed, got.size()));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);

  // A PDL kernel writes the GEMM's inputs (offsets, activations, scales) from a staging copy
  // after spinning 20 us, the GEMM right behind it (eagerly: the launch attribute; in a graph: a
  // programmatic edge): the region holds zeros until the copy runs (all groups empty), so a GEMM
  // that read it before its wait would leave c poisoned or wrong. Both grid forms; the graph
  // replayed twice.
  DeviceArray<uint8_t> staging(region);
  auto write_then_multiply = [&](const Fp8WgmmaSwapGroupedGemmParams& q, cudaError_t* copied,
                                 cudaError_t* multiplied) {
    *copied = DelayedCopy(staging.get(), inputs.get(), static_cast<int64_t>(region_bytes),
                          /*delay_ns=*/20000, /*blocks=*/8, stream);
    *multiplied = Fp8WgmmaSwapGroupedGemm(q, stream);
  };
  for (const Fp8WgmmaSwapGroupedGemmParams* q : {&p, &per_tile}) {
    SCOPED_TRACE(q->persistent ? "persistent behind a PDL writer" : "per tile behind a PDL writer");
    {
      DEEPINFER_CUDA_OK(cudaMemset(inputs.get(), 0, region_bytes));
      dc.Poison();
      DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
      cudaError_t copied, gemm;
      write_then_multiply(*q, &copied, &gemm);
      DEEPINFER_CUDA_OK(copied);
      DEEPINFER_CUDA_OK(gemm);
      DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
      std::vector<float> chained;
      DEEPINFER_CUDA_OK(dc.Download(&chained));
      EXPECT_TRUE(testing::SameBits(got, chained, got.size())) << "eager";
    }
    DEEPINFER_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    cudaError_t copied, gemm;
    write_then_multiply(*q, &copied, &gemm);
    DEEPINFER_CUDA_OK(cudaStreamEndCapture(stream, &graph));
    DEEPINFER_CUDA_OK(copied);
    DEEPINFER_CUDA_OK(gemm);
    DEEPINFER_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    for (int replay = 0; replay < 2; ++replay) {
      DEEPINFER_CUDA_OK(cudaMemset(inputs.get(), 0, region_bytes));
      dc.Poison();
      DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
      DEEPINFER_CUDA_OK(cudaGraphLaunch(exec, stream));
      DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
      std::vector<float> chained;
      DEEPINFER_CUDA_OK(dc.Download(&chained));
      EXPECT_TRUE(testing::SameBits(got, chained, got.size())) << "replay " << replay;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
  }
  cudaStreamDestroy(stream);
}

const std::vector<int32_t> kSizes = {0, 1, 7, 12, 33, 64, 200};

// `groups` sizes, all 0 but group `busy` of `rows`.
std::vector<int32_t> OneBusy(int32_t groups, int32_t busy, int32_t rows) {
  std::vector<int32_t> v(groups, 0);
  v[busy] = rows;
  return v;
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, Fp8WgmmaSwapTest,
    ::testing::Values(
        // Moonlight: gate_up [2816 x 2048] stacked at 1408, down [2048 x 1408]; 64 experts.
        SwapCase{7, kSizes, 3, 2816, 2048, 1408, 0, 0},
        SwapCase{7, kSizes, 3, 2816, 2048, 1408, 8, 0},
        SwapCase{7, kSizes, 2, 2048, 1408, 0, 16, 4}, SwapCase{7, kSizes, 2, 2048, 1408, 0, 24, 0},
        SwapCase{7, kSizes, 3, 2816, 2048, 1408, 64, 0},
        SwapCase{64, {12, 0, 7, 1, 12}, 3, 2816, 2048, 1408, 12, 0},
        SwapCase{64, {12, 33, 0}, 2, 2048, 1408, 0, 32, 0},
        // DeepSeek-V3: gate_up [4096 x 7168] stacked at 2048, down [7168 x 2048]; 256 experts,
        // most idle.
        SwapCase{256, {0, 0, 1, 0, 0, 0, 7, 0, 0, 0, 0, 12, 0, 0, 0, 0}, 2, 4096, 7168, 2048, 8, 0},
        SwapCase{256, {0, 0, 0, 0, 0, 0, 0, 33, 0, 0, 0, 0, 0, 0, 0, 0}, 2, 7168, 2048, 0, 32, 0},
        SwapCase{5, {64, 200, 0, 1, 12}, 2, 7168, 2048, 0, 16, 2},
        // n neither a multiple of 128 nor of 4 (the last weight tile partly past n; the bf16
        // store's last columns one by one), ldc odd (bf16 rows not 8-byte aligned).
        SwapCase{7, kSizes, 2, 1002, 1408, 0, 16, 1},
        // Many empty experts: 1000 groups with 3 rows in every 16th (at the persistent form's
        // group limit), 1500 (above it: one CTA per tile), none busy at all.
        SwapCase{1000, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3}, 2, 2048, 1408, 0, 8, 0},
        SwapCase{1500, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3}, 2, 2048, 1408, 0, 8, 0},
        SwapCase{64, {0}, 1, 2816, 2048, 1408, 8, 0},
        // One expert holds every row: many chunks of one expert (N 8 and 64) spread over CTAs.
        SwapCase{64, OneBusy(64, 37, 200), 1, 2816, 2048, 1408, 8, 0},
        SwapCase{64, OneBusy(64, 0, 200), 1, 2048, 1408, 0, 64, 4},
        SwapCase{256, OneBusy(256, 255, 77), 1, 7168, 2048, 0, 24, 0}));

TEST(Fp8WgmmaSwapGroupedGemmTest, RefusesWhatItCannotRun) {
  SKIP_WITHOUT_WGMMA();
  DeviceArray<uint8_t> buf(1 << 20);
  Fp8WgmmaSwapGroupedGemmParams p;
  p.num_groups = 2, p.max_rows = 4, p.offsets = reinterpret_cast<const int32_t*>(buf.get());
  p.n = 256, p.k = 256, p.a = buf.get(), p.lda = 256;
  p.a_scales = reinterpret_cast<const float*>(buf.get());
  p.weight_maps = buf.get(), p.scales = reinterpret_cast<const float* const*>(buf.get());
  p.scale_ld = 4, p.c = reinterpret_cast<float*>(buf.get()), p.ldc = 256;
  EXPECT_TRUE(Fp8WgmmaSwapGroupedGemmSupports(p));
  Fp8WgmmaSwapGroupedGemmParams q = p;
  q.k = 192, q.lda = 192;  // not a multiple of 128
  EXPECT_FALSE(Fp8WgmmaSwapGroupedGemmSupports(q));
  EXPECT_EQ(Fp8WgmmaSwapGroupedGemm(q, nullptr), cudaErrorInvalidValue);
  q = p;
  q.split_rows = 64;  // a 128-row tile with two scale rows
  EXPECT_FALSE(Fp8WgmmaSwapGroupedGemmSupports(q));
  q = p;
  q.a = buf.get() + 8;  // TMA needs 16-byte aligned rows
  EXPECT_FALSE(Fp8WgmmaSwapGroupedGemmSupports(q));
  q = p;
  q.weight_maps = buf.get() + 16;  // descriptors are 64-byte aligned
  EXPECT_FALSE(Fp8WgmmaSwapGroupedGemmSupports(q));
  q = p;
  q.c_bf16 = reinterpret_cast<uint16_t*>(buf.get());  // both outputs
  EXPECT_FALSE(Fp8WgmmaSwapGroupedGemmSupports(q));
  q.c = nullptr;  // the bf16 one alone
  EXPECT_TRUE(Fp8WgmmaSwapGroupedGemmSupports(q));
  q.c_bf16 = nullptr;  // neither
  EXPECT_FALSE(Fp8WgmmaSwapGroupedGemmSupports(q));
  q = p;
  q.offsets = nullptr;  // offsets are required, one group too
  EXPECT_FALSE(Fp8WgmmaSwapGroupedGemmSupports(q));
  q.num_groups = 1;
  EXPECT_FALSE(Fp8WgmmaSwapGroupedGemmSupports(q));
  EXPECT_EQ(Fp8WgmmaSwapGroupedGemm(q, nullptr), cudaErrorInvalidValue);
}

TEST(Fp8WgmmaSwapGroupedGemmTest, ChunkRowsFollowTheHint) {
  EXPECT_EQ(Fp8WgmmaSwapChunkRows(0), 32);
  EXPECT_EQ(Fp8WgmmaSwapChunkRows(1), 8);
  EXPECT_EQ(Fp8WgmmaSwapChunkRows(12), 16);
  EXPECT_EQ(Fp8WgmmaSwapChunkRows(20), 24);
  EXPECT_EQ(Fp8WgmmaSwapChunkRows(32), 32);
  EXPECT_EQ(Fp8WgmmaSwapChunkRows(33), 64);
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
