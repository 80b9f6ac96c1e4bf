// Fp8QuantizeRows against the scheme computed on the host: the scale in float (amax / 448, at
// least FLT_MIN), each value divided by it in float (IEEE division) and encoded by the loader's
// e4m3 encoder (worker/model/dtype_conversion.h: nearest even, saturating at 448). Both sides round
// the same IEEE operations, so bytes and scales must match exactly. AddRowsF32 against plain
// copies. Skips itself without a GPU.
#include "kernels/gemm/fp8_quantize.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <random>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/pdl_chain.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace kernels {
namespace {

using testing::DeviceArray;

struct Case {
  int64_t m, k, extra_lda, m_pad;
  bool a_bf16;
};

// q / s (plain layout: row i's block b scale at s[b * m_pad + i]) against the host scheme for
// the m x k rows of a (lda apart); rows m..m_pad-1 as zeros (scale 1); q's columns k..ldq-1
// untouched (0xFF).
::testing::AssertionResult MatchesHostScheme(const std::vector<float>& a, int64_t m, int64_t k,
                                             int64_t lda, const std::vector<uint8_t>& q,
                                             int64_t ldq, const std::vector<float>& s,
                                             int64_t m_pad) {
  const int64_t blocks = Fp8ScaleCols(k);
  for (int64_t i = 0; i < m_pad; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t p0 = b * 128, p1 = std::min(k, p0 + 128);
      float want_s = 1.0f;
      if (i < m) {
        float amax = 0.0f;
        for (int64_t c = p0; c < p1; ++c) amax = std::max(amax, std::fabs(a[i * lda + c]));
        want_s = std::max(amax / 448.0f, FLT_MIN);
      }
      if (s[b * m_pad + i] != want_s) {
        return ::testing::AssertionFailure() << "scale of row " << i << " block " << b << ": "
                                             << s[b * m_pad + i] << " against " << want_s;
      }
      for (int64_t c = p0; c < p1; ++c) {
        const uint8_t want = i < m ? FloatToF8E4M3(a[i * lda + c] / want_s) : uint8_t{0};
        if (q[i * ldq + c] != want) {
          return ::testing::AssertionFailure()
                 << "row " << i << " column " << c << " x " << (i < m ? a[i * lda + c] : 0.0f)
                 << ": byte " << int{q[i * ldq + c]} << " against " << int{want};
        }
      }
    }
    for (int64_t c = k; c < ldq; ++c) {
      if (q[i * ldq + c] != 0xFF) {
        return ::testing::AssertionFailure()
               << "padding column " << c << " of row " << i << " written";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

class Fp8QuantizeRowsTest : public ::testing::TestWithParam<Case> {};

TEST_P(Fp8QuantizeRowsTest, MatchesTheHostScheme) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Case t = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " m " << t.m << " k " << t.k);
  const int64_t lda = t.k + t.extra_lda, ldq = t.k + 16, blocks = Fp8ScaleCols(t.k);
  std::vector<float> a = testing::RandomFloats(t.m * lda, seed, 3.0f);
  // Rows with a wide range (large and tiny blocks), an all-zero block, and tiny values that
  // quantise to e4m3 subnormals.
  for (int64_t p = 0; p < t.k && t.m > 1; ++p)
    a[1 * lda + p] *= std::ldexp(1.0f, (p / 128) % 40 - 20);
  if (t.m > 2) {
    for (int64_t p = 0; p < std::min<int64_t>(t.k, 128); ++p) a[2 * lda + p] = 0.0f;
  }
  // Blocks whose scales straddle both ends of the range the kernel divides through a shared
  // reciprocal ([2^-80, 2^100]; IEEE divisions outside): the bytes must not tell them apart.
  if (t.m > 3) {
    static constexpr int kExponents[] = {-126, -120, -74, -73, -72, -60, 100, 105, 106, 110};
    for (int64_t p = 0; p < t.k; ++p)
      a[3 * lda + p] *= std::ldexp(1.0f, kExponents[(p / 128) % 10]);
  }
  if (t.a_bf16) {
    for (float& x : a) x = RoundToBf16(x);
  }
  DeviceArray<float> da(a);
  DeviceArray<uint16_t> da16(FloatsToBf16Bits(a));
  DeviceArray<uint8_t> dq(t.m_pad * ldq);
  DeviceArray<float> ds(blocks * t.m_pad);
  dq.Poison();
  ds.Poison();
  Fp8QuantizeParams p;
  p.m = t.m;
  p.k = t.k;
  p.a_bf16 = t.a_bf16;
  p.a = t.a_bf16 ? static_cast<const void*>(da16.get()) : da.get();
  p.lda = lda;
  p.q = dq.get();
  p.ldq = ldq;
  p.scales = ds.get();
  p.m_pad = t.m_pad;
  DEEPINFER_CUDA_OK(Fp8QuantizeRows(p, nullptr));
  std::vector<uint8_t> q;
  std::vector<float> s;
  DEEPINFER_CUDA_OK(dq.Download(&q));
  DEEPINFER_CUDA_OK(ds.Download(&s));
  EXPECT_TRUE(MatchesHostScheme(a, t.m, t.k, lda, q, ldq, s, t.m_pad));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8QuantizeRowsTest,
                         ::testing::Values(Case{1, 128, 0, 4, false}, Case{3, 2048, 0, 4, false},
                                           Case{5, 208, 8, 8, true}, Case{64, 1408, 0, 64, true},
                                           Case{7, 7168, 4, 12, false}, Case{0, 256, 0, 4, false},
                                           // A row's iterations split over warps unevenly (14
                                           // over 9, 3 over 2), and not split (8192 rows on:
                                           // 9, 11 or 22 blocks a row in tiles of 4, 4 and 2
                                           // rows a warp, the last tile past m_pad or not).
                                           Case{1000, 7168, 0, 1000, false},
                                           Case{4300, 1408, 0, 4304, true},
                                           Case{8200, 1040, 0, 8208, false},
                                           Case{8193, 1408, 0, 8194, true},
                                           Case{8191, 2816, 16, 8193, false}));

// The quantisation launched right behind a PDL kernel (kernels::DelayedCopy) that writes its
// input rows after a 20 us spin, eagerly and in a CUDA graph (programmatic edge, replayed twice):
// a kernel that read the rows before its griddepcontrol.wait would quantise zeros. Decode-sized
// rows (QuantizeKernel, rows split over warps) and prefill-sized ones (QuantizeTileKernel).
class Fp8QuantizeRowsPdlTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(Fp8QuantizeRowsPdlTest, ReadsRowsWrittenByAPdlPredecessor) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const int64_t m = std::get<0>(GetParam()), k = std::get<1>(GetParam());
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " m " << m << " k " << k);
  const int64_t ldq = k + 16;
  const std::vector<float> a = testing::RandomFloats(m * k, seed, 3.0f);
  DeviceArray<float> src(a);
  DeviceArray<float> da(m * k);
  DeviceArray<uint8_t> dq(m * ldq);
  DeviceArray<float> ds(Fp8ScaleCols(k) * m);
  Fp8QuantizeParams p;
  p.m = m;
  p.k = k;
  p.a = da.get();
  p.lda = k;
  p.q = dq.get();
  p.ldq = ldq;
  p.scales = ds.get();
  p.m_pad = m;
  cudaStream_t stream;
  DEEPINFER_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const int64_t bytes = m * k * static_cast<int64_t>(sizeof(float));
  auto copy_then_quantise = [&](cudaError_t* copied, cudaError_t* quantised) {
    *copied = DelayedCopy(src.get(), da.get(), bytes, /*delay_ns=*/20000, /*blocks=*/8, stream);
    *quantised = Fp8QuantizeRows(p, stream);
  };
  auto reset = [&] {
    DEEPINFER_CUDA_OK(cudaMemset(da.get(), 0, bytes));
    dq.Poison();
    ds.Poison();
    DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
  };
  auto check = [&](const char* what) {
    std::vector<uint8_t> q;
    std::vector<float> sc;
    DEEPINFER_CUDA_OK(dq.Download(&q));
    DEEPINFER_CUDA_OK(ds.Download(&sc));
    EXPECT_TRUE(MatchesHostScheme(a, m, k, k, q, ldq, sc, m)) << what;
  };
  reset();
  cudaError_t copied, quantised;
  copy_then_quantise(&copied, &quantised);
  DEEPINFER_CUDA_OK(copied);
  DEEPINFER_CUDA_OK(quantised);
  DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
  check("eager");
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DEEPINFER_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  copy_then_quantise(&copied, &quantised);
  DEEPINFER_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  DEEPINFER_CUDA_OK(copied);
  DEEPINFER_CUDA_OK(quantised);
  DEEPINFER_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int replay = 0; replay < 2; ++replay) {
    reset();
    DEEPINFER_CUDA_OK(cudaGraphLaunch(exec, stream));
    DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
    check(replay == 0 ? "graph replay 0" : "graph replay 1");
  }
  DEEPINFER_CUDA_OK(cudaGraphExecDestroy(exec));
  DEEPINFER_CUDA_OK(cudaGraphDestroy(graph));
  DEEPINFER_CUDA_OK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8QuantizeRowsPdlTest,
                         ::testing::Values(std::make_tuple(int64_t{8}, int64_t{2048}),
                                           std::make_tuple(int64_t{8200}, int64_t{1408})));

