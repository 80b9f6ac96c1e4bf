// The routed experts' W8A8 GEMM at decode sizes on Hopper's FP8 tensor cores, operands swapped
// (swap-AB): per expert e, out^T = W_e * A_e^T, so the weights fill wgmma's 64-row M side and the
// expert's few activation rows its N side (m64nNk32 e4m3, N = 8, 16, 24, 32 or 64). The output
// is fp32, or bf16 (rounded from the same fp32 results) for a consumer that reads bf16 rows. A CTA
// takes 128 weight rows of one expert (two m64 halves in one consumer warpgroup) and loops over its
// group's rows in chunks of N; a producer thread streams the 128 x 128-byte weight tiles and the
// N x 128-byte activation boxes with TMA (128-byte swizzle) through an mbarrier ring. Each
// 128-wide k block's partial sum is promoted into fp32 registers with the weight block's scale
// times the activation row's scale:
//
//   c[r, j] = sum_kb sa(r, kb) * sw_e(j, kb) * sum_{p in block kb} a[r, p] * w_e[j, p]
//
// The groups' extents are read on the device (a persistent grid walking the non-empty experts'
// units, or grid weight tiles x experts with empty experts exiting: the params' `persistent`),
// nothing is copied from the host per call and no host synchronisation happens, so a launch can
// be captured in a CUDA graph. The weights' TMA descriptors live in device memory, built once per
// weight set (Fp8WgmmaSwapBuildWeightMaps); the activations' descriptor is encoded on the host
// per call (no device call) and passed as a kernel parameter. Deterministic: no atomics, a fixed
// summation order for a given row-tile choice (rows_per_group_hint picks N; a row's result does
// not depend on N or on the other rows). The weight descriptors and the weight-scale pointer
// table are read before the kernel waits for the kernels ahead of it (`pdl`): no kernel in the
// stream may write them.
//
// Compiled for sm_90a only (the BUILD target's `archs`): Fp8WgmmaSwapSupports is false on any
// device other than compute capability 9.0.
#ifndef DEEPINFER_KERNELS_GEMM_FP8_WGMMA_DECODE_H_
#define DEEPINFER_KERNELS_GEMM_FP8_WGMMA_DECODE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deepinfer {
namespace kernels {

// Whether this device and binary run the kernel (compute capability 9.0, the sm_90a image, the
// driver's cuTensorMapEncodeTiled).
bool Fp8WgmmaSwapDeviceSupports();

// Bytes of device memory (64-byte aligned) that hold one weight set's TMA descriptors.
size_t Fp8WgmmaSwapWeightMapsBytes(int32_t num_groups);

// Encodes one descriptor per expert: host_weights[g] (a host array of device pointers) is expert
// g's [n, k] e4m3 matrix with row stride ldw bytes (16-byte aligned, ldw a multiple of 16 and
// >= k). Copies them to device_maps (Fp8WgmmaSwapWeightMapsBytes, 64-byte aligned) on `stream`
// and waits for the copy: not inside a CUDA graph capture. The descriptors stay valid while the
// weights stay where they are. They are stored in group order, Fp8WgmmaSwapWeightMapsBytes(1)
// bytes each, so groups encoded by separate calls (other row strides) can be placed one after
// another in one array (device_maps + Fp8WgmmaSwapWeightMapsBytes(first group)).
cudaError_t Fp8WgmmaSwapBuildWeightMaps(int32_t num_groups, const uint8_t* const* host_weights,
                                        int64_t n, int64_t k, int64_t ldw, void* device_maps,
                                        cudaStream_t stream);

// Group g (expert g) takes rows offsets[g] .. offsets[g + 1] - 1 of a and c (device offsets,
// num_groups + 1 entries, non-decreasing, [0] = 0, offsets[num_groups] <= max_rows). a is e4m3
// [max_rows, lda] (Fp8QuantizeRows' q) with the activation scales in Fp8QuantizeRows' grouped
// layout (group g's block kb of row r at a_scales[offsets[g] * Fp8ScaleCols(k) + kb * count_g +
// r - offsets[g]]); expert g's weight scales at scales[g] (device array of device pointers), the
// layout of Fp8BlockWeight (scale_ld, split_rows shared; split_rows a multiple of 128). The
// output is c (fp32 [max_rows, ldc]) or, instead, c_bf16 (bf16 bits [max_rows, ldc]: each fp32
// result rounded to the nearest bf16, ties to even; the same fp32 values as c would hold, so
// exactly c's values rounded); exactly one of them is set. Columns n .. ldc - 1 and rows from
// offsets[num_groups] on are not touched.
struct Fp8WgmmaSwapGroupedGemmParams {
  int32_t num_groups = 0;
  int32_t max_rows = 0;
  const int32_t* offsets = nullptr;
  int64_t n = 0, k = 0;
  const uint8_t* a = nullptr;
  int64_t lda = 0;
  const float* a_scales = nullptr;
  const void* weight_maps = nullptr;  // Fp8WgmmaSwapBuildWeightMaps' device_maps, same n, k
  const float* const* scales = nullptr;
  int64_t scale_ld = 0;
  int64_t split_rows = 0;
  float* c = nullptr;
  // Instead of c. Written 8 bytes (4 columns) a thread where the address is 8-byte aligned and
  // all 4 columns are below n (a warp's store: 8 rows x 32 bytes), 2 bytes a column otherwise.
  uint16_t* c_bf16 = nullptr;
  int64_t ldc = 0;
  // Expected most rows in one group (0: unknown): picks N (8, 16, 24, 32 or 64 rows a chunk); any
  // group size stays correct (a group longer than N loops over chunks, each reading the weight
  // tiles again).
  int32_t rows_per_group_hint = 0;
  // true: a persistent grid (SM count x the CTAs an SM holds, fewer where there is less work)
  // whose CTAs walk a static list of (expert, weight tile, chunk of rows) units of the non-empty
  // experts, each CTA every gridDim-th unit, the TMA ring running on across units; more than 1024
  // groups take the other form. false: one CTA per (weight tile, expert), empty experts' CTAs
  // exiting. The results are the same bits either way.
  bool persistent = true;
  // true (and kernels::ProgrammaticDependentLaunchEnabled()): launched with programmatic
  // dependent launch (kernels/common/launch.cuh), so the launch and the part of the kernel that
  // reads nothing an earlier kernel writes (shared memory and mbarrier set-up, the descriptors'
  // prefetch, the weight-scale pointers) overlap the kernel before it; griddepcontrol.wait comes
  // before the offsets, activations and scales are read. false: a plain launch (full stream
  // order). The same bits either way.
  bool pdl = true;
};

// The activation rows a chunk takes for a hint (8, 16, 24, 32 or 64; 32 for an unknown one).
int32_t Fp8WgmmaSwapChunkRows(int32_t rows_per_group_hint);

// Fp8WgmmaSwapDeviceSupports and: num_groups in 1 .. 65535, max_rows >= 1, n, k >= 1 below 2^31,
// k a multiple of 128, a 16-byte aligned with lda a multiple of 16 and >= k, exactly one of c and
// c_bf16, ldc >= n, scale_ld >= Fp8ScaleCols(k), split_rows >= 0 and a multiple of 128, non-null
// pointers (offsets included), weight_maps 64-byte aligned.
bool Fp8WgmmaSwapGroupedGemmSupports(const Fp8WgmmaSwapGroupedGemmParams& p);
// cudaErrorInvalidValue (nothing launched) where Fp8WgmmaSwapGroupedGemmSupports is false.
cudaError_t Fp8WgmmaSwapGroupedGemm(const Fp8WgmmaSwapGroupedGemmParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_FP8_WGMMA_DECODE_H_
