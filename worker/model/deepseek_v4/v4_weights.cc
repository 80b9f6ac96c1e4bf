// DeepseekV4Weights loading: HF deepseek_v4 tensor names -> backend buffers.
#include "worker/model/deepseek_v4/v4_weights.h"

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/model/mxfp4_quantize.h"
#include "worker/model/weight_loader.h"

namespace deepinfer {
namespace {

#define V4W_RETURN_IF_ERROR(expr) \
  do {                            \
    absl::Status _st = (expr);    \
    if (!_st.ok()) return _st;    \
  } while (0)

// The V4 loader: WeightLoader's tensors (generated ones made in place by the backend, checkpoint
// ones read and uploaded on LoadOptions::load_threads threads at Finish()) under V4's names.
// Every matrix is dequantised (V4 keeps none FP8) except the routed experts with
// LoadOptions::mxfp4_experts, which stay MXFP4.
class Loader : public WeightLoader {
 public:
  Loader(WeightSource* src, Backend* be, const LoadOptions& options)
      : WeightLoader(src, be, nullptr, UploadOptionsOf(options)) {}
  // A matrix in the backend's weight dtype.
  absl::Status Matrix(const std::string& name, const std::vector<int64_t>& shape,
                      std::unique_ptr<DeviceBuffer>* out) {
    return LoadMatrix(name, shape, out);
  }
  absl::Status Matrix(const std::string& name, const std::vector<int64_t>& shape,
                      MatrixBuffer* out) {
    return LoadMatrix(name, shape, out);
  }
};

// Tensor names of an attention block: HF transformers' (the model's layers) and the DeepSeek-V4
// release's (its MTP modules, which HF does not load or rename).
struct AttentionNames {
  const char *q_a, *q_a_norm, *q_b, *kv, *kv_norm, *o_a, *o_b, *sinks;
  const char* compressor;          // the compressor's prefix
  const char* indexer;             // the indexer's prefix
  const char* indexer_compressor;  // its compressor's prefix, under `indexer`
  const char *index_q_b, *index_weights;
  // A compressor's tensors.
  const char *compress_kv, *compress_gate, *position_bias, *compress_norm;
};

AttentionNames HfAttentionNames() {
  AttentionNames n;
  n.q_a = "q_a_proj.weight";
  n.q_a_norm = "q_a_norm.weight";
  n.q_b = "q_b_proj.weight";
  n.kv = "kv_proj.weight";
  n.kv_norm = "kv_norm.weight";
  n.o_a = "o_a_proj.weight";
  n.o_b = "o_b_proj.weight";
  n.sinks = "sinks";
  n.compressor = "compressor.";
  n.indexer = "compressor.indexer.";
  n.indexer_compressor = "";
  n.index_q_b = "q_b_proj.weight";
  n.index_weights = "scorer.weights_proj.weight";
  n.compress_kv = "kv_proj.weight";
  n.compress_gate = "gate_proj.weight";
  n.position_bias = "position_bias";
  n.compress_norm = "kv_norm.weight";
  return n;
}

AttentionNames ReleaseAttentionNames() {
  AttentionNames n;
  n.q_a = "wq_a.weight";
  n.q_a_norm = "q_norm.weight";
  n.q_b = "wq_b.weight";
  n.kv = "wkv.weight";
  n.kv_norm = "kv_norm.weight";
  n.o_a = "wo_a.weight";
  n.o_b = "wo_b.weight";
  n.sinks = "attn_sink";
  n.compressor = "compressor.";
  n.indexer = "indexer.";
  n.indexer_compressor = "compressor.";
  n.index_q_b = "wq_b.weight";
  n.index_weights = "weights_proj.weight";
  n.compress_kv = "wkv.weight";
  n.compress_gate = "wgate.weight";
  n.position_bias = "ape";
  n.compress_norm = "norm.weight";
  return n;
}

absl::Status LoadCompressor(Loader& ld, const std::string& p, const AttentionNames& n,
                            int64_t hidden, int64_t dim, int64_t ratio, bool overlap,
                            V4CompressorWeights* w) {
  const int64_t width = overlap ? 2 * dim : dim;
  w->dim = dim;
  V4W_RETURN_IF_ERROR(ld.Matrix(p + n.compress_kv, {width, hidden}, &w->kv_proj));
  V4W_RETURN_IF_ERROR(ld.Matrix(p + n.compress_gate, {width, hidden}, &w->gate_proj));
  V4W_RETURN_IF_ERROR(ld.Load(p + n.position_bias, {ratio, width}, &w->position_bias));
  return ld.Load(p + n.compress_norm, {dim}, &w->kv_norm);
}

// An attention block of kind `kind` (compress rate `ratio`) under prefix `a`.
absl::Status LoadAttention(Loader& ld, const DeepseekV4Config& c, const std::string& a,
                           const AttentionNames& n, V4AttentionKind kind, int64_t ratio,
                           V4AttentionWeights* A) {
  const int64_t H = c.hidden_size, D = c.head_dim, NH = c.num_heads, QL = c.q_lora_rank;
  V4W_RETURN_IF_ERROR(ld.Matrix(a + n.q_a, {QL, H}, &A->q_a));
  V4W_RETURN_IF_ERROR(ld.Load(a + n.q_a_norm, {QL}, &A->q_a_norm));
  V4W_RETURN_IF_ERROR(ld.Matrix(a + n.q_b, {NH * D, QL}, &A->q_b));
  V4W_RETURN_IF_ERROR(ld.Matrix(a + n.kv, {D, H}, &A->kv_proj));
  V4W_RETURN_IF_ERROR(ld.Load(a + n.kv_norm, {D}, &A->kv_norm));
  V4W_RETURN_IF_ERROR(
      ld.Matrix(a + n.o_a, {c.o_groups * c.o_lora_rank, NH * D / c.o_groups}, &A->o_a));
  V4W_RETURN_IF_ERROR(ld.Matrix(a + n.o_b, {H, c.o_groups * c.o_lora_rank}, &A->o_b));
  V4W_RETURN_IF_ERROR(ld.Load(a + n.sinks, {NH}, &A->sinks));
  if (kind == V4AttentionKind::kSliding) return absl::OkStatus();
  const bool sparse = kind == V4AttentionKind::kSparse;
  V4W_RETURN_IF_ERROR(LoadCompressor(ld, a + n.compressor, n, H, D, ratio, sparse, &A->compressor));
  if (!sparse) return absl::OkStatus();
  const std::string x = a + n.indexer;
  V4W_RETURN_IF_ERROR(LoadCompressor(ld, x + n.indexer_compressor, n, H, c.index_head_dim, ratio,
                                     true, &A->indexer));
  V4W_RETURN_IF_ERROR(
      ld.Matrix(x + n.index_q_b, {c.index_n_heads * c.index_head_dim, QL}, &A->index_q_b));
  return ld.Matrix(x + n.index_weights, {c.index_n_heads, H}, &A->index_weights);
}

// Bytes LoadAttention allocates.
int64_t AttentionBytes(const DeepseekV4Config& c, V4AttentionKind kind, int64_t ratio, int64_t m) {
  const int64_t f = 4, H = c.hidden_size, D = c.head_dim, NH = c.num_heads, QL = c.q_lora_rank;
  int64_t bytes = (QL * H + NH * D * QL + D * H) * m + (QL + D + NH) * f;
  bytes += (c.o_groups * c.o_lora_rank * NH * D / c.o_groups + H * c.o_groups * c.o_lora_rank) * m;
  if (kind == V4AttentionKind::kSliding) return bytes;
  const bool sparse = kind == V4AttentionKind::kSparse;
  const int64_t width = sparse ? 2 * D : D;
  bytes += 2 * width * H * m + (ratio * width + D) * f;
  if (sparse) {
    const int64_t iw = 2 * c.index_head_dim;
    bytes += 2 * iw * H * m + (ratio * iw + c.index_head_dim) * f;
    bytes += (c.index_n_heads * c.index_head_dim * QL + c.index_n_heads * H) * m;
  }
  return bytes;
}

absl::Status LoadHc(Loader& ld, const std::string& p, const char* fn, const char* base,
                    const char* scale, int64_t rows, int64_t cols, int64_t scales,
                    V4HyperConnectionWeights* w) {
  V4W_RETURN_IF_ERROR(ld.Load(p + fn, {rows, cols}, &w->fn));
  V4W_RETURN_IF_ERROR(ld.Load(p + base, {rows}, &w->base));
  return ld.Load(p + scale, {scales}, &w->scale);
}

// Routed experts of layer `l` whose ids `experts` lists, gate and up stacked [2I, H]; MXFP4 with
// `mxfp4` (LoadOptions::mxfp4_experts).
absl::Status LoadExperts(Loader& ld, const DeepseekV4Config& c, int64_t l,
                         const std::vector<int64_t>& experts, bool mxfp4,
                         std::map<int64_t, MlpWeights>* out) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.n_routed_experts;
  const std::string m = absl::StrCat("model.layers.", l, ".mlp.experts.");
  const bool fused =
      !ld.Generated(m + "gate_up_proj", {E, 2 * I, H}) && ld.source()->Contains(m + "gate_up_proj");
  if (fused && mxfp4) {
    return ld.LoadFusedMxfp4Experts(m + "gate_up_proj", m + "down_proj", E, H, I, experts, out);
  }
  if (fused) {
    ld.LoadFusedExperts(m + "gate_up_proj", m + "down_proj", E, H, I, experts, out);
    return absl::OkStatus();
  }
  for (int64_t e : experts) {
    const std::string p = absl::StrCat(m, e, ".");
    V4W_RETURN_IF_ERROR(mxfp4 ? ld.LoadMxfp4Mlp(p + "gate_proj.weight", p + "up_proj.weight",
                                                p + "down_proj.weight", H, I, &(*out)[e])
                              : ld.LoadMlp(p, H, I, &(*out)[e]));
  }
  return absl::OkStatus();
}

std::vector<int64_t> HostedExperts(const DeepseekV4Config& c, const LoadOptions& o, int64_t l) {
  std::vector<int64_t> hosted;
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    if (!o.hosts_expert || o.hosts_expert(l, e)) hosted.push_back(e);
  }
  return hosted;
}

