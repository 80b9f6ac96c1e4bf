// Host side of the FP8 block-scaled GEMM tests (kernels/gemm's fp8_block_gemm_test and
// fp8_mma_gemm_test, worker/backend/cuda's cublaslt_fp8_gemm_test): random e4m3 weights with
// checkpoint-like scales, their values dequantised by the loader's e4m3 decoding
// (worker/model/dtype_conversion.h, not by the kernels' code), the product in double against
// which the kernels are checked, and the set-up and checks the dense and grouped GEMM tests share.
#ifndef DEEPINFER_KERNELS_TESTING_FP8_TEST_UTIL_H_
#define DEEPINFER_KERNELS_TESTING_FP8_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/testing/gpu_test_util.h"
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

// The tolerance of DequantisedProduct's terms' magnitudes `mag`: unit * mag + 1e-30 (the tiny
// absolute term lets an exact zero pass).
inline std::vector<double> Bound(const std::vector<double>& mag, double unit) {
  std::vector<double> tol(mag.size());
  for (size_t i = 0; i < mag.size(); ++i) tol[i] = unit * mag[i] + 1e-30;
  return tol;
}

// A dense GEMM's output `got` ([m, ldc], written over `c0`) against the product of activations x
// ([m, lda], as the kernel reads them) and w: within unit * sum_p |x_p w_p| and, when it
// accumulates onto c0, half an ulp of the result for that fp32 addition; the padding columns
// n..ldc untouched.
inline void ExpectDenseMatches(const std::vector<float>& got, const std::vector<float>& c0,
                               int64_t ldc, const std::vector<double>& x, int64_t lda, int64_t m,
                               const HostFp8& w, bool accumulate, double unit) {
  const int64_t n = w.n;
  std::vector<double> want, mag;
  DequantisedProduct(x, lda, m, w, &want, &mag);
  std::vector<float> got_c(m * n);
  std::vector<double> want_c(m * n), tol_c(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t e = i * n + j;
      got_c[e] = got[i * ldc + j];
      want_c[e] = (accumulate ? c0[i * ldc + j] : 0.0) + want[e];
      tol_c[e] = unit * mag[e] + std::ldexp(std::abs(want_c[e]), -24) + 1e-30;
    }
    for (int64_t j = n; j < ldc; ++j) {
      EXPECT_EQ(got[i * ldc + j], c0[i * ldc + j]) << "padding column " << j << " of row " << i;
    }
  }
  EXPECT_TRUE(WithinBound(got_c, want_c, tol_c));
}

// A grouped GEMM's operands: group g takes rows offsets[g] .. offsets[g + 1] of the activations
// ([max_rows, k]: 5 rows past the last group, which the kernel must leave alone) and weight w[g]
// ([n, k], stacked at `split`); the weights, their scales, the offsets and the per-group pointer
// arrays on the device.
struct GroupedOperands {
  std::vector<int32_t> offsets;
  int32_t used = 0, max_rows = 0;
  std::vector<HostFp8> w;
  std::vector<std::unique_ptr<testing::DeviceArray<uint8_t>>> dw;
  std::vector<std::unique_ptr<testing::DeviceArray<float>>> ds;
  std::unique_ptr<testing::DeviceArray<int32_t>> doff;
  std::unique_ptr<testing::DeviceArray<const uint8_t*>> dwp;
  std::unique_ptr<testing::DeviceArray<const float*>> dsp;
};

inline GroupedOperands MakeGroupedOperands(const std::vector<int32_t>& rows_per_group, int64_t n,
                                           int64_t k, int64_t split, std::mt19937* gen) {
  GroupedOperands g;
  const size_t groups = rows_per_group.size();
  g.offsets.assign(groups + 1, 0);
  for (size_t i = 0; i < groups; ++i) g.offsets[i + 1] = g.offsets[i] + rows_per_group[i];
  g.used = g.offsets[groups];
  g.max_rows = g.used + 5;
  std::vector<const uint8_t*> wptr;
  std::vector<const float*> sptr;
  for (size_t i = 0; i < groups; ++i) {
    g.w.push_back(MakeWeight(n, k, k, split, gen));
    g.dw.push_back(std::make_unique<testing::DeviceArray<uint8_t>>(g.w.back().data));
    g.ds.push_back(std::make_unique<testing::DeviceArray<float>>(g.w.back().scales));
    wptr.push_back(g.dw.back()->get());
    sptr.push_back(g.ds.back()->get());
  }
  g.doff = std::make_unique<testing::DeviceArray<int32_t>>(g.offsets);
  g.dwp = std::make_unique<testing::DeviceArray<const uint8_t*>>(wptr);
  g.dsp = std::make_unique<testing::DeviceArray<const float*>>(sptr);
  return g;
}

// A grouped GEMM's output `got` ([max_rows, n], poisoned before the run) against each group's
// product of its rows of x ([max_rows, k], as the kernel reads them) and its weight, within
// unit * sum_p |x_p w_p|; the rows past the groups still NaN.
inline void ExpectGroupedMatches(const std::vector<float>& got, const std::vector<double>& x,
                                 const GroupedOperands& g, int64_t n, int64_t k, double unit) {
  for (size_t i = 0; i + 1 < g.offsets.size(); ++i) {
    const int32_t r0 = g.offsets[i], rows = g.offsets[i + 1] - g.offsets[i];
    if (rows == 0) continue;
    SCOPED_TRACE(::testing::Message() << "group " << i << " rows " << rows);
    std::vector<double> gx(x.begin() + static_cast<int64_t>(r0) * k,
                           x.begin() + static_cast<int64_t>(r0 + rows) * k);
    std::vector<double> want, mag;
    DequantisedProduct(gx, k, rows, g.w[i], &want, &mag);
    std::vector<float> gg(got.begin() + static_cast<int64_t>(r0) * n,
                          got.begin() + static_cast<int64_t>(r0 + rows) * n);
    EXPECT_TRUE(WithinBound(gg, want, Bound(mag, unit)));
  }
  for (size_t i = static_cast<size_t>(g.used) * n; i < got.size(); ++i) {
    ASSERT_TRUE(std::isnan(got[i])) << "row past the groups written at " << i;
  }
}

}  // namespace fp8_testing
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_TESTING_FP8_TEST_UTIL_H_