// Offsets of `groups` groups of 0-3 rows each (empty ones among them).
std::vector<int32_t> RandomGroupOffsets(int32_t groups, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> rows(0, 3);
  std::vector<int32_t> offsets(groups + 1, 0);
  for (int32_t g = 0; g < groups; ++g) offsets[g + 1] = offsets[g] + rows(gen);
  return offsets;
}

// Grouped rows: each group's scales packed for its own rows at offsets[g] * blocks; rows past
// the last group untouched. Few groups, more than a warp's lanes, and more than the kernel keeps
// in a warp's registers (287: then a binary search finds a row's group).
class Fp8QuantizeRowsGroupsTest : public ::testing::TestWithParam<int32_t> {};

TEST_P(Fp8QuantizeRowsGroupsTest, PacksEachGroupsScales) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed << " groups " << GetParam());
  const std::vector<int32_t> offsets = GetParam() == 4 ? std::vector<int32_t>{0, 4, 4, 12, 20}
                                                       : RandomGroupOffsets(GetParam(), seed);
  const int32_t groups = static_cast<int32_t>(offsets.size()) - 1;
  const int64_t m = offsets.back() + 4, k = 384, blocks = Fp8ScaleCols(k);
  const std::vector<float> a = testing::RandomFloats(m * k, seed);
  DeviceArray<float> da(a);
  DeviceArray<int32_t> doff(offsets);
  DeviceArray<uint8_t> dq(m * k);
  DeviceArray<float> ds(blocks * m);
  dq.Poison();
  ds.Poison();
  Fp8QuantizeParams p;
  p.m = m;
  p.k = k;
  p.a = da.get();
  p.lda = k;
  p.q = dq.get();
  p.ldq = k;
  p.scales = ds.get();
  p.m_pad = m;
  p.group_offsets = doff.get();
  p.num_groups = groups;
  DEEPINFER_CUDA_OK(Fp8QuantizeRows(p, nullptr));
  std::vector<uint8_t> q;
  std::vector<float> s;
  DEEPINFER_CUDA_OK(dq.Download(&q));
  DEEPINFER_CUDA_OK(ds.Download(&s));
  for (int32_t g = 0; g < groups; ++g) {
    const int64_t base = offsets[g], count = offsets[g + 1] - offsets[g];
    for (int64_t i = base; i < base + count; ++i) {
      for (int64_t b = 0; b < blocks; ++b) {
        float amax = 0.0f;
        for (int64_t c = b * 128; c < (b + 1) * 128; ++c)
          amax = std::max(amax, std::fabs(a[i * k + c]));
        const float want_s = std::max(amax / 448.0f, FLT_MIN);
        ASSERT_EQ(s[base * blocks + b * count + (i - base)], want_s)
            << "group " << g << " row " << i;
        for (int64_t c = b * 128; c < (b + 1) * 128; ++c) {
          ASSERT_EQ(q[i * k + c], FloatToF8E4M3(a[i * k + c] / want_s)) << "row " << i;
        }
      }
    }
  }
  for (int64_t i = offsets.back(); i < m; ++i) {
    for (int64_t c = 0; c < k; ++c) ASSERT_EQ(q[i * k + c], 0xFF) << "row " << i << " written";
  }
  for (int64_t e = offsets.back() * blocks; e < blocks * m; ++e) {
    ASSERT_TRUE(std::isnan(s[e])) << "scale " << e << " written";
  }
}

