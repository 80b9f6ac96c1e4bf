// MXFP4 to bf16: see mxfp4_dequant.h. One thread per scale block: 16 bytes of a weight row (32
// e2m1 values) and their scale byte in, 64 bytes of bf16 out. The bf16 bits are built from the
// e2m1 code and the scale exponent directly (no floating-point arithmetic, so no flush to zero
// of the subnormal products).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/gemm/mxfp4_dequant.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;

// e2m1 code c (sign bit 3; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6) times 2^(s - 127) as bf16 bits.
__device__ __forceinline__ uint32_t E2m1TimesPow2Bf16(uint32_t c, uint32_t s) {
  const uint32_t sign = (c & 8u) << 12;
  if (s == 0xFFu) return sign | 0x7FC0u;  // the spec's NaN scale: every element NaN
  const uint32_t m = c & 7u;
  if (m == 0) return sign;
  // m = 1: 2^-1; m >= 2: (1 + (m & 1) / 2) * 2^((m >> 1) - 1).
  const int e = (m == 1 ? -1 : static_cast<int>(m >> 1) - 1) + static_cast<int>(s) - 127;
  const uint32_t half = m >= 2 ? (m & 1u) : 0u;  // the mantissa's top bit
  if (e > 127) return sign | 0x7F80u;
  if (e >= -126) return sign | (static_cast<uint32_t>(e + 127) << 7) | (half << 6);
  // Subnormal (e is -127 or -128): (2 + half) * 2^(e - 1) = ((2 + half) << (e + 132)) * 2^-133.
  return sign | ((2u + half) << (e + 132));
}

// The 8 values of a word (byte b holds values 2b, low nibble, and 2b + 1) as four bf16x2 words.
__device__ __forceinline__ void Widen(uint32_t word, uint32_t s, uint32_t out[4]) {
#pragma unroll
  for (int b = 0; b < 4; ++b) {
    const uint32_t byte = (word >> (8 * b)) & 0xFFu;
    const uint32_t lo = E2m1TimesPow2Bf16(byte & 0xFu, s);
    const uint32_t hi = E2m1TimesPow2Bf16(byte >> 4, s);
    out[b] = lo | (hi << 16);
  }
}

__global__ void Mxfp4DequantKernel(Mxfp4DequantParams p) {
  const int64_t blocks_per_row = p.k / 32;
  const int64_t u = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (u >= p.n * blocks_per_row) return;
  const int matrix = p.first + static_cast<int>(blockIdx.y);
  const int64_t j = u / blocks_per_row, b = u % blocks_per_row;
  const uint4 w = *reinterpret_cast<const uint4*>(p.weights[matrix] + j * (p.k / 2) + b * 16);
  const uint32_t s = p.scales[matrix][j * p.scale_ld + b];
  uint4* out = reinterpret_cast<uint4*>(p.out + blockIdx.y * p.n * p.k + j * p.k + b * 32);
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t v[4];
    Widen(words[i], s, v);
    out[i] = make_uint4(v[0], v[1], v[2], v[3]);
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

cudaError_t Mxfp4DequantToBf16(const Mxfp4DequantParams& p, cudaStream_t stream) {
  if (p.first < 0 || p.num_matrices < 0 || p.num_matrices > 65535 || p.n < 0 || p.k < 0 ||
      p.k % 32 != 0 || p.scale_ld < p.k / 32 || p.weights == nullptr || p.scales == nullptr ||
      p.out == nullptr || !Aligned16(p.out)) {
    return cudaErrorInvalidValue;
  }
  const int64_t units = p.n * (p.k / 32);
  if (p.num_matrices == 0 || units == 0) return cudaSuccess;
  const int64_t grid_x = (units + kThreads - 1) / kThreads;
  if (grid_x > 0x7FFFFFFF) return cudaErrorInvalidValue;
  Mxfp4DequantKernel<<<dim3(static_cast<unsigned>(grid_x), p.num_matrices), kThreads, 0, stream>>>(
      p);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
