// Backend: the device-neutral set of operations the DeepSeek-V3 forward pass needs.
//
// Conventions (shared by every implementation, so a CUDA backend can be checked against the
// CPU one op by op):
//  * All pointers are device addresses from this backend's DeviceBuffers.
//  * Activations and weights are fp32 row-major. "ld*" arguments are row strides in elements,
//    so ops can read column slices (e.g. the rope part of each head) without copies.
//  * Linear layers follow the checkpoint layout: W is [out_features, in_features], y = x·Wᵀ.
//  * Index arrays (token ids, positions, slots, block tables, expert ids) are int32.
//  * Host-side plans (expert group offsets) are passed as host vectors: they are produced by
//    the dispatcher, which already synchronises with the host to size its buffers.
#ifndef DEEPINFER_WORKER_BACKEND_BACKEND_H_
#define DEEPINFER_WORKER_BACKEND_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/device_buffer.h"

namespace deepinfer {

// Paged latent KV cache geometry for one layer, as the attention op sees it. Entry t of block b
// lives at cache + ((b * block_size) + t) * entry_dim, with the latent first, rope key after.
struct PagedLatentCacheView {
  float* cache = nullptr;
  int32_t block_size = 0;
  int32_t latent_dim = 0;  // kv_lora_rank
  int32_t rope_dim = 0;    // qk_rope_head_dim
  int32_t entry_dim() const { return latent_dim + rope_dim; }
};

// Arguments of the absorbed-MLA attention op. Each query token t belongs to sequence
// token_seq[t] and sees the first context_len[t] cached positions of that sequence (causal:
// its own position + 1). Block tables are [num_seqs, max_blocks_per_seq], row-major.
struct MlaAttentionArgs {
  int32_t num_tokens = 0;
  int32_t num_heads = 0;
  const float* q_latent = nullptr;  // [tokens, heads, latent_dim], contiguous
  const float* q_rope = nullptr;    // rope part of each head, strided:
  int64_t q_rope_token_stride =
      0;  //   element (t, h, i) at q_rope[t*token_stride + h*head_stride + i]
  int64_t q_rope_head_stride = 0;
  PagedLatentCacheView cache;
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  const int32_t* token_seq = nullptr;
  const int32_t* context_len = nullptr;
  float softmax_scale = 1.0f;
  float* out_latent = nullptr;  // [tokens, heads, latent_dim]
};

// Arguments of the DeepSeek "noaux_tc" router.
struct NoauxTcRouteArgs {
  int32_t num_tokens = 0;
  int32_t num_experts = 0;
  const float* router_logits = nullptr;    // [tokens, experts]
  const float* correction_bias = nullptr;  // [experts]; selection only
  int32_t num_groups = 1;
  int32_t topk_groups = 1;
  int32_t top_k = 1;
  bool normalize = true;
  float scaling_factor = 1.0f;
  int32_t* topk_ids = nullptr;    // [tokens, top_k], ascending expert id within a token
  float* topk_weights = nullptr;  // [tokens, top_k]
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- Memory ------------------------------------------------------------------------------
  // Zero-initialised; never returns null (allocation failure is fatal, as for std::vector).
  virtual std::unique_ptr<DeviceBuffer> Allocate(size_t bytes) = 0;
  virtual void CopyToDevice(const void* host, size_t bytes, void* device) = 0;
  virtual void CopyToHost(const void* device, size_t bytes, void* host) = 0;
  virtual void CopyDeviceToDevice(const void* src, size_t bytes, void* dst) = 0;
  // Blocks until every op issued so far has completed (no-op on the CPU).
  virtual void Synchronize() = 0;
  // The first error an op has hit since the backend was created (ops return nothing, and a GPU
  // reports errors asynchronously). Always OK on the CPU. Checked by the model after each step.
  virtual absl::Status status() const { return absl::OkStatus(); }

