// W8A8 GEMMs on Hopper's FP8 tensor cores (wgmma, TMA): activations quantised per row in 1 x 128
// blocks (Fp8QuantizeRows, fp8_quantize.h) times e4m3 weights with 128 x 128 block scales
// (Fp8BlockWeight, fp8_block_gemm.h):
//
//   c[i, j] = sum_kb sa(i, kb) * sw(j, kb) * sum_{p in block kb} a[i, p] * w[j, p]
//
// The inner sum over one 128-wide k block runs on the tensor cores (four m64n128k32 e4m3
// wgmmas per 64-row half of the tile); its result is scaled by the block's activation and weight
// scales and added to an fp32 accumulator in registers, so the tensor cores' reduced-precision
// accumulation spans only 128 products. Persistent CTAs (one per SM) loop over 128 x 128 tiles
// of c: a producer thread loads A and B tiles (128 x 128 bytes each, 128-byte swizzle) with TMA
// into a ring of kFp8WgmmaStages stages guarded by mbarriers, running ahead into the next tile;
// two consumer warpgroups multiply them (64 rows each) and store the tile, fp32 or bf16,
// straight from registers.
//
// The kernel is compiled for sm_90a only (the BUILD target's `archs`): the *Supports functions
// are false on any device other than compute capability 9.0.
#ifndef DEEPINFER_KERNELS_GEMM_FP8_WGMMA_GEMM_H_
#define DEEPINFER_KERNELS_GEMM_FP8_WGMMA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/gemm/fp8_block_gemm.h"

namespace deepinfer {
namespace kernels {

inline constexpr int kFp8WgmmaStages = 6;

// Dense: rows i < m of a (e4m3 bytes, row stride lda) with the activation scale of row i's k
// block kb at a_scales[kb * a_scale_ld + i] (Fp8QuantizeRows' layout: a_scale_ld = its m_pad),
// times w ([n, k]). c is fp32 or, with c_bf16, bf16 bits (round to nearest even), row stride
// ldc; with accumulate (fp32 only) c[i, j] + the sum is one fp32 addition. Columns n .. ldc - 1
// are not touched.
struct Fp8WgmmaGemmParams {
  int64_t m = 0, n = 0, k = 0;
  const uint8_t* a = nullptr;
  int64_t lda = 0;
  const float* a_scales = nullptr;
  int64_t a_scale_ld = 0;
  Fp8BlockWeight w;
  void* c = nullptr;
  int64_t ldc = 0;
  bool c_bf16 = false;
  bool accumulate = false;
};

// Whether this device and binary run the kernel (compute capability 9.0, the sm_90a image and
// the driver's cuTensorMapEncodeTiled).
bool Fp8WgmmaDeviceSupports();

// Fp8WgmmaDeviceSupports and: m, n, k >= 1, m and n below 2^31, k a multiple of 128, a and
// w.data 16-byte aligned with lda, ldw multiples of 16 and >= k, a_scale_ld >= m,
// w.scale_ld >= Fp8ScaleCols(k), w.split_rows a multiple of 128 (a 128-row tile of w has one
// scale row), ldc >= n and even, c 8-byte aligned (4 for bf16), no accumulate with c_bf16.
bool Fp8WgmmaGemmSupports(const Fp8WgmmaGemmParams& p);
// cudaErrorInvalidValue (nothing launched) where Fp8WgmmaGemmSupports is false.
cudaError_t Fp8WgmmaGemm(const Fp8WgmmaGemmParams& p, cudaStream_t stream);

// Grouped (the routed experts at prefill, rows sorted by expert): group g takes rows
// host_offsets[g] .. host_offsets[g + 1] - 1 of a and c (host array, num_groups + 1 entries,
// non-decreasing, [0] = 0) and its own weight weights[g] ([n, k] each, host array of device
// pointers), in one launch: every 128-row tile lies in one group (a group's last tile masks the
// rows past it). The activation scales are Fp8QuantizeRows' grouped layout: group g's block kb
// of row i at a_scales[host_offsets[g] * Fp8ScaleCols(k) + kb * count_g + (i - host_offsets[g])].
// Rows from host_offsets[num_groups] on are not touched.
//
// `workspace` (device, Fp8WgmmaGroupedWorkspaceBytes, 64-byte aligned) receives one TMA
// descriptor per group and the tile list, copied from the host on `stream` (cudaMemcpyAsync from
// pageable memory, so not inside a CUDA graph capture); it must stay untouched until the launch
// has run.
struct Fp8WgmmaGroupedGemmParams {
  int32_t num_groups = 0;
  const int32_t* host_offsets = nullptr;
  int64_t n = 0, k = 0;
  const uint8_t* a = nullptr;
  int64_t lda = 0;
  const float* a_scales = nullptr;
  const Fp8BlockWeight* weights = nullptr;  // host [num_groups]
  void* c = nullptr;
  int64_t ldc = 0;
  bool c_bf16 = false;
  void* workspace = nullptr;
};

size_t Fp8WgmmaGroupedWorkspaceBytes(int32_t num_groups, const int32_t* host_offsets);
// As Fp8WgmmaGemmSupports for every group's weight (all with the same split_rows), plus valid
// offsets and a non-null workspace; num_groups >= 1.
bool Fp8WgmmaGroupedGemmSupports(const Fp8WgmmaGroupedGemmParams& p);
cudaError_t Fp8WgmmaGroupedGemm(const Fp8WgmmaGroupedGemmParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_FP8_WGMMA_GEMM_H_
