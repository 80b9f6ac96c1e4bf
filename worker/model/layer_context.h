// LayerContext: what every layer component of a step reads besides its weights and inputs: the
// step's per-token device metadata (positions, cache slots, sequences, context lengths, block
// tables), its cache, the host copy of each sequence's rows, and how the step computes.
#ifndef DEEPINFER_WORKER_MODEL_LAYER_CONTEXT_H_
#define DEEPINFER_WORKER_MODEL_LAYER_CONTEXT_H_

#include <cstdint>
#include <vector>

#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_block_pool.h"

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
  bool fused_ops = true;
  bool bf16_operands = false;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_LAYER_CONTEXT_H_