INSTANTIATE_TEST_SUITE_P(GroupCounts, Fp8QuantizeRowsGroupsTest, ::testing::Values(4, 70, 300));

// The host scheme for one 128-wide block of x: its scale and e4m3 bytes.
float HostBlock(const float* x, int64_t n, uint8_t* q) {
  float amax = 0.0f;
  for (int64_t c = 0; c < n; ++c) amax = std::max(amax, std::fabs(x[c]));
  const float s = std::max(amax / 448.0f, FLT_MIN);
  for (int64_t c = 0; c < n; ++c) q[c] = FloatToF8E4M3(x[c] / s);
  return s;
}

// Scattered rows (the routed experts' permutation): each source row quantised into each of its
// destination rows, scales in the groups' packed layout; rows no source maps to (the groups'
// padding) untouched. Widths of one warp iteration (512 columns) or several with a partial block,
// three destinations a row or the most (32), few source rows (a warp per iteration) or enough
// for a warp per row.
struct ScatterCase {
  int64_t k;
  int32_t dests;
  int64_t m;
  int32_t groups = 3;  // 66: Moonlight's 64 experts and 2 shared parts; 300: a binary search
};

class Fp8QuantizeRowsScatterTest : public ::testing::TestWithParam<ScatterCase> {};

TEST_P(Fp8QuantizeRowsScatterTest, WritesEachSourceRowToItsDestinations) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  const int64_t m = GetParam().m, k = GetParam().k, blocks = Fp8ScaleCols(k);
  const int32_t dests = GetParam().dests, groups = GetParam().groups;
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << " k " << k << " dests " << dests << " groups " << groups);
  // Choice (i, j) goes to group (i + j) % groups, one choice to none; rows by (i, j) inside a
  // group, each group padded to 4 rows.
  std::vector<int32_t> group_of(m * dests), counts(groups, 0);
  for (int64_t i = 0; i < m; ++i) {
    for (int32_t j = 0; j < dests; ++j) {
      group_of[i * dests + j] = (i == 4 && j == 1) ? -1 : static_cast<int32_t>((i + j) % groups);
    }
  }
  std::vector<int32_t> offsets(groups + 1, 0);
  for (int32_t g : group_of) {
    if (g >= 0) ++counts[g];
  }
  for (int32_t g = 0; g < groups; ++g) offsets[g + 1] = offsets[g] + (counts[g] + 3) / 4 * 4;
  const int64_t rows = offsets[groups];
  std::vector<int32_t> dest(m * dests, -1), next(offsets.begin(), offsets.end() - 1);
  std::vector<int64_t> source_of(rows, -1);
  for (int64_t c = 0; c < m * dests; ++c) {
    if (group_of[c] < 0) continue;
    dest[c] = next[group_of[c]]++;
    source_of[dest[c]] = c / dests;
  }
  // fp32 rows, bf16 rows, fp32 rows rounded to bf16 by the kernel (round_bf16).
  for (int mode = 0; mode < 3; ++mode) {
    const bool a_bf16 = mode == 1, round_bf16 = mode == 2;
    SCOPED_TRACE(a_bf16 ? "bf16 rows" : round_bf16 ? "fp32 rows rounded to bf16" : "fp32 rows");
    std::vector<float> a = testing::RandomFloats(m * k, seed, 3.0f);
    for (int64_t p = 0; p < k; ++p) a[1 * k + p] *= std::ldexp(1.0f, (p / 128) % 4 * 9 - 9);
    if (a_bf16) {
      for (float& x : a) x = RoundToBf16(x);
    }
    DeviceArray<float> da(a);
    // The values the kernel quantises (the host's bf16 rounding: nearest even).
    std::vector<float> want_a = a;
    if (round_bf16) {
      for (float& x : want_a) x = RoundToBf16(x);
    }
    DeviceArray<uint16_t> da16(FloatsToBf16Bits(a));
    DeviceArray<int32_t> doff(offsets), ddest(dest);
    DeviceArray<uint8_t> dq(rows * k);
    DeviceArray<float> ds(rows * blocks);
    dq.Poison();
    ds.Poison();
    Fp8QuantizeParams p;
    p.m = m;
    p.k = k;
    p.a_bf16 = a_bf16;
    p.round_bf16 = round_bf16;
    p.a = a_bf16 ? static_cast<const void*>(da16.get()) : da.get();
    p.lda = k;
    p.q = dq.get();
    p.ldq = k;
    p.scales = ds.get();
    p.m_pad = m;
    p.group_offsets = doff.get();
    p.num_groups = groups;
    p.dest_rows = ddest.get();
    p.dests_per_row = dests;
    DEEPINFER_CUDA_OK(Fp8QuantizeRows(p, nullptr));
    std::vector<uint8_t> q;
    std::vector<float> s;
    DEEPINFER_CUDA_OK(dq.Download(&q));
    DEEPINFER_CUDA_OK(ds.Download(&s));
    for (int32_t g = 0; g < groups; ++g) {
      const int64_t base = offsets[g], count = offsets[g + 1] - base;
      for (int64_t r = base; r < base + count; ++r) {
        for (int64_t b = 0; b < blocks; ++b) {
          const float got_s = s[base * blocks + b * count + (r - base)];
          if (source_of[r] < 0) {
            ASSERT_TRUE(std::isnan(got_s)) << "scale of padding row " << r << " written";
            for (int64_t c = b * 128; c < std::min(k, (b + 1) * 128); ++c) {
              ASSERT_EQ(q[r * k + c], 0xFF) << r;
            }
            continue;
          }
          const int64_t n = std::min<int64_t>(128, k - b * 128);
          uint8_t want[128];
          const float want_s = HostBlock(&want_a[source_of[r] * k + b * 128], n, want);
          ASSERT_EQ(got_s, want_s) << "row " << r << " block " << b;
          for (int64_t c = 0; c < n; ++c) {
            ASSERT_EQ(q[r * k + b * 128 + c], want[c]) << "row " << r << " column " << b * 128 + c;
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8QuantizeRowsScatterTest,
                         ::testing::Values(ScatterCase{384, 3, 9}, ScatterCase{2064, 8, 9},
                                           ScatterCase{1040, 32, 9}, ScatterCase{1040, 2, 8200},
                                           ScatterCase{2048, 8, 128, 66},
                                           ScatterCase{384, 3, 130, 300}));

// SwiGLU's product quantised: the rows are [gate | up] (bf16, or fp32 as the swap kernel's
// gate_up), the value quantised bf16(silu(g) * u) as SiluMulBf16 and SiluMulF32ToBf16 round it
// (expf on the host and the device may differ by an ulp: a block holding a product that close
// to a bf16 rounding boundary is checked only loosely).
// 12 rows: a warp a row; 8202 rows (prefill): tiles of four rows a warp (1408 columns: 11
// blocks a row), the last tile past the rows.
class Fp8QuantizeRowsSiluMulTest : public ::testing::TestWithParam<std::tuple<bool, int64_t>> {};

TEST_P(Fp8QuantizeRowsSiluMulTest, QuantisesTheRoundedProduct) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const bool a_bf16 = std::get<0>(GetParam());
  const int64_t m = std::get<1>(GetParam());
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << (a_bf16 ? " bf16" : " fp32") << " m " << m);
  const int64_t k = 1408, lda = 2 * k, blocks = Fp8ScaleCols(k);
  const std::vector<int32_t> offsets = {0, 4, 4, static_cast<int32_t>(m)};
  const int32_t groups = 3;
  std::vector<float> a = testing::RandomFloats(m * lda, seed, 4.0f);
  if (a_bf16) {
    for (float& x : a) x = RoundToBf16(x);
  }
  DeviceArray<uint16_t> da16(FloatsToBf16Bits(a));
  DeviceArray<float> da32(a);
  DeviceArray<int32_t> doff(offsets);
  DeviceArray<uint8_t> dq(m * k);
  DeviceArray<float> ds(m * blocks);
  dq.Poison();
  ds.Poison();
  Fp8QuantizeParams p;
  p.m = m;
  p.k = k;
  p.a = a_bf16 ? static_cast<const void*>(da16.get()) : da32.get();
  p.a_bf16 = a_bf16;
  p.silu_mul = true;
  p.lda = lda;
  p.q = dq.get();
  p.ldq = k;
  p.scales = ds.get();
  p.m_pad = m;
  p.group_offsets = doff.get();
  p.num_groups = groups;
  DEEPINFER_CUDA_OK(Fp8QuantizeRows(p, nullptr));
  std::vector<uint8_t> q;
  std::vector<float> s;
  DEEPINFER_CUDA_OK(dq.Download(&q));
  DEEPINFER_CUDA_OK(ds.Download(&s));
  int64_t loose = 0, total = 0;
  for (int32_t g = 0; g < groups; ++g) {
    const int64_t base = offsets[g], count = offsets[g + 1] - base;
    for (int64_t i = base; i < base + count; ++i) {
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t p0 = b * 128, n = std::min<int64_t>(128, k - p0);
        float x[128];
        bool exact = true;
        for (int64_t c = 0; c < n; ++c) {
          const float gate = a[i * lda + p0 + c], up = a[i * lda + k + p0 + c];
          const float prod = gate / (1.0f + std::exp(-gate)) * up;
          x[c] = RoundToBf16(prod);
          // One fp32 ulp either way must round to the same bf16 value.
          exact = exact && RoundToBf16(std::nextafter(prod, -INFINITY)) == x[c] &&
                  RoundToBf16(std::nextafter(prod, INFINITY)) == x[c];
        }
        uint8_t want[128];
        const float want_s = HostBlock(x, n, want);
        const float got_s = s[base * blocks + b * count + (i - base)];
        ++total;
        if (!exact) {
          ++loose;
          ASSERT_NEAR(got_s, want_s, want_s * std::ldexp(1.0f, -7))
              << "row " << i << " block " << b;
          continue;
        }
        ASSERT_EQ(got_s, want_s) << "row " << i << " block " << b;
        for (int64_t c = 0; c < n; ++c) {
          ASSERT_EQ(q[i * k + p0 + c], want[c]) << "row " << i << " column " << p0 + c;
        }
      }
    }
  }
  EXPECT_LE(loose * 4, total) << "too few blocks checked exactly";
}

INSTANTIATE_TEST_SUITE_P(Inputs, Fp8QuantizeRowsSiluMulTest,
                         ::testing::Combine(::testing::Bool(),
                                            ::testing::Values(int64_t{12}, int64_t{8202})));

TEST(Fp8QuantizeRowsArgsTest, RejectsBadLayouts) {
  Fp8QuantizeParams p;  // all zero
  EXPECT_EQ(Fp8QuantizeRows(p, nullptr), cudaErrorInvalidValue);
  uint8_t* const q = reinterpret_cast<uint8_t*>(uintptr_t{256});
  float* const scales = reinterpret_cast<float*>(uintptr_t{512});
  p.k = 128, p.lda = 256, p.ldq = 128, p.q = q, p.scales = scales;
  p.silu_mul = true, p.round_bf16 = true;  // the product is rounded already
  EXPECT_EQ(Fp8QuantizeRows(p, nullptr), cudaErrorInvalidValue);
  p.round_bf16 = false, p.a_bf16 = true, p.lda = 128;  // [gate | up] needs lda >= 2 k
  EXPECT_EQ(Fp8QuantizeRows(p, nullptr), cudaErrorInvalidValue);
  p.silu_mul = false, p.lda = 256, p.round_bf16 = true;  // bf16 rows are not rounded again
  EXPECT_EQ(Fp8QuantizeRows(p, nullptr), cudaErrorInvalidValue);
  p.round_bf16 = false;
  p.dest_rows = reinterpret_cast<const int32_t*>(uintptr_t{1024});
  p.dests_per_row = 2;  // scattered rows need group offsets
  EXPECT_EQ(Fp8QuantizeRows(p, nullptr), cudaErrorInvalidValue);
  p.group_offsets = reinterpret_cast<const int32_t*>(uintptr_t{2048});
  p.num_groups = 4;
  p.dests_per_row = 33;  // a lane per destination
  EXPECT_EQ(Fp8QuantizeRows(p, nullptr), cudaErrorInvalidValue);
}

TEST(AddRowsF32Test, CopiesOrAddsEachRow) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const int64_t m = 5, n = 7, ldd = 12, ldc = 9;
  const std::vector<float> d = testing::RandomFloats(m * ldd, 1),
                           c0 = testing::RandomFloats(m * ldc, 2);
  for (bool accumulate : {false, true}) {
    DeviceArray<float> dd(d), dc(c0);
    DEEPINFER_CUDA_OK(AddRowsF32(m, n, dd.get(), ldd, dc.get(), ldc, accumulate, nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dc.Download(&got));
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < ldc; ++j) {
        const float want = j >= n
                               ? c0[i * ldc + j]
                               : (accumulate ? c0[i * ldc + j] + d[i * ldd + j] : d[i * ldd + j]);
        ASSERT_EQ(got[i * ldc + j], want) << i << ", " << j;
      }
    }
  }
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
