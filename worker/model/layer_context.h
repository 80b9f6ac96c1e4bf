// LayerContext: what every layer component of a step reads besides its weights and inputs: the
// step's per-token device metadata (positions, cache slots, sequences, context lengths, block
// tables), its cache, the host copy of each sequence's rows, and how the step computes.
// StepMetadata builds one from a Step's batch (a decode graph's step builds its own from the
// graph's fixed buffers).
#ifndef DEEPINFER_WORKER_MODEL_LAYER_CONTEXT_H_
#define DEEPINFER_WORKER_MODEL_LAYER_CONTEXT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/backend/ops/op_mode.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/step_batch.h"

namespace deepinfer {

struct LayerContext {
  int64_t num_tokens = 0;
  // Device int32 arrays: per token, then block tables [sequences, max_blocks_per_seq].
  const int32_t* positions = nullptr;
  const int32_t* slots = nullptr;
  const int32_t* token_seq = nullptr;
  const int32_t* context_len = nullptr;
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  KvBlockPool* cache = nullptr;
  std::vector<MlaSequenceSpan> spans;  // host copy of each sequence's rows, for MlaAttention
  // Device int32: how many (token, expert) pairs EPLB counts (a padded step's real tokens x
  // top_k); null: all of them.
  const int32_t* counted_pairs = nullptr;
  // Routed experts only through Backend::RoutedExperts (a recorded step cannot go through the
  // dispatcher, which needs the host): FAILED_PRECONDITION where that path refuses.
  bool device_only = false;
  // MlaAttentionArgs::max_context_hint (a recorded step: its context class's bound; 0: spans).
  int32_t max_context_hint = 0;
  // How this step computes (never what): fused ops (CausalLm::SetFusedOps), and with them and
  // bf16 weights, GEMM operands handed over in bf16.
  OpMode mode;
};

// A Step batch's device metadata: ctx points into the buffers held here.
struct StepMetadata {
  LayerContext ctx;
  std::unique_ptr<DeviceBuffer> ids;  // int32 [tokens], the new tokens in batch order
  // int32 [logit_rows]: the token rows whose logits are wanted (every row of an all_logits
  // sequence, else its last), in batch order.
  std::unique_ptr<DeviceBuffer> logit_rows;
  int64_t num_logit_rows = 0;
  std::unique_ptr<DeviceBuffer> positions, slots, token_seq, context_len, block_tables;
};

// Checks the batch against the cache and the vocabulary (INVALID_ARGUMENT naming the sequence
// and what is wrong) and uploads its metadata. ctx.mode is left for the caller.
absl::StatusOr<std::unique_ptr<StepMetadata>> MakeStepMetadata(
    Backend* backend, const std::vector<SequenceStep>& batch, KvBlockPool* cache,
    int64_t vocab_size);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_LAYER_CONTEXT_H_