// A SwiGLU MLP under `p`: gate and up [inter, hidden] stacked into gate_up, down [hidden, inter].
absl::Status LoadMlp(Loader& ld, const std::string& p, const char* gate_name, const char* up_name,
                     const char* down_name, int64_t hidden, int64_t inter, MlpWeights* w) {
  return ld.LoadMlp(p + gate_name, p + up_name, p + down_name, hidden, inter, w);
}

// MTP module i by the release's names (`mtp.<i>.`): the block's norms (attn_norm, ffn_norm),
// hyper-connection sites (hc_attn_*, hc_ffn_*), attention (attn.*), MoE (ffn.gate.weight /
// .bias, ffn.shared_experts.w1 / w3 / w2, ffn.experts.E.w1 / w3 / w2: gate / up / down), then
// e_proj, h_proj, enorm, hnorm, norm and hc_head_{fn,base,scale}.
absl::Status LoadMtp(Loader& ld, const DeepseekV4Config& c, int64_t i, bool mxfp4,
                     V4MtpWeights* w) {
  const int64_t H = c.hidden_size, hc = c.hc_mult, E = c.n_routed_experts;
  const int64_t I = c.moe_intermediate_size;
  const std::string p = absl::StrCat("mtp.", i, ".");
  V4LayerWeights& L = w->block;
  V4W_RETURN_IF_ERROR(ld.Load(p + "attn_norm.weight", {H}, &L.input_norm));
  V4W_RETURN_IF_ERROR(ld.Load(p + "ffn_norm.weight", {H}, &L.post_attention_norm));
  V4W_RETURN_IF_ERROR(LoadHc(ld, p, "hc_attn_fn", "hc_attn_base", "hc_attn_scale", c.hc_mix(),
                             hc * H, 3, &L.attn_hc));
  V4W_RETURN_IF_ERROR(
      LoadHc(ld, p, "hc_ffn_fn", "hc_ffn_base", "hc_ffn_scale", c.hc_mix(), hc * H, 3, &L.ffn_hc));
  V4W_RETURN_IF_ERROR(LoadAttention(ld, c, p + "attn.", ReleaseAttentionNames(), c.mtp_attention[i],
                                    c.mtp_compress_rate[i], &L.attention));
  const std::string m = p + "ffn.";
  LayerWeights& M = w->moe;
  M.moe = true;
  V4W_RETURN_IF_ERROR(ld.Load(m + "gate.weight", {E, H}, &M.router));
  V4W_RETURN_IF_ERROR(ld.Load(m + "gate.bias", {E}, &M.router_bias));
  V4W_RETURN_IF_ERROR(
      LoadMlp(ld, m + "shared_experts.", "w1.weight", "w3.weight", "w2.weight", H, I, &M.shared));
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = absl::StrCat(m, "experts.", e, ".");
    V4W_RETURN_IF_ERROR(
        mxfp4 ? ld.LoadMxfp4Mlp(x + "w1.weight", x + "w3.weight", x + "w2.weight", H, I,
                                &M.experts[e])
              : LoadMlp(ld, x, "w1.weight", "w3.weight", "w2.weight", H, I, &M.experts[e]));
  }
  V4W_RETURN_IF_ERROR(ld.Matrix(p + "e_proj.weight", {H, H}, &w->e_proj));
  V4W_RETURN_IF_ERROR(ld.Matrix(p + "h_proj.weight", {H, H}, &w->h_proj));
  V4W_RETURN_IF_ERROR(ld.Load(p + "enorm.weight", {H}, &w->enorm));
  V4W_RETURN_IF_ERROR(ld.Load(p + "hnorm.weight", {H}, &w->hnorm));
  V4W_RETURN_IF_ERROR(ld.Load(p + "norm.weight", {H}, &w->norm));
  return LoadHc(ld, p, "hc_head_fn", "hc_head_base", "hc_head_scale", hc, hc * H, 1, &w->hc_head);
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeepseekV4Weights>> DeepseekV4Weights::Load(
    const DeepseekV4Config& c, WeightSource* source, Backend* backend, const LoadOptions& options) {
  auto w = std::make_unique<DeepseekV4Weights>();
  Loader ld(source, backend, options);
  const int64_t H = c.hidden_size, V = c.vocab_size, hc = c.hc_mult, I = c.moe_intermediate_size;
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok;
  w->moe.matrix_dtype = backend->weight_dtype();
  V4W_RETURN_IF_ERROR(ld.Load("model.embed_tokens.weight", {V, H}, &w->embed));
  V4W_RETURN_IF_ERROR(ld.Load("model.norm.weight", {H}, &w->final_norm));
  V4W_RETURN_IF_ERROR(ld.Matrix("lm_head.weight", {V, H}, &w->lm_head));
  V4W_RETURN_IF_ERROR(
      LoadHc(ld, "model.hc_head.", "hc_fn", "hc_base", "hc_scale", hc, hc * H, 1, &w->hc_head));
  w->layers.resize(c.num_layers);
  w->moe.layers.resize(c.num_layers);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    V4LayerWeights& L = w->layers[l];
    V4W_RETURN_IF_ERROR(ld.Load(p + "input_layernorm.weight", {H}, &L.input_norm));
    V4W_RETURN_IF_ERROR(
        ld.Load(p + "post_attention_layernorm.weight", {H}, &L.post_attention_norm));
    V4W_RETURN_IF_ERROR(
        LoadHc(ld, p + "attn_hc.", "fn", "base", "scale", c.hc_mix(), hc * H, 3, &L.attn_hc));
    V4W_RETURN_IF_ERROR(
        LoadHc(ld, p + "ffn_hc.", "fn", "base", "scale", c.hc_mix(), hc * H, 3, &L.ffn_hc));
    V4W_RETURN_IF_ERROR(LoadAttention(ld, c, p + "self_attn.", HfAttentionNames(), c.attention[l],
                                      c.compress_rate[l], &L.attention));
    // MoE: router (+ correction bias, or the hash table), shared expert, routed experts.
    const std::string m = p + "mlp.";
    LayerWeights& M = w->moe.layers[l];
    M.moe = true;
    V4W_RETURN_IF_ERROR(ld.Load(m + "gate.weight", {E, H}, &M.router));
    if (c.hash_moe[l]) {
      ld.LoadIndices(m + "gate.tid2eid", {V, K}, E, &L.hash_table);
    } else {
      V4W_RETURN_IF_ERROR(ld.Load(m + "gate.e_score_correction_bias", {E}, &M.router_bias));
    }
    V4W_RETURN_IF_ERROR(LoadMlp(ld, m + "shared_experts.", "gate_proj.weight", "up_proj.weight",
                                "down_proj.weight", H, I, &M.shared));
    V4W_RETURN_IF_ERROR(
        LoadExperts(ld, c, l, HostedExperts(c, options, l), options.mxfp4_experts, &M.experts));
  }
  // The model's checkpoint tensors, then each MTP module's, so that an error of a module's says
  // which.
  V4W_RETURN_IF_ERROR(ld.Finish());
  w->mtp.resize(c.num_draft_layers);
  for (int64_t i = 0; i < c.num_draft_layers; ++i) {
    absl::Status st = LoadMtp(ld, c, i, options.mxfp4_experts, &w->mtp[i]);
    if (st.ok()) st = ld.Finish();
    if (!st.ok()) {
      return absl::Status(
          st.code(), absl::StrCat("DeepSeek-V4 MTP module ", i, " (", c.num_draft_layers,
                                  " asked for of the checkpoint's ", c.num_nextn_predict_layers,
                                  "; 0 loads none): ", st.message()));
    }
  }
  w->moe.device_bytes = ld.bytes();
  return w;
}

