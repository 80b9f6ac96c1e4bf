// Test helpers shared by the CUDA backend's FP8 tests: a random FP8 matrix with 128 x 128 block
// scales on the device and its dequantised values on the host, a set of random routed experts,
// and the W8A8 activation quantisation computed on the host.
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_CUDA_FP8_TEST_MATRIX_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_CUDA_FP8_TEST_MATRIX_H_

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kernels/gemm/fp8_block_gemm.h"
#include "worker/backend/backend.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace testing {

// A random FP8 matrix [n, k] (stacked at split rows, 0: not) on the device, its scale rows of
// stride scale_ld (zero padding), and its dequantised values on the host.
struct Fp8Matrix {
  int64_t n = 0, k = 0, split = 0, scale_ld = 0;
  std::vector<double> dequant;  // [n, k]
  std::unique_ptr<DeviceBuffer> data, scales;
  Fp8BlockScales fp8() const { return Fp8BlockScales{scales->as<float>(), scale_ld, split}; }
  WeightView view() const { return WeightView(data->data(), fp8()); }
};

// Bytes uniform over e4m3's codes but NaN, each block's scale 2^u with u uniform in [-9, -5];
// scale_ld 0: the loader's stride (kernels::Fp8ScaleLd(k)).
inline Fp8Matrix RandomFp8Matrix(Backend* gpu, int64_t n, int64_t k, int64_t split,
                                 std::mt19937* gen, int64_t scale_ld = 0) {
  Fp8Matrix m;
  m.n = n, m.k = k, m.split = split;
  m.scale_ld = scale_ld > 0 ? scale_ld : kernels::Fp8ScaleLd(k);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> exponent(-9.0f, -5.0f);
  std::vector<uint8_t> bytes(n * k);
  for (uint8_t& b : bytes) {
    do {
      b = static_cast<uint8_t>(byte(*gen));
    } while ((b & 0x7F) == 0x7F);  // NaN
  }
  const int64_t ld = m.scale_ld, cols = kernels::Fp8ScaleCols(k);
  std::vector<float> scales(kernels::Fp8ScaleRows(n, split) * ld, 0.0f);
  for (size_t i = 0; i < scales.size(); ++i) {
    if (static_cast<int64_t>(i) % ld < cols) scales[i] = std::exp2(exponent(*gen));
  }
  m.dequant.resize(n * k);
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) {
      m.dequant[j * k + p] = static_cast<double>(F8E4M3ToFloat(bytes[j * k + p])) *
                             scales[kernels::Fp8ScaleRow(j, split) * ld + p / 128];
    }
  }
  m.data = gpu->Allocate(bytes.size());
  gpu->CopyToDevice(bytes.data(), bytes.size(), m.data->data());
  m.scales = gpu->Allocate(scales.size() * sizeof(float));
  gpu->CopyToDevice(scales.data(), scales.size() * sizeof(float), m.scales->data());
  return m;
}

// Random routed experts for RoutedExpertsArgs: expert e's gate_up [2 inter, hidden] (stacked at
// inter) and down [hidden, inter], drawn expert by expert, gate_up first; the weight and scale
// pointers in slot order (expert e at slot_of_expert[e]).
struct Fp8Experts {
  std::vector<Fp8Matrix> gate_up, down;  // by expert
  std::vector<const void*> gate_up_ptr, down_ptr, gate_up_scales, down_scales;  // by slot
};

inline Fp8Experts RandomFp8Experts(Backend* gpu, int64_t inter, int64_t hidden,
                                   const std::vector<int32_t>& slot_of_expert,
                                   std::mt19937* gen) {
  const size_t experts = slot_of_expert.size();
  Fp8Experts x;
  x.gate_up_ptr.resize(experts);
  x.down_ptr.resize(experts);
  x.gate_up_scales.resize(experts);
  x.down_scales.resize(experts);
  for (size_t e = 0; e < experts; ++e) {
    x.gate_up.push_back(RandomFp8Matrix(gpu, 2 * inter, hidden, inter, gen));
    x.down.push_back(RandomFp8Matrix(gpu, hidden, inter, 0, gen));
    const int32_t slot = slot_of_expert[e];
    x.gate_up_ptr[slot] = x.gate_up.back().data->data();
    x.down_ptr[slot] = x.down.back().data->data();
    x.gate_up_scales[slot] = x.gate_up.back().scales->data();
    x.down_scales[slot] = x.down.back().scales->data();
  }
  return x;
}

// The activations as a W8A8 GEMM reads them: per row and 128-wide block, s = max(amax / 448,
// FLT_MIN) and e4m3(x / s) * s (kernels/gemm/fp8_quantize.h's scheme, on the host).
inline std::vector<double> QuantisedActivations(const std::vector<float>& a, int64_t m, int64_t k) {
  std::vector<double> x(m * k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p0 = 0; p0 < k; p0 += 128) {
      const int64_t p1 = std::min(k, p0 + 128);
      float amax = 0.0f;
      for (int64_t p = p0; p < p1; ++p) amax = std::max(amax, std::fabs(a[i * k + p]));
      const float s = std::max(amax / 448.0f, FLT_MIN);
      for (int64_t p = p0; p < p1; ++p) {
        x[i * k + p] = static_cast<double>(F8E4M3ToFloat(FloatToF8E4M3(a[i * k + p] / s))) * s;
      }
    }
  }
  return x;
}

}  // namespace testing
}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_CUDA_FP8_TEST_MATRIX_H_
