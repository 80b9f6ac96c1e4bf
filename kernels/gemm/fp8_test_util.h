// Host side of the FP8 block-scaled GEMM tests (fp8_block_gemm_test, fp8_mma_gemm_test,
// fp8_blockscaled_gemm_test): random e4m3 weights with checkpoint-like scales, their values
// dequantised by the loader's e4m3 decoding (worker/model/dtype_conversion.h, not by the kernels'
// code), and the product in double against which the kernels are checked.
#ifndef DEEPINFER_KERNELS_GEMM_FP8_TEST_UTIL_H_
#define DEEPINFER_KERNELS_GEMM_FP8_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "worker/backend/bf16.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace kernels {
namespace fp8_testing {

// Random e4m3 bytes (every finite value, both signs; 0x7F / 0xFF are NaN and left out).
inline std::vector<uint8_t> RandomFp8(size_t n, std::mt19937* gen) {
  std::uniform_int_distribution<int> d(0, 255);
  std::vector<uint8_t> v(n);
  for (uint8_t& b : v) {
    do {
      b = static_cast<uint8_t>(d(*gen));
    } while ((b & 0x7F) == 0x7F);
  }
  return v;
}

// Scales like a checkpoint's: around 1/512 .. 1/8, half of them powers of two (UE8M0-style).
inline std::vector<float> RandomScales(size_t n, std::mt19937* gen) {
  std::uniform_real_distribution<float> d(-9.0f, -3.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float e = d(*gen);
    v[i] = i % 2 == 0 ? std::exp2(std::round(e)) : std::exp2(e);
  }
  return v;
}

// A host FP8 matrix [n, k] with row stride ldw and its scale grid (scale_ld columns a row).
struct HostFp8 {
  int64_t n = 0, k = 0, ldw = 0, split = 0, scale_ld = 0;
  std::vector<uint8_t> data;
  std::vector<float> scales;
  double Scale(int64_t j, int64_t p) const {
    return scales[Fp8ScaleRow(j, split) * scale_ld + p / kFp8BlockSize];
  }
  double At(int64_t j, int64_t p) const {
    return static_cast<double>(F8E4M3ToFloat(data[j * ldw + p])) * Scale(j, p);
  }
};

// scale_ld 0: Fp8ScaleLd(k), the loader's layout. The scale rows' padding columns hold
// `padding`: NaN by default, so a kernel that reads one is caught (the loader writes zeros).
inline HostFp8 MakeWeight(int64_t n, int64_t k, int64_t ldw, int64_t split, std::mt19937* gen,
                          int64_t scale_ld = 0, float padding = std::nanf("")) {
  HostFp8 w;
  w.n = n;
  w.k = k;
  w.ldw = ldw;
  w.split = split;
  w.scale_ld = scale_ld > 0 ? scale_ld : Fp8ScaleLd(k);
  w.data = RandomFp8(n * ldw, gen);
  w.scales = RandomScales(Fp8ScaleRows(n, split) * w.scale_ld, gen);
  for (size_t i = 0; i < w.scales.size(); ++i) {
    if (static_cast<int64_t>(i) % w.scale_ld >= Fp8ScaleCols(k)) w.scales[i] = padding;
  }
  return w;
}

// y[i, j] = sum_p x[i * ldx + p] * w(j, p) in double for i < m, j < w.n, and mag[i, j] = the
// sum of the terms' magnitudes, where x is each activation as the kernel reads it (the caller
// rounds it: to bf16, or quantised to e4m3 times its scale).
inline void DequantisedProduct(const std::vector<double>& x, int64_t ldx, int64_t m,
                               const HostFp8& w, std::vector<double>* y, std::vector<double>* mag) {
  y->assign(m * w.n, 0.0);
  mag->assign(m * w.n, 0.0);
  std::vector<double> row(w.k);
  for (int64_t j = 0; j < w.n; ++j) {
    for (int64_t p = 0; p < w.k; ++p) row[p] = w.At(j, p);
    for (int64_t i = 0; i < m; ++i) {
      double s = 0, g = 0;
      for (int64_t p = 0; p < w.k; ++p) {
        const double prod = x[i * ldx + p] * row[p];
        s += prod;
        g += std::abs(prod);
      }
      (*y)[i * w.n + j] = s;
      (*mag)[i * w.n + j] = g;
    }
  }
}

// The activations rounded to bf16 (nearest even), as the bf16-activation kernels read them.
inline std::vector<double> Bf16Rounded(const std::vector<float>& a) {
  std::vector<double> x(a.size());
  for (size_t i = 0; i < a.size(); ++i) x[i] = RoundToBf16(a[i]);
  return x;
}

// |got - want| <= tol element-wise (NaN fails); the first failure named.
inline ::testing::AssertionResult WithinBound(const std::vector<float>& got,
                                              const std::vector<double>& want,
                                              const std::vector<double>& tol) {
  if (got.size() != want.size()) return ::testing::AssertionFailure() << "size mismatch";
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= tol[i])) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << " want "
                                           << want[i] << " (bound " << tol[i] << ")";
    }
    if (tol[i] > 0) worst = std::max(worst, d / tol[i]);
  }
  return ::testing::AssertionSuccess() << "largest error " << worst << " of its bound";
}

}  // namespace fp8_testing
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_FP8_TEST_UTIL_H_
