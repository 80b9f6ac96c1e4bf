// V4Attention: DeepSeek-V4's attention, per layer one of three kinds (V4AttentionKind):
//
//   * every kind: q = q_b(RmsNorm(q_a(h))), normed per head without weight; one shared K = V
//     head kv = kv_norm(kv_proj(h)); the trailing rope_dim channels of both rotated (GPT-J
//     interleaved) by the layer's rope ("main" for sliding layers, "compress" otherwise); each
//     query attends over the last sliding_window positions (itself included) and, on compressed
//     layers, compressed entries, with a per-head sink logit in the softmax; the output's rope
//     slice rotated back by its own position; the grouped low-rank output projection
//     (o_a per group of heads, then o_b). Where the backend takes them
//     (V4Ops::TakesBf16Attention: the CUDA backend's prefill with bf16 weights), the normed
//     query and the attention's rotated output are passed in bf16, rounded where they are made
//     (the same values the fp32 path's consumers round).
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
// prompt in chunks and one token at a time give what one prefill gives. Attention and the
// indexer read the keys where the cache keeps them; every row the layer moves goes by the
// step's V4StepPlan (v4_step_plan.h), one V4Ops::CopyRows per list: a layer issues the same ops
// whatever the batch, touches no host memory, and can be recorded in a decode graph.
#ifndef DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_ATTENTION_H_
#define DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/deepseek_v4/v4_config.h"
#include "worker/model/deepseek_v4/v4_step_plan.h"
#include "worker/model/deepseek_v4/v4_weights.h"

namespace deepinfer {

// What every layer of a step reads besides its weights and inputs.
struct V4StepContext {
  const V4StepPlan* plan = nullptr;
  KvBlockPool* cache = nullptr;
};

class V4Attention {
 public:
  V4Attention(const DeepseekV4Config& config, const DeepseekV4Weights* weights, Backend* backend,
              const float* ones);

  // out [T, H] = the attention of the rows h = RmsNorm(x [T, H]) * norm_weight (the layer's
  // input norm, the model's eps; x is not changed) of cache layer `layer` (the model's layers,
  // then its MTP modules': layer num_layers + i is module i's); updates the layer's cache for the
  // step's tokens. The norm is taken by the projections that read h (NormedGemms).
  // With h_bf16 (TakesNormedInput), h is given, rounded to bf16 (AddRmsNorm's out_bf16 of x),
  // and x and norm_weight are not read.
  absl::Status Forward(int64_t layer, const V4StepContext& ctx, float* x, const float* norm_weight,
                       float* out, const uint16_t* h_bf16 = nullptr);
  // Whether Forward of `layer` at T rows takes h_bf16: fused ops, every projection reading h bf16,
  // and at least kNormedInputMinRows rows. The projections then run as NormedGemms would run them
  // (AddRmsNorm's bf16 rows into each Gemm, bit for bit), without the norm pass; at 1 and 2 rows
  // the CUDA backend folds the norm into its GEMVs instead, which read the fp32 rows.
  bool TakesNormedInput(int64_t layer, int64_t T) const;
  static constexpr int64_t kNormedInputMinRows = 3;

  // Fused ops (on by default): each norm and the projections that read it as one
  // Backend::AddRmsNormGemms; off: RmsNorm, then each Gemm (the reference composition).
  void SetFusedOps(bool on) { fused_ops_ = on; }

