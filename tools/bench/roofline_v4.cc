#include "tools/bench/roofline_v4.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {
namespace {

// Parameters of one layer's attention: projections, norms, sinks, the compressor (and on CSA
// layers the indexer with its own compressor, query projection and head weights).
double AttentionParamsV4(const DeepseekV4Config& c, int64_t layer) {
  const double H = c.hidden_size, D = c.head_dim, heads = c.num_heads, ql = c.q_lora_rank;
  double p = ql * H + ql + heads * D * ql  // q_a, q_a_norm, q_b
             + D * H + D                   // kv_proj, kv_norm
             + c.o_lora_rank * heads * D   // o_a: o_groups blocks of [o_lora, heads * D / groups]
             + H * c.o_groups * c.o_lora_rank  // o_b
             + heads + 2 * H;                  // sinks, the two layer norms
  if (c.compressed(layer)) {
    const bool sparse = c.attention[layer] == V4AttentionKind::kSparse;
    const double ratio = c.compress_rate[layer];
    const double w = sparse ? 2 * D : D;
    p += 2 * w * H + ratio * w + D;
    if (sparse) {
      const double di = c.index_head_dim, hi = c.index_n_heads, wi = 2 * di;
      p += 2 * wi * H + ratio * wi + di + hi * di * ql + hi * H;
    }
  }
  return p;
}

// fp32 hyper-connection parameters of one layer (two sites) and of the head.
double HcParamsPerLayer(const DeepseekV4Config& c) {
  const double mix = c.hc_mix();
  return 2 * (mix * c.hc_mult * c.hidden_size + mix + 3);
}
double HcHeadParams(const DeepseekV4Config& c) {
  return static_cast<double>(c.hc_mult) * c.hc_mult * c.hidden_size + c.hc_mult + 1;
}

// Attention FLOPs of one query at `pos` over all layers.
double AttentionFlopsV4(const DeepseekV4Config& c, int64_t pos) {
  double f = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const V4KeysPerQuery k = KeysPerQueryV4(c, l, pos);
    f += c.num_heads * (k.window + k.compressed) * 4.0 * c.head_dim +
         c.index_n_heads * k.indexer * 2.0 * c.index_head_dim;
  }
  return f;
}

// Cache values one query at `pos` reads over all layers.
double CacheValuesReadV4(const DeepseekV4Config& c, int64_t pos) {
  double v = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const V4KeysPerQuery k = KeysPerQueryV4(c, l, pos);
    v += (k.window + k.compressed) * c.head_dim + k.indexer * c.index_head_dim;
  }
  return v;
}

// Cache values one token writes over all layers: its window row, and its share of a compressed
// entry (and of an indexer key on CSA layers).
double CacheValuesWrittenV4(const DeepseekV4Config& c) {
  double v = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    v += c.head_dim;
    if (!c.compressed(l)) continue;
    v += static_cast<double>(c.head_dim) / c.compress_rate[l];
    if (c.attention[l] == V4AttentionKind::kSparse) {
      v += static_cast<double>(c.index_head_dim) / c.compress_rate[l];
    }
  }
  return v;
}

}  // namespace

V4KeysPerQuery KeysPerQueryV4(const DeepseekV4Config& c, int64_t layer, int64_t pos) {
  V4KeysPerQuery k;
  k.window = static_cast<double>(std::min<int64_t>(pos + 1, c.sliding_window));
  if (!c.compressed(layer)) return k;
  const double entries = static_cast<double>((pos + 1) / c.compress_rate[layer]);
  if (c.attention[layer] == V4AttentionKind::kSparse) {
    k.compressed = std::min<double>(entries, static_cast<double>(c.index_topk));
    k.indexer = entries;
  } else {
    k.compressed = entries;
  }
  return k;
}

ParamCounts CountParamsV4(const DeepseekV4Config& c) {
  ParamCounts p;
  const double H = c.hidden_size, E = c.n_routed_experts;
  p.embedding = static_cast<double>(c.vocab_size) * H;
  p.per_routed_expert = 3.0 * H * c.moe_intermediate_size;
  const double lm_head = p.embedding;
  p.total = p.embedding + lm_head + H + HcHeadParams(c);
  p.active_per_token = lm_head + H + HcHeadParams(c);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const double dense = AttentionParamsV4(c, l) + HcParamsPerLayer(c) + E * H + E +
                         c.n_shared_experts * p.per_routed_expert;
    ++p.moe_layers;
    p.total += dense + E * p.per_routed_expert;
    p.active_per_token += dense + c.num_experts_per_tok * p.per_routed_expert;
  }
  return p;
}

StepCost DecodeStepCostV4(const DeepseekV4Config& c, int64_t batch, int64_t context,
                          double bytes_per_param, double cache_bytes_per_value, int64_t ranks,
                          double expert_bytes_per_param) {
  const ParamCounts p = CountParamsV4(c);
  const double expert_bytes = expert_bytes_per_param < 0 ? bytes_per_param : expert_bytes_per_param;
  const double E = c.n_routed_experts, k = c.num_experts_per_tok;
  const double tokens = static_cast<double>(batch) * ranks;
  const double touched = E > 0 ? E * (1.0 - std::pow(1.0 - k / E, tokens)) / ranks : 0;
  const double routed_all = p.moe_layers * E * p.per_routed_expert;
  const double hc = c.num_layers * HcParamsPerLayer(c) + HcHeadParams(c);
  const double matrices = p.total - routed_all - p.embedding - hc;
  StepCost s;
  s.bytes = (matrices + batch * static_cast<double>(c.hidden_size)) * bytes_per_param +
            p.moe_layers * touched * p.per_routed_expert * expert_bytes + hc * 4.0 +
            batch * CacheValuesReadV4(c, context) * cache_bytes_per_value;
  s.flops = batch * (2.0 * p.active_per_token + AttentionFlopsV4(c, context));
  return s;
}

StepCost PrefillStepCostV4(const DeepseekV4Config& c, int64_t seqs, int64_t len,
                           double bytes_per_param, double cache_bytes_per_value, int64_t ranks,
                           double expert_bytes_per_param) {
  const ParamCounts p = CountParamsV4(c);
  const double expert_bytes = expert_bytes_per_param < 0 ? bytes_per_param : expert_bytes_per_param;
  const double tokens = static_cast<double>(seqs) * len;
  const double routed_all =
      p.moe_layers * static_cast<double>(c.n_routed_experts) * p.per_routed_expert;
  const double hc = c.num_layers * HcParamsPerLayer(c) + HcHeadParams(c);
  StepCost s;
  // This GPU's 1 / ranks of the routed experts, every other weight.
  s.bytes = (p.total - p.embedding - routed_all - hc + tokens * c.hidden_size) * bytes_per_param +
            routed_all / ranks * expert_bytes + hc * 4.0 +
            tokens * CacheValuesWrittenV4(c) * cache_bytes_per_value;
  double attention = 0;
  for (int64_t pos = 0; pos < len; ++pos) attention += AttentionFlopsV4(c, pos);
  const double lm_head = p.embedding;
  s.flops = 2.0 * tokens * (p.active_per_token - lm_head) + 2.0 * seqs * lm_head + seqs * attention;
  return s;
}

}  // namespace deepinfer
