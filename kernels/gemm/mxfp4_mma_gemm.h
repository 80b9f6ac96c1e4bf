// Grouped GEMM against MXFP4 weights (OCP Microscaling FP4, DeepSeek-V4's routed experts) on
// bf16 tensor cores (mma.sync m16n8k16, sm_80+; Hopper has no FP4 MMA): the routed experts' rows
// of a decode step or a prefill, grouped by expert with the group extents in device memory (as
// Fp8MmaGroupedGemm, whose tile loop it shares: mma_weight_tile.cuh). Each thread loads 16 bytes
// of a weight row (32 e2m1 values, one 32-wide scale block) and widens them to bf16 in registers
// with the block's UE8M0 scale applied, which is exact (an e2m1 value times a power of two is a
// bf16 value while it stays within bf16's range: scale bytes up to 254, 2^127); activations are
// bf16 and the MMAs sum in fp32, so the products are exact and only the summation rounds. Decode
// streams a quarter of a bf16 expert's bytes (plus one scale byte per 32 values).
//
// Layout of one expert matrix [n, k] (k a multiple of 32):
//   weights  [n, k / 2] bytes, row-major; byte p / 2 of row j holds element (j, p) in its low
//            nibble for even p, in its high nibble for odd p; a nibble is e2m1: sign, two
//            exponent bits (bias 1), one mantissa bit (0, 0.5, 1, 1.5, 2, 3, 4, 6).
//   scales   [n, scale_ld] bytes, UE8M0: element (j, p) is e2m1(j, p) * 2^(scales[j * scale_ld +
//            p / 32] - 127). 0xFF (NaN in the spec) is not a scale: the loader refuses it.
#ifndef DEEPINFER_KERNELS_GEMM_MXFP4_MMA_GEMM_H_
#define DEEPINFER_KERNELS_GEMM_MXFP4_MMA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/gemm/mma_tile_options.h"

namespace deepinfer {
namespace kernels {

constexpr int64_t kMxfp4BlockSize = 32;  // values per UE8M0 scale, along k

// Whether this process has the tensor-core kernel for the current device (sm_80+ code).
bool Mxfp4MmaGemmAvailable();

// For group g: c[r, j] = sum_p a[r, p] * w_g(j, p) for rows r in [offsets[g], offsets[g + 1])
// (clamped to max_rows; rows past offsets[num_groups] untouched), a bf16 [max_rows, k] (the MoE
// permutation's bf16 rows), c fp32 [max_rows, n]. One block row per non-empty group; no host
// synchronisation (graph-capturable).
struct Mxfp4MmaGroupedGemmParams {
  int32_t num_groups = 0;
  int32_t max_rows = 0;
  const int32_t* offsets = nullptr;         // device [num_groups + 1], non-decreasing, [0] = 0
  int64_t n = 0, k = 0;                     // k a multiple of 32
  const uint16_t* a = nullptr;              // 16-byte aligned
  const uint8_t* const* weights = nullptr;  // device [num_groups] pointers, 16-byte aligned
  const uint8_t* const* scales = nullptr;   // device [num_groups] pointers
  int64_t scale_ld = 0;                     // >= k / 32
  float* c = nullptr;
  // Expected most rows in one group (0: unknown, max_rows): only the register tile (8, 16 or 32
  // rows a pass) depends on it; any group size stays correct.
  int32_t rows_per_group_hint = 0;
  // As Fp8MmaGroupedGemmParams::tile.
  MmaTileOptions tile = kGroupedMmaTile;
};

// Whether Mxfp4MmaGroupedGemm takes these arguments and the device has the kernel.
bool Mxfp4MmaGroupedGemmSupports(const Mxfp4MmaGroupedGemmParams& p);
// cudaErrorInvalidValue (nothing launched) where Mxfp4MmaGroupedGemmSupports is false.
cudaError_t Mxfp4MmaGroupedGemm(const Mxfp4MmaGroupedGemmParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_MXFP4_MMA_GEMM_H_
