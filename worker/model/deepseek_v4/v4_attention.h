// V4Attention: DeepSeek-V4's attention, per layer one of three kinds (V4AttentionKind):
//
//   * every kind: q = q_b(RmsNorm(q_a(h))), normed per head without weight; one shared K = V
//     head kv = kv_norm(kv_proj(h)); the trailing rope_dim channels of both rotated (GPT-J
//     interleaved) by the layer's rope ("main" for sliding layers, "compress" otherwise); each
//     query attends over the last sliding_window positions (itself included) and, on compressed
//     layers, compressed entries, with a per-head sink logit in the softmax; the output's rope
//     slice rotated back by its own position; the grouped low-rank output projection
//     (o_a per group of heads, then o_b).
//   * HCA (kCompressed): a compressor pools every `ratio` source positions into one entry
//     (softmax-gated sum of kv_proj rows with gate_proj + position_bias logits, kv_norm, rope
//     at the window's first position); a query at position p sees the entries of windows that
//     end at or before p.
//   * CSA (kSparse): the same with overlapping windows (each entry pools the previous window's
//     first projection half with its own window's second half), and a lightning indexer (its
//     own compressor at index_head_dim, queries from q_residual, per-head weights) that keeps
//     the index_topk best visible entries per query.
//
// State lives in the cache (kv_cache_spec.h): the window ring and the compressor rows in the
// sequence's state slot, the compressed entries and indexer keys paged in its blocks, so a
// prompt in chunks and one token at a time give what one prefill gives.
#ifndef DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_ATTENTION_H_
#define DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/deepseek_v4/v4_config.h"
#include "worker/model/deepseek_v4/v4_weights.h"

namespace deepinfer {

// One sequence of a step, host side.
struct V4Sequence {
  int64_t first_row = 0;   // its first token's row in the step
  int64_t num_tokens = 0;  // new tokens
  int64_t offset = 0;      // position of the first new token
  const std::vector<int32_t>* block_table = nullptr;
  int32_t slot = 0;  // its state slot in the cache
  // SequenceStep::replay_from / kept_end: no window key or compressor row before replay_from;
  // the compressed entries of windows ending at or before kept_end are kept as they are.
  int64_t replay_from = 0;
  int64_t kept_end = 0;
};

struct V4StepContext {
  int64_t num_tokens = 0;
  const int32_t* positions = nullptr;      // device [T]
  const int32_t* neg_positions = nullptr;  // device [T]: -position (the output's inverse rope)
  std::vector<V4Sequence> seqs;
  KvBlockPool* cache = nullptr;
};

class V4Attention {
 public:
  V4Attention(const DeepseekV4Config& config, const DeepseekV4Weights* weights, Backend* backend,
              const float* ones);

  // out [T, H] = the attention of the normed rows h [T, H] of layer `layer`; updates the
  // layer's cache for the step's tokens.
  absl::Status Forward(int64_t layer, const V4StepContext& ctx, const float* h, float* out);
  // DeepseekV4Model::set_indexer_full_forward_ties.
  void set_full_forward_ties(bool on) { full_forward_ties_ = on; }

 private:
  // Pools the step's closed windows of one compressor into the stream at `stream` (P floats per
  // block), from the new rows and the rows kept in the state at `state_offset` (a ring of
  // `ring_rows` rows), then keeps the new rows there.
  void Compress(int64_t layer, const V4StepContext& ctx, const float* h,
                const V4CompressorWeights& w, int64_t ratio, bool overlap, int64_t state_offset,
                int64_t ring_rows, float* stream, int64_t P);
  std::unique_ptr<DeviceBuffer> Floats(int64_t n) {
    return backend_->AllocateScratch(std::max<int64_t>(1, n) * sizeof(float));
  }
  std::unique_ptr<DeviceBuffer> Ints(const std::vector<int32_t>& v);
  void Copy(const float* src, int64_t floats, float* dst) {
    if (floats > 0) backend_->CopyDeviceToDevice(src, floats * sizeof(float), dst);
  }

  const DeepseekV4Config& config_;
  const DeepseekV4Weights* weights_;
  Backend* backend_;
  V4Ops* ops_;
  const float* ones_;
  std::unique_ptr<DeviceBuffer> main_inv_freq_, compress_inv_freq_;
  bool full_forward_ties_ = false;
};

// Copies `count` floats at element `begin` of a paged stream (P floats per block, blocks by
// `table`) to dst (read) or from src (write).
void ReadPaged(Backend* backend, const float* stream, int64_t P, const std::vector<int32_t>& table,
               int64_t begin, int64_t count, float* dst);
void WritePaged(Backend* backend, float* stream, int64_t P, const std::vector<int32_t>& table,
                int64_t begin, int64_t count, const float* src);
// A ring of ring_rows rows of `width` floats holds position p at row p % ring_rows. ReadRing
// copies positions [begin, end) (at most ring_rows of them) to consecutive rows of dst; WriteRing
// stores consecutive rows of src, positions [begin, end), keeping the last ring_rows of them.
// At most two copies each.
void ReadRing(Backend* backend, const float* ring, int64_t ring_rows, int64_t width, int64_t begin,
              int64_t end, float* dst);
void WriteRing(Backend* backend, const float* src, int64_t ring_rows, int64_t width, int64_t begin,
               int64_t end, float* ring);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_ATTENTION_H_