 private:
  // gemms' c = RmsNorm(x [T, dim]) * weight (eps: the model's) times each gemm's matrix. Fused
  // ops: one Backend::AddRmsNormGemms (the CUDA backend folds the norm into its one-row GEMVs,
  // kernels/gemm/staged_gemv.h), the normed rows handed to the GEMMs in bf16 where every matrix
  // is bf16 (the rounding a bf16 Gemm gives an fp32 operand: the same products, one rounding
  // pass instead of one per GEMM). x is not changed.
  void NormedGemms(int64_t T, int64_t dim, float* x, const float* weight,
                   const std::vector<NormedGemm>& gemms);
  // The attention weights and kind of cache layer `layer` (the model's, then its MTP modules').
  const V4AttentionWeights& WeightsOf(int64_t layer) const;
  V4AttentionKind KindOf(int64_t layer) const;
  // Rows r = t * heads + h of dim values at x (stride dim) normed with weight (the model's eps)
  // into out (stride dim; may be x), their trailing rope_dim values rotated at positions[t]
  // (interleaved): V4Ops::NormRope with fused ops where the backend takes it, else RmsNorm, then
  // ApplyRope.
  void NormRope(int64_t tokens, int64_t heads, int64_t dim, const float* x, const float* weight,
                float* out, const int32_t* positions, const float* inv_freq, float factor);
  void NormRope(const NormRopeArgs& args);
  // NormRope's arguments (the model's rope_dim and eps).
  NormRopeArgs NormRopeArgsOf(int64_t tokens, int64_t heads, int64_t dim, const float* x,
                              const float* weight, float* out, const int32_t* positions,
                              const float* inv_freq, float factor) const;
  // NormRope(first), then NormRope(second): V4Ops::NormRopePair with fused ops where the backend
  // takes the two, else each alone.
  void NormRopePair(const NormRopeArgs& first, const NormRopeArgs& second);
  // The query's per-head norm (no weight) and rope, rounded to bf16 into out: V4Ops::NormRope
  // with out_bf16 (where V4Ops::TakesBf16Attention) of the fp32 rows x or the bf16 rows x_bf16
  // (the other null; out may be x_bf16); false where the backend did not take it.
  bool NormRopeBf16(int64_t tokens, int64_t heads, int64_t dim, const float* x,
                    const uint16_t* x_bf16, uint16_t* out, const int32_t* positions,
                    const float* inv_freq, float factor);
  // The bf16 query of a prefill (V4Ops::TakesBf16Attention, bf16 q_b and index_q_b): q_b of
  // RmsNorm(q_residual) (qr; the norm rounded to bf16 as NormedGemms rounds it) written in bf16
  // where the backend does (Backend::GemmToBf16: the rounding of HF's bf16 q_b), then normed and
  // roped in place into *q16 (else q_b's product in fp32, then NormRopeBf16 from it); the
  // indexer's queries index_q_b of the same normed rows into iq (null: none). False where the
  // backend did not take the NormRope.
  bool QueryBf16(int64_t T, float* qr, const V4AttentionWeights& A, const int32_t* positions,
                 const float* inv_freq, float factor, DeviceBuffer* iq,
                 std::unique_ptr<DeviceBuffer>* q16);
  // One compressor's projection rows [T, row_floats] (kv then gate) as two of NormedGemms'
  // gemms; returns the rows' buffer.
  std::unique_ptr<DeviceBuffer> CompressorRows(int64_t T, const V4CompressorPlan& cp,
                                               const V4CompressorWeights& w,
                                               std::vector<NormedGemm>* gemms);
  // Pools the windows the step closes (per the plan) of one compressor into the stream at
  // `stream`, from the step's projection rows `rows` (CompressorRows) and the compressor ring in
  // the layer's state at `state`, then keeps the step's rows in the ring.
  void Compress(const V4StepContext& ctx, const V4GroupPlan& gp, const V4CompressorPlan& cp,
                float* rows, const V4CompressorWeights& w, float* state, float* stream);
  std::unique_ptr<DeviceBuffer> Floats(int64_t n) {
    return backend_->AllocateScratch(std::max<int64_t>(1, n) * sizeof(float));
  }
  // V4Ops::CopyRows of a plan's moves (none: nothing issued).
  void Move(const V4RowMoves& moves, int64_t width, const float* from, float* to) {
    if (moves.rows > 0) ops_->CopyRows(moves.Args(width, from, to));
  }

  const DeepseekV4Config& config_;
  const DeepseekV4Weights* weights_;
  Backend* backend_;
  V4Ops* ops_;
  const float* ones_;
  bool fused_ops_ = true;
  std::unique_ptr<DeviceBuffer> main_inv_freq_, compress_inv_freq_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_ATTENTION_H_
