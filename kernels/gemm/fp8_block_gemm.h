// GEMMs against FP8 (e4m3, "fn": no infinities, max 448) weights with one fp32 scale per
// 128 x 128 block, as DeepSeek checkpoints store them (`weight` + `weight_scale_inv`; UE8M0
// scales are the power-of-two case of the same layout). The weights stay FP8 on the device:
// decode reads one byte per weight instead of bf16's two.
//
//  * Fp8SmallMGemm: a few activation rows (decode): every weight row is streamed once per launch
//    (16 bytes per lane) and dequantised in registers; the products of one lane's 16 weights
//    with the bf16-rounded activations are summed in fp32 (exact products), scaled by their
//    block's scale and added to the fp32 accumulator. At 1 and 2 rows (16-byte aligned
//    operands) a warp takes 4 weight rows at once and a row's k is split over up to 8 warps of a
//    block; the GEMV form (Fp8GemvForm, fp8_block_gemm_vec.cu) runs one wave of blocks that
//    walk their tiles with the next batch of weight loads in flight while the current one is
//    used. That form is launched with programmatic dependent launch (kernels/common/launch.cuh):
//    it loads its first weights and scales before waiting for the preceding kernel, so the
//    weight must not be written by a kernel of the same step (model weights never are).
//  * Fp8GroupedGemm: the same for the routed experts' rows, grouped by expert on the device
//    (the MoE permutation's offsets), so decode needs no host synchronisation.
//  * Fp8DequantToBf16: the weight dequantised and rounded to bf16 (the same bf16 weight
//    `--dtype bfloat16` would upload), for the bf16 cuBLAS path where no FP8 kernel takes the
//    operands.
// The tensor-core kernels for more rows are in fp8_mma_gemm.h.
//
// Scale layout: scales[ScaleRow(j) * scale_ld + p / 128] multiplies weight element (j, p).
// ScaleRow(j) is j / 128, except in a matrix stacked from two checkpoint tensors with their own
// block grids (the MLPs' [gate; up]): rows from split_rows on use the second tensor's grid,
// ceil(split_rows / 128) + (j - split_rows) / 128.
#ifndef DEEPINFER_KERNELS_GEMM_FP8_BLOCK_GEMM_H_
#define DEEPINFER_KERNELS_GEMM_FP8_BLOCK_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

inline constexpr int64_t kFp8BlockSize = 128;

#if defined(__CUDACC__)
#define DEEPINFER_FP8_HOST_DEVICE __host__ __device__
#else
#define DEEPINFER_FP8_HOST_DEVICE
#endif

// Row j's scale row (see the header comment); split_rows 0: one grid.
DEEPINFER_FP8_HOST_DEVICE inline int64_t Fp8ScaleRow(int64_t j, int64_t split_rows) {
  if (split_rows <= 0 || j < split_rows) return j / kFp8BlockSize;
  return (split_rows + kFp8BlockSize - 1) / kFp8BlockSize + (j - split_rows) / kFp8BlockSize;
}

// Rows of the scale grid of an [n, k] matrix stacked at split_rows (0: not stacked).
DEEPINFER_FP8_HOST_DEVICE inline int64_t Fp8ScaleRows(int64_t n, int64_t split_rows) {
  return n == 0 ? 0 : Fp8ScaleRow(n - 1, split_rows) + 1;
}
DEEPINFER_FP8_HOST_DEVICE inline int64_t Fp8ScaleCols(int64_t k) {
  return (k + kFp8BlockSize - 1) / kFp8BlockSize;
}
// The scale row stride the model loader gives an [n, k] matrix: Fp8ScaleCols(k) rounded up to a
// multiple of 4 (cuBLASLt's 128 x 128 block scaling needs it; fp8_blockscaled_gemm.h), the
// padding columns unused.
DEEPINFER_FP8_HOST_DEVICE inline int64_t Fp8ScaleLd(int64_t k) {
  return (Fp8ScaleCols(k) + 3) / 4 * 4;
}

// An [n, k] FP8 weight: element (j, p) at data[j * ldw + p] (bytes).
struct Fp8BlockWeight {
  const uint8_t* data = nullptr;
  int64_t ldw = 0;
  const float* scales = nullptr;
  int64_t scale_ld = 0;    // >= Fp8ScaleCols(k)
  int64_t split_rows = 0;  // see Fp8ScaleRow
};

