// The 64-head wgmma MLA decode kernel (Hopper, sm_90a), compiled in its own translation unit
// (mla_decode_wgmma.cu, the sm_90a-only image; the other decode kernels keep their portable
// images): MlaAttentionF32 (mla_attention.cu) plans it and runs the split combine after it.
// Internal to //kernels/attention:mla_attention.
#ifndef DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_WGMMA_H_
#define DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_WGMMA_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/attention/mla_attention.h"

namespace deepinfer {
namespace kernels {

// Heads per block and keys per tile of the wgmma kernel; the shape it takes (latent 512 + rope 64).
constexpr int32_t kMlaWgmmaHeads = 64;
constexpr int32_t kMlaWgmmaKeys = 64;
constexpr int32_t kMlaWgmmaLatent = 512;
constexpr int32_t kMlaWgmmaRope = 64;

// Whether the kernel (over FP8 entries: fp8) runs on `device`: its sm_90a image loads there and
// the device grants its shared memory (one block per SM). Cached per (device, fp8).
bool MlaWgmmaRuns(int device, bool fp8);

// Launches one block per (token, context split, group of kMlaWgmmaHeads heads), block index =
// (token * num_splits + split) * num_groups + group. num_splits == 1: writes out_latent;
// otherwise each split's unnormalised output and (max, sum) go to ws_out / ws_ml in
// MlaCombineKernel's layout (empty splits write max -inf, sum 0). Needs num_heads a multiple of
// kMlaWgmmaHeads, a cache of latent 512 + rope 64, 16-byte aligned: bf16, or FP8 with the rope
// key 16-byte aligned in the entry (read as the bf16 values of mla_fp8_gather.h's copy).
cudaError_t LaunchMlaWgmma(const MlaAttentionParams& p, int num_groups, int num_splits,
                           float* ws_out, float* ws_ml, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ATTENTION_MLA_DECODE_WGMMA_H_
