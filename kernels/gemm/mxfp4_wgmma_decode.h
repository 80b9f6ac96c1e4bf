// The routed experts' MXFP4 x e4m3 GEMM at decode sizes on Hopper's FP8 tensor cores, operands
// swapped (swap-AB, as fp8_wgmma_decode.h): per expert e, out^T = W_e * A_e^T, the weights wgmma's
// 64-row M side taken from registers, the expert's few e4m3 activation rows its N side from shared
// memory (m64nNk32 e4m3, N = 8, 16 or 32). A persistent grid walks (expert, 128 weight rows, chunk
// of N rows) units of the non-empty experts; a producer thread streams the packed e2m1 tiles (128
// rows x 64 bytes a 128-wide k block, TMA with the 64-byte swizzle) and the activation boxes (N x
// 128 bytes, 128-byte swizzle) through an mbarrier ring. Each consumer thread reads its A fragment
// bytes from shared memory and widens them to e4m3 in registers with a byte permute from an
// 8-entry magnitude table plus the sign bit.
//
// Scales. Weight (j, p) is e2m1(j, p) * 2^(s - 127) with s the UE8M0 byte of its 32-value block
// (mxfp4_mma_gemm.h's layout). Within a 128-wide k block of a row, with E the largest of its four
// scale bytes, the register value is e2m1 * 2^(s - E + 6), so the block's product is one wgmma
// chain whose fp32 sum is multiplied by 2^(E - 133) times the activation row's block scale and
// added into the fp32 accumulator:
//
//   c[r, j] = sum_kb sa(r, kb) * 2^(E(j, kb) - 133) * sum_{p in kb} a[r, p] * w'(j, p)
//
// e2m1 * 2^d is an exact e4m3 value for every e2m1 code when -8 <= d <= 6 (6 * 2^6 = 384 <= 448;
// 0.5 * 2^-8 = 2^-9, e4m3's smallest subnormal, and 1.5, 3 and 6 times 2^-8 are multiples of it),
// so the products are those of the dequantised weights exactly when every 32-value block that holds
// a nonzero code has s >= E - 14 (blocks of zeros are exact at any scale). A matrix where some
// block breaks this, or that holds a scale byte 0xFF, is not for this kernel: Mxfp4WgmmaSwapCheck
// finds that once at weight load, and the caller keeps such a matrix on another kernel. The
// numbers are then those of Mxfp4W4a8GroupedGemm (exact e4m3 x MXFP4 products, fp32 sums) up to
// the order of the additions: the tensor cores add a k block's 128 products with fewer bits than
// fp32, then the promotion to fp32 is per block.
//
// No host synchronisation and nothing copied per call (graph-capturable): the weight descriptors
// live in device memory (Mxfp4WgmmaSwapBuildWeightMaps, once per weight set), the activations'
// descriptor is encoded on the host per call. Deterministic for a given N (no atomics, a fixed
// order of additions); a row's result does not depend on the other rows. Under programmatic
// dependent launch (`pdl`) only shared memory, the mbarriers and the activations' descriptor (a
// kernel parameter) are touched before the kernel waits for the kernels ahead of it.
//
// Compiled for sm_90a only: Mxfp4WgmmaSwapDeviceSupports is false on any device other than
// compute capability 9.0.
#ifndef DEEPINFER_KERNELS_GEMM_MXFP4_WGMMA_DECODE_H_
#define DEEPINFER_KERNELS_GEMM_MXFP4_WGMMA_DECODE_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace deepinfer {
namespace kernels {

// Whether this device and binary run the kernel (compute capability 9.0, the sm_90a image, the
// driver's cuTensorMapEncodeTiled).
bool Mxfp4WgmmaSwapDeviceSupports();

// Bytes of device memory (64-byte aligned) that hold one weight set's TMA descriptors, one
// Mxfp4WgmmaSwapWeightMapsBytes(1) a group, in group order.
size_t Mxfp4WgmmaSwapWeightMapsBytes(int32_t num_groups);

// Encodes one descriptor per expert: host_weights[g] (a host array of device pointers, 16-byte
// aligned) is expert g's packed [n, k / 2] e2m1 matrix (k a multiple of 128). Copies them to
// device_maps (64-byte aligned) on `stream` and waits for the copy: not inside a graph capture.
cudaError_t Mxfp4WgmmaSwapBuildWeightMaps(int32_t num_groups, const uint8_t* const* host_weights,
                                          int64_t n, int64_t k, void* device_maps,
                                          cudaStream_t stream);

// Whether every expert matrix fits the kernel's exponent bound (see the top comment): weights and
// scales are device arrays of num_groups device pointers, scale_ld >= k / 32. Runs one pass over
// the weights and scales on `stream` and waits for it: once at weight load, not inside a capture.
// *fits is false where some matrix does not fit.
cudaError_t Mxfp4WgmmaSwapCheck(int32_t num_groups, const uint8_t* const* weights,
                                const uint8_t* const* scales, int64_t n, int64_t k,
                                int64_t scale_ld, bool* fits, cudaStream_t stream);

// Group g (expert g) takes rows offsets[g] .. offsets[g + 1] - 1 of a and c (device offsets,
// num_groups + 1 entries, non-decreasing, [0] = 0, offsets[num_groups] <= max_rows). a is e4m3
// [max_rows, lda] with fp32 scales in Fp8QuantizeRows' grouped layout (group g's block kb of row r
// at a_scales[offsets[g] * k / 128 + kb * count_g + r - offsets[g]]); expert g's UE8M0 scales at
// scales[g] (device array of device pointers, each 4-byte aligned), row j's at scales[g][j *
// scale_ld ..]. c is fp32 [max_rows, ldc]: columns n .. ldc - 1 and rows from offsets[num_groups]
// on are not touched.
struct Mxfp4WgmmaSwapGroupedGemmParams {
  int32_t num_groups = 0;
  int32_t max_rows = 0;
  const int32_t* offsets = nullptr;
  int64_t n = 0, k = 0;
  const uint8_t* a = nullptr;
  int64_t lda = 0;
  const float* a_scales = nullptr;
  const void* weight_maps = nullptr;  // Mxfp4WgmmaSwapBuildWeightMaps' device_maps, same n, k
  const uint8_t* const* scales = nullptr;
  int64_t scale_ld = 0;
  float* c = nullptr;
  int64_t ldc = 0;
  // Expected most rows in one group (0: unknown): picks N (8, 16 or 32 rows a chunk); any group
  // size stays correct (a group longer than N loops over chunks, each reading the weights again).
  int32_t rows_per_group_hint = 0;
  // As Fp8WgmmaSwapGroupedGemmParams::pdl. The same bits either way.
  bool pdl = true;
};

// The activation rows a chunk takes for a hint (8, 16 or 32; 32 for an unknown one).
int32_t Mxfp4WgmmaSwapChunkRows(int32_t rows_per_group_hint);

// Mxfp4WgmmaSwapDeviceSupports and: num_groups in 1 .. 1024, max_rows >= 1, n, k >= 1 below 2^31,
// k a multiple of 128, a 16-byte aligned with lda a multiple of 16 and >= k, ldc >= n, scale_ld a
// multiple of 4 and >= k / 32, non-null pointers, weight_maps 64-byte aligned.
bool Mxfp4WgmmaSwapGroupedGemmSupports(const Mxfp4WgmmaSwapGroupedGemmParams& p);
// cudaErrorInvalidValue (nothing launched) where Mxfp4WgmmaSwapGroupedGemmSupports is false.
cudaError_t Mxfp4WgmmaSwapGroupedGemm(const Mxfp4WgmmaSwapGroupedGemmParams& p,
                                      cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_MXFP4_WGMMA_DECODE_H_