// The most activation rows one Fp8SmallMGemm launch takes (more: one launch per 8 rows).
inline constexpr int64_t kFp8SmallMGemmRowsPerLaunch = 8;

// The kernel of Fp8SmallMGemm's 1- and 2-row vector path (16-byte aligned operands). kAuto:
// kPipelined2 at one row, kPipelined1 at two (whose registers leave room for two blocks an SM).
// kPipelinedN: a lane loads N 16-byte chunks of each of a warp's 4 weight rows a batch and
// issues batch t + 1's loads before it uses batch t, in a grid of one wave (as many blocks as fit
// on the device, each walking column tiles of the same work). Both give the header's sums; the
// order of a row's additions over k differs between them (each is deterministic).
// fp8_block_gemm_bench compares them.
enum class Fp8GemvForm : int { kAuto = 0, kPipelined1, kPipelined2 };

// c[i, j] (+)= sum_p bf16(a[i, p]) * w(j, p) * scale(j, p) for i < m, j < n, p < k. a is fp32
// (rounded to bf16 to nearest even as it is read, as RoundF32ToBf16) or, with a_bf16, bf16 bits.
// Products of bf16 and e4m3 are exact in fp32; each lane sums 16 of them (one block's scale)
// before scaling, so the result differs from the fp32 sum over the dequantised weight only by
// fp32 rounding. With accumulate, c[i, j] + the sum is one fp32 addition.
struct Fp8SmallMGemmParams {
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  bool a_bf16 = false;
  int64_t lda = 0;
  Fp8BlockWeight w;
  float* c = nullptr;
  int64_t ldc = 0;
  bool accumulate = false;
  Fp8GemvForm gemv_form = Fp8GemvForm::kAuto;
  // The pipelined forms' warps per 4-row group (1, 2, 4 or 8); 0 (or another value): the
  // launch's choice, the least modelled time for the grid of one wave.
  int gemv_ksplit = 0;
};

// Whether Fp8SmallMGemm takes these arguments: m, n, k >= 1 and in int range, non-null
// pointers, lda >= k, ldw >= k, ldc >= n, scale_ld >= Fp8ScaleCols(k). Any alignment: 16-byte
// aligned operands with k a multiple of 16 take vector loads, others a scalar loop.
bool Fp8SmallMGemmSupports(const Fp8SmallMGemmParams& p);
// cudaErrorInvalidValue (nothing launched) where Fp8SmallMGemmSupports is false.
cudaError_t Fp8SmallMGemm(const Fp8SmallMGemmParams& p, cudaStream_t stream);

// Rows of `a` grouped by expert: group g's rows are offsets[g] .. offsets[g + 1] - 1 (device
// int32, num_groups + 1 entries, non-decreasing, offsets[num_groups] <= max_rows; rows past it
// are not touched) and are multiplied by group g's weight ([n, k], contiguous: ldw = k):
// c[r, j] = sum_p bf16(a[r, p]) * w_g(j, p) * scale_g(j, p), as Fp8SmallMGemm computes it.
// a is fp32 [max_rows, k] and c fp32 [max_rows, n], both contiguous.
struct Fp8GroupedGemmParams {
  int32_t num_groups = 0;
  int32_t max_rows = 0;  // the rows of a / c (a bound on offsets[num_groups])
  const int32_t* offsets = nullptr;
  int64_t n = 0, k = 0;
  const float* a = nullptr;
  const uint8_t* const* weights = nullptr;  // device [num_groups] pointers
  const float* const* scales = nullptr;     // device [num_groups] pointers
  int64_t scale_ld = 0;                     // of every group's scales, >= Fp8ScaleCols(k)
  int64_t split_rows = 0;                   // the weights' stacking (Fp8ScaleRow)
  float* c = nullptr;
};
bool Fp8GroupedGemmSupports(const Fp8GroupedGemmParams& p);
cudaError_t Fp8GroupedGemm(const Fp8GroupedGemmParams& p, cudaStream_t stream);

// out[j * k + p] = bf16(w(j, p) * scale(j, p)) (round to nearest even), j < n, p < k.
cudaError_t Fp8DequantToBf16(const Fp8BlockWeight& w, int64_t n, int64_t k, uint16_t* out,
                             cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_GEMM_FP8_BLOCK_GEMM_H_
