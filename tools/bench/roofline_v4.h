// Roofline model of a DeepSeek-V4 step (roofline.h's counterpart for the V4 architecture): the
// bytes a step must read from GPU memory and the FLOPs it must do, from the config alone.
//
// Bytes of a decode step: every non-expert weight (the hyper-connection mixers in fp32, as the
// model keeps them; the embedding one row per token), the routed experts the batch touches, and
// per sequence and layer the cache entries attention reads: the window (up to sliding_window
// keys), then on HCA layers every compressed entry, on CSA layers the indexer's top-k entries
// plus every indexer key it scores. The compressor's pending rows (at most 2 * ratio per layer)
// are left out. FLOPs: 2 per weight a token multiplies through, attention's scores and weighted
// sum over the keys each head sees (2 * head_dim each), the indexer's scores (2 * index_dim per
// head and key).
#ifndef DEEPINFER_TOOLS_BENCH_ROOFLINE_V4_H_
#define DEEPINFER_TOOLS_BENCH_ROOFLINE_V4_H_

#include <cstdint>

#include "tools/bench/roofline.h"
#include "worker/model/deepseek_v4/v4_config.h"

namespace deepinfer {

// total: every weight of the main model (no MTP layers, no hash tables); active_per_token: the
// weights one token multiplies through (top_k routed + shared experts).
ParamCounts CountParamsV4(const DeepseekV4Config& c);

// The keys one query at position `pos` (0-based; it sees positions 0..pos) reads in `layer`:
// window rows, compressed entries attended, indexer keys scored.
struct V4KeysPerQuery {
  double window = 0, compressed = 0, indexer = 0;
};
V4KeysPerQuery KeysPerQueryV4(const DeepseekV4Config& c, int64_t layer, int64_t pos);

// As DecodeStepCost / PrefillStepCost (roofline.h) for a V4 model; the routed experts at
// expert_bytes_per_param bytes a weight (< 0: bytes_per_param), e.g. MXFP4 experts (half a byte
// and a UE8M0 byte per 32) beside bf16 matrices.
StepCost DecodeStepCostV4(const DeepseekV4Config& c, int64_t batch, int64_t context,
                          double bytes_per_param, double cache_bytes_per_value, int64_t ranks = 1,
                          double expert_bytes_per_param = -1);
StepCost PrefillStepCostV4(const DeepseekV4Config& c, int64_t seqs, int64_t len,
                           double bytes_per_param, double cache_bytes_per_value, int64_t ranks = 1,
                           double expert_bytes_per_param = -1);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_BENCH_ROOFLINE_V4_H_