  // ---- Dense math --------------------------------------------------------------------------
  // c[i, j] (+)= sum_p a[i, p] * w[j, p] for i < m, j < n, p < k.
  virtual void Gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* w,
                    int64_t ldw, float* c, int64_t ldc, bool accumulate) = 0;
  // Rows of a [rows, k] split into consecutive groups; group g (rows offsets[g]..offsets[g+1])
  // is multiplied by weights[g] ([n, k]): c = a·W_gᵀ. offsets has weights.size() + 1 entries.
  virtual void GroupedGemm(const std::vector<int64_t>& offsets,
                           const std::vector<const float*>& weights, int64_t n, int64_t k,
                           const float* a, float* c) = 0;
  // out[r, :] = x[r, :] / rms(x[r, :]) * weight (statistics in fp32). out may alias x.
  virtual void RmsNorm(int64_t rows, int64_t dim, const float* x, int64_t ldx, const float* weight,
                       float eps, float* out, int64_t ldout) = 0;
  // out = a + b, elementwise over n values. out may alias a or b.
  virtual void Add(int64_t n, const float* a, const float* b, float* out) = 0;
  // out[r, i] = silu(x[r, i]) * x[r, inter + i]: x rows are [gate | up] of width 2*inter.
  virtual void SiluMul(int64_t rows, int64_t inter, const float* x, float* out) = 0;

  // ---- Embedding and permutation -----------------------------------------------------------
  // dst[r, :] = src[idx[r], :], rows of width dim.
  virtual void GatherRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                          float* dst) = 0;
  // dst[idx[r], :] += weight[r] * src[r, :]; rows are applied in order r = 0, 1, ...
  virtual void ScatterAddRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                              const float* weight, float* dst) = 0;

  // ---- Position encoding -------------------------------------------------------------------
  // Rotates x in place. Element (t, h, i) of the rotary slice is at
  // x[t*token_stride + h*head_stride + i], i < rope_dim. Angle of pair j at token t is
  // positions[t] * inv_freq[j]; cos/sin are multiplied by attention_factor (YaRN).
  // interleaved: pairs are (2j, 2j+1) (DeepSeek checkpoints); else (j, j + rope_dim/2).
  virtual void ApplyRope(int64_t tokens, int64_t heads, float* x, int64_t token_stride,
                         int64_t head_stride, int64_t rope_dim, const int32_t* positions,
                         const float* inv_freq, float attention_factor, bool interleaved) = 0;

  // ---- Attention ---------------------------------------------------------------------------
  // Writes each token's latent and rope key into its cache slot (slot = block*block_size+off).
  virtual void WriteLatentCache(int64_t tokens, const float* latent, int64_t ld_latent,
                                const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                const PagedLatentCacheView& cache) = 0;
  // Absorbed MLA: out[t, h] = sum_j softmax_j(scale * (q_latent·c_j + q_rope·k_j)) c_j.
  virtual void MlaAttention(const MlaAttentionArgs& args) = 0;

  // ---- MoE routing -------------------------------------------------------------------------
  virtual void NoauxTcRoute(const NoauxTcRouteArgs& args) = 0;
  // Expert load statistics (EPLB): counts[ids[i]] += 1 for i in [0, n), on the device, so that
  // counting costs no host round-trip; the counts are read back only when a load window is
  // reported. Ids outside [0, num_experts) are not counted (the dispatcher reports them).
  virtual void AccumulateExpertCounts(int64_t n, const int32_t* ids, int64_t num_experts,
                                      int64_t* counts) = 0;

  // ---- Sampling ----------------------------------------------------------------------------
  // Greedy sampling on the device: out[r] = argmax of logits row r (lowest index on ties).
  // Seeded temperature/top-k/top-p sampling is worker/sampling/sampler.h, on host logits.
  virtual void ArgmaxRows(int64_t rows, int64_t vocab, const float* logits, int32_t* out) = 0;
  // Greedy sampling with the log-probability the engine reports: token[r] = argmax of row r
  // (lowest index on ties), logprob[r] = logits[r, token[r]] - logsumexp(row r), the normaliser
  // accumulated in double. Lets a decode step return rows × (int, float) instead of the logits.
  virtual void GreedySampleRows(int64_t rows, int64_t vocab, const float* logits, int32_t* token,
                                float* logprob) = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_BACKEND_H_
