// Roofline model of a DeepSeek-V3-architecture step, from the config alone: how many bytes a
// step must read from GPU memory (weights touched + latent KV cache) and how many FLOPs it must
// do, so the benchmark can report measured times as a fraction of what the hardware allows
// (bytes / 4.3 TB/s and FLOPs / 790 TFLOP/s on an H200, docs/DEVICE.md).
#ifndef DEEPINFER_TOOLS_BENCH_ROOFLINE_H_
#define DEEPINFER_TOOLS_BENCH_ROOFLINE_H_

#include <cstdint>

#include "worker/model/model_config.h"

namespace deepinfer {

struct ParamCounts {
  double total = 0;             // every weight of the main model (no MTP layers)
  double active_per_token = 0;  // what one token multiplies through (top_k + shared experts)
  double embedding = 0;         // vocab x hidden (read one row per token)
  double per_routed_expert = 0;
  int64_t moe_layers = 0;
};

ParamCounts CountParams(const ModelConfig& c);

struct StepCost {
  double bytes = 0;
  double flops = 0;
  // max(bytes / bandwidth, flops / peak): the shortest time the step could take.
  double RooflineSeconds(double bytes_per_s, double flops_per_s) const;
};

// A decode step of `batch` sequences, each with `context` cached tokens, weights of
// `bytes_per_param` bytes and cache entries of `cache_bytes_per_value` bytes per value (the
// KvBlockPool's dtype): all non-expert weights (embedding: one row per sequence), the
// expected number of distinct routed experts that `batch` tokens touch under uniform routing,
// and the cache entries of every sequence in every layer.
// With `ranks` > 1, one GPU's share of an expert-parallel step where each of `ranks` GPUs runs
// `batch` sequences (data-parallel attention) and 1 / ranks of the routed experts: all
// non-expert weights, its share of the distinct experts that ranks * batch tokens touch, and
// its own sequences' cache; FLOPs of its own `batch` tokens (the expert rows it computes for
// others balance, on average, the ones others compute for it).
StepCost DecodeStepCost(const ModelConfig& c, int64_t batch, int64_t context,
                        double bytes_per_param, double cache_bytes_per_value, int64_t ranks = 1);

// The form of MLA attention a step runs, which sets its attention FLOPs per (query, key) pair
// and head: absorbed, 2 * (kv_lora + rope) for the scores and 2 * kv_lora for the latent sum;
// non-absorbed (prefill, PrefillAttention::kMha), 2 * (nope + rope) and
// 2 * v. Both forms multiply each token once through kv_b's parameters (absorbed: W_uk into the
// query, W_uv out of the latent; non-absorbed: expanding the token's key), so the dense count is
// the same.
enum class MlaForm { kAbsorbed, kNonAbsorbed };

// A prefill step of `seqs` prompts of `len` tokens each (causal attention in `form`); with
// `ranks` > 1, one GPU's share as above (every expert is touched: 1 / ranks of them each).
StepCost PrefillStepCost(const ModelConfig& c, int64_t seqs, int64_t len, double bytes_per_param,
                         double cache_bytes_per_value, int64_t ranks = 1,
                         MlaForm form = MlaForm::kAbsorbed);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_BENCH_ROOFLINE_H_