int64_t DeepseekV4Weights::DeviceBytes(const DeepseekV4Config& c, WeightDType matrix_dtype,
                                       const LoadOptions& options) {
  const int64_t m = static_cast<int64_t>(WeightDTypeSize(matrix_dtype)), f = 4;
  const int64_t H = c.hidden_size, V = c.vocab_size, hc = c.hc_mult, I = c.moe_intermediate_size;
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok;
  // A block's norms and hyper-connection sites, router and shared expert.
  const int64_t block = 2 * H * f + 2 * (c.hc_mix() * (hc * H + 1) + 3) * f;
  const int64_t moe = E * H * f + 3 * I * H * m;
  // A routed expert: in the matrix dtype, or MXFP4 (LoadOptions::mxfp4_experts).
  const int64_t expert = options.mxfp4_experts ? Mxfp4Bytes(3 * I * H) : 3 * I * H * m;
  int64_t bytes = V * H * f + H * f + V * H * m + (hc * hc * H + hc + 1) * f;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    bytes += block + AttentionBytes(c, c.attention[l], c.compress_rate[l], m) + moe;
    bytes += c.hash_moe[l] ? V * K * 4 : E * f;
    bytes += static_cast<int64_t>(HostedExperts(c, options, l).size()) * expert;
  }
  for (int64_t i = 0; i < c.num_draft_layers; ++i) {
    bytes += block + AttentionBytes(c, c.mtp_attention[i], c.mtp_compress_rate[i], m) + moe;
    bytes += E * f + E * expert;                                      // bias, every routed expert
    bytes += 2 * H * H * m + 3 * H * f + (hc * hc * H + hc + 1) * f;  // e/h_proj, norms, hc head
  }
  return bytes;
}

}  // namespace deepinfer
