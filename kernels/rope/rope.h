// Rotary position embedding (fp32), interleaved or rotate-half layout, with the YaRN attention
// factor applied to cos/sin: the GPU counterpart of Backend::ApplyRope.
#ifndef DEEPINFER_KERNELS_ROPE_ROPE_H_
#define DEEPINFER_KERNELS_ROPE_ROPE_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Rotates x in place. Element (t, h, i) of the rotary slice is x[t*token_stride +
// h*head_stride + i], i < rope_dim (even). Pair j of token t turns by positions[t] *
// inv_freq[j] (formed in fp32, as HF does); interleaved pairs are (2j, 2j+1), otherwise
// (j, j + rope_dim/2). inv_freq has rope_dim/2 entries (YaRN already folded in).
cudaError_t ApplyRopeF32(int64_t tokens, int64_t heads, float* x, int64_t token_stride,
                         int64_t head_stride, int64_t rope_dim, const int32_t* positions,
                         const float* inv_freq, float attention_factor, bool interleaved,
                         cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_ROPE_ROPE_H_
