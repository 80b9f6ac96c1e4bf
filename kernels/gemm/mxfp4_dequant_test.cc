// Mxfp4DequantToBf16 against the definition: each element's value is the OCP Microscaling spec's
// E2M1 table entry (written out below) times 2^(scale - 127), in double; the bf16 the kernel
// writes must be that value exactly (sign of zero included), +-inf where it is 2^128 or more, NaN
// for scale 0xFF. Every code meets every scale byte once; then random matrices out of a pointer
// table (from an offset, padded scale rows). Skips itself without a GPU.
#include "kernels/gemm/mxfp4_dequant.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"

namespace deepinfer {
namespace kernels {
namespace {

using testing::DeviceArray;

// OCP Microscaling Formats (MX) v1.0, FP4 E2M1: codes 0..7 are the magnitudes, bit 3 the sign.
constexpr double kE2m1[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};

double Bf16Value(uint16_t bits) {
  const uint32_t f = static_cast<uint32_t>(bits) << 16;
  float v;
  std::memcpy(&v, &f, sizeof(v));
  return v;
}

struct HostMx {
  int64_t n = 0, k = 0, scale_ld = 0;
  std::vector<uint8_t> data, scales;
  // The definition (NaN for scale 0xFF), exact in double.
  double At(int64_t j, int64_t p) const {
    const uint8_t byte = data[j * (k / 2) + p / 2];
    const uint8_t code = p % 2 == 0 ? byte & 0xF : byte >> 4;
    const uint8_t s = scales[j * scale_ld + p / 32];
    if (s == 0xFF) return std::nan("");
    return (code & 8 ? -1.0 : 1.0) * kE2m1[code & 7] * std::ldexp(1.0, static_cast<int>(s) - 127);
  }
};

void ExpectEqualsDefinition(const std::vector<HostMx>& mats, int first, int count) {
  const int64_t n = mats[0].n, k = mats[0].k;
  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> data, scales;
  std::vector<const uint8_t*> data_ptr, scale_ptr;
  for (const HostMx& m : mats) {
    data.push_back(std::make_unique<DeviceArray<uint8_t>>(m.data));
    scales.push_back(std::make_unique<DeviceArray<uint8_t>>(m.scales));
    data_ptr.push_back(data.back()->get());
    scale_ptr.push_back(scales.back()->get());
  }
  DeviceArray<const uint8_t*> data_table(data_ptr), scale_table(scale_ptr);
  DeviceArray<uint16_t> out(count * n * k);
  out.Poison();
  Mxfp4DequantParams p;
  p.first = first;
  p.num_matrices = count;
  p.weights = data_table.get();
  p.scales = scale_table.get();
  p.n = n;
  p.k = k;
  p.scale_ld = mats[0].scale_ld;
  p.out = out.get();
  ASSERT_EQ(Mxfp4DequantToBf16(p, nullptr), cudaSuccess);
  std::vector<uint16_t> got;
  ASSERT_EQ(out.Download(&got), cudaSuccess);
  const double bf16_overflow = std::ldexp(1.0, 128);
  for (int i = 0; i < count; ++i) {
    const HostMx& m = mats[first + i];
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t q = 0; q < k; ++q) {
        const double want = m.At(j, q);
        const double g = Bf16Value(got[(i * n + j) * k + q]);
        const auto where = ::testing::Message()
                           << "matrix " << first + i << " row " << j << " column " << q << " scale "
                           << int{m.scales[j * m.scale_ld + q / 32]};
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(g)) << where << " got " << g;
        } else if (std::abs(want) >= bf16_overflow) {
          ASSERT_TRUE(std::isinf(g) && std::signbit(g) == std::signbit(want))
              << where << " got " << g << " want " << want << " (beyond bf16)";
        } else {
          ASSERT_EQ(g, want) << where;
          ASSERT_EQ(std::signbit(g), std::signbit(want)) << where << " (sign of zero)";
        }
      }
    }
  }
}

// Row j: all 16 codes in each 32-value block (byte i = code pair (i, 15 - i)), block 0 with
// scale byte j, block 1 with 255 - j: every scale, 0 (subnormal products) to 254 (overflow) and
// 0xFF, against every code.
TEST(Mxfp4DequantTest, EveryCodeAtEveryScale) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  HostMx m;
  m.n = 256;
  m.k = 64;
  m.scale_ld = 2;
  m.data.resize(m.n * m.k / 2);
  m.scales.resize(m.n * m.scale_ld);
  for (int64_t j = 0; j < m.n; ++j) {
    for (int64_t i = 0; i < m.k / 2; ++i) {
      const int lo = static_cast<int>((i + j) % 16);
      m.data[j * (m.k / 2) + i] = static_cast<uint8_t>(lo | ((15 - lo) << 4));
    }
    m.scales[j * 2] = static_cast<uint8_t>(j);
    m.scales[j * 2 + 1] = static_cast<uint8_t>(255 - j);
  }
  ExpectEqualsDefinition({m}, 0, 1);
}

// Random bytes and checkpoint-like scales, matrices 1..3 of 5 from the tables, scale rows
// padded with bytes a correct kernel never reads (0xFF would show as NaN).
TEST(Mxfp4DequantTest, RandomMatricesFromATable) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> byte(0, 255), scale(110, 135);
  std::vector<HostMx> mats(5);
  for (HostMx& m : mats) {
    m.n = 96;
    m.k = 320;
    m.scale_ld = m.k / 32 + 3;
    m.data.resize(m.n * m.k / 2);
    for (uint8_t& b : m.data) b = static_cast<uint8_t>(byte(gen));
    m.scales.assign(m.n * m.scale_ld, 0xFF);
    for (int64_t j = 0; j < m.n; ++j) {
      for (int64_t b = 0; b < m.k / 32; ++b) {
        m.scales[j * m.scale_ld + b] = static_cast<uint8_t>(scale(gen));
      }
    }
  }
  ExpectEqualsDefinition(mats, 1, 3);
}

TEST(Mxfp4DequantTest, RefusesKNotAMultipleOf32) {
  Mxfp4DequantParams p;
  p.num_matrices = 1;
  p.n = 4;
  p.k = 48;
  p.scale_ld = 2;
  alignas(16) uint16_t out[4];
  const uint8_t* table[1] = {nullptr};
  p.weights = table;
  p.scales = table;
  p.out = out;
  EXPECT_EQ(Mxfp4DequantToBf16(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
