// The rotation of one rope pair, shared by every kernel that rotates a rope slice (ApplyRopeF32,
// RmsNormRopeF32, NormRopeWriteLatentCacheF32, the sink attention's output epilogue), so that
// each gives ApplyRopeF32's bits. cos/sin are evaluated in double from the fp32 angle, like the
// CPU reference: at positions in the thousands the fp32 sincos intrinsics would differ from it
// by more than the parity tolerance allows for.
#ifndef DEEPINFER_KERNELS_ROPE_ROPE_PAIR_CUH_
#define DEEPINFER_KERNELS_ROPE_ROPE_PAIR_CUH_

#include <math.h>

namespace deepinfer {
namespace kernels {
namespace rope {

// cos and sin of pair j's angle pos * inv_freq_j, times attention_factor.
__device__ __forceinline__ void RopeCosSin(float pos, float inv_freq_j, float attention_factor,
                                           float* cs, float* sn) {
  const float angle = pos * inv_freq_j;
  double s, c;
  sincos(static_cast<double>(angle), &s, &c);
  *cs = static_cast<float>(c) * attention_factor;
  *sn = static_cast<float>(s) * attention_factor;
}

// A pair (x0, x1)'s rotated values, each operation rounded on its own (no contraction into a
// fused multiply-add, as the CPU reference computes them), so every kernel gives the same bits.
__device__ __forceinline__ float RotatedFirst(float x0, float x1, float cs, float sn) {
  return __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
}
__device__ __forceinline__ float RotatedSecond(float x0, float x1, float cs, float sn) {
  return __fadd_rn(__fmul_rn(x1, cs), __fmul_rn(x0, sn));
}

}  // namespace rope
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ROPE_ROPE_PAIR_CUH_
