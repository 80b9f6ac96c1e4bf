// DeepseekV4Weights loading: HF deepseek_v4 tensor names -> backend buffers.
#include "worker/model/deepseek_v4/v4_weights.h"

#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

#define V4W_RETURN_IF_ERROR(expr) \
  do {                            \
    absl::Status _st = (expr);    \
    if (!_st.ok()) return _st;    \
  } while (0)

int64_t Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

class Loader {
 public:
  Loader(WeightSource* src, Backend* be) : src_(src), be_(be) {}
  int64_t bytes() const { return bytes_; }

  absl::Status Read(const std::string& name, const std::vector<int64_t>& shape,
                    std::vector<float>* out) {
    out->resize(Elements(shape));
    return src_->ReadFloat32(name, shape, out->data());
  }
  std::unique_ptr<DeviceBuffer> Upload(const std::vector<float>& v) {
    auto buf = be_->Allocate(v.size() * sizeof(float));
    be_->CopyToDevice(v.data(), v.size() * sizeof(float), buf->data());
    bytes_ += buf->size_bytes();
    return buf;
  }
  std::unique_ptr<DeviceBuffer> UploadMatrix(const std::vector<float>& v) {
    auto buf = be_->UploadWeight(v.data(), static_cast<int64_t>(v.size()));
    bytes_ += buf->size_bytes();
    return buf;
  }
  // fp32 (matrix = false) or in the backend's weight dtype.
  absl::Status Load(const std::string& name, const std::vector<int64_t>& shape,
                    std::unique_ptr<DeviceBuffer>* out, bool matrix = false) {
    const WeightDType dtype = matrix ? be_->weight_dtype() : WeightDType::kFloat32;
    if (std::optional<DummyFill> fill = src_->DummyFillFor(name, shape)) {
      auto buf = be_->Allocate(static_cast<size_t>(Elements(shape)) * WeightDTypeSize(dtype));
      be_->FillDummy(*fill, Elements(shape), dtype, buf->data());
      bytes_ += buf->size_bytes();
      *out = std::move(buf);
      return absl::OkStatus();
    }
    std::vector<float> host;
    V4W_RETURN_IF_ERROR(Read(name, shape, &host));
    *out = matrix ? UploadMatrix(host) : Upload(host);
    return absl::OkStatus();
  }
  absl::Status Matrix(const std::string& name, const std::vector<int64_t>& shape,
                      std::unique_ptr<DeviceBuffer>* out) {
    return Load(name, shape, out, true);
  }
  // An MLP matrix, dequantised (LoadOptions::keep_fp8 is not honoured for V4).
  absl::Status Matrix(const std::string& name, const std::vector<int64_t>& shape,
                      MatrixBuffer* out) {
    *out = MatrixBuffer();
    return Load(name, shape, &out->data, true);
  }
  bool dummy(const std::string& name, const std::vector<int64_t>& shape) const {
    return src_->DummyFillFor(name, shape).has_value();
  }
  WeightSource* source() const { return src_; }

 private:
  WeightSource* src_;
  Backend* be_;
  int64_t bytes_ = 0;
};

absl::Status LoadCompressor(Loader& ld, const std::string& p, int64_t hidden, int64_t dim,
                            int64_t ratio, bool overlap, V4CompressorWeights* w) {
  const int64_t width = overlap ? 2 * dim : dim;
  w->dim = dim;
  V4W_RETURN_IF_ERROR(ld.Matrix(p + "kv_proj.weight", {width, hidden}, &w->kv_proj));
  V4W_RETURN_IF_ERROR(ld.Matrix(p + "gate_proj.weight", {width, hidden}, &w->gate_proj));
  V4W_RETURN_IF_ERROR(ld.Load(p + "position_bias", {ratio, width}, &w->position_bias));
  return ld.Load(p + "kv_norm.weight", {dim}, &w->kv_norm);
}

absl::Status LoadHc(Loader& ld, const std::string& p, const char* fn, const char* base,
                    const char* scale, int64_t rows, int64_t cols, int64_t scales,
                    V4HyperConnectionWeights* w) {
  V4W_RETURN_IF_ERROR(ld.Load(p + fn, {rows, cols}, &w->fn));
  V4W_RETURN_IF_ERROR(ld.Load(p + base, {rows}, &w->base));
  return ld.Load(p + scale, {scales}, &w->scale);
}

// Routed experts of layer `l` whose ids `experts` lists, gate and up stacked [2I, H].
absl::Status LoadExperts(Loader& ld, const DeepseekV4Config& c, int64_t l,
                         const std::vector<int64_t>& experts, std::map<int64_t, MlpWeights>* out) {
  const int64_t H = c.hidden_size, I = c.moe_intermediate_size, E = c.n_routed_experts;
  const std::string m = absl::StrCat("model.layers.", l, ".mlp.experts.");
  const bool fused =
      !ld.dummy(m + "gate_up_proj", {E, 2 * I, H}) && ld.source()->Contains(m + "gate_up_proj");
  if (fused) {
    std::vector<float> gate_up, down;
    V4W_RETURN_IF_ERROR(ld.Read(m + "gate_up_proj", {E, 2 * I, H}, &gate_up));
    V4W_RETURN_IF_ERROR(ld.Read(m + "down_proj", {E, H, I}, &down));
    for (int64_t e : experts) {
      MlpWeights w;
      w.inter = I;
      w.gate_up = ld.UploadMatrix(std::vector<float>(gate_up.begin() + e * 2 * I * H,
                                                     gate_up.begin() + (e + 1) * 2 * I * H));
      w.down = ld.UploadMatrix(
          std::vector<float>(down.begin() + e * H * I, down.begin() + (e + 1) * H * I));
      (*out)[e] = std::move(w);
    }
    return absl::OkStatus();
  }
  for (int64_t e : experts) {
    const std::string p = absl::StrCat(m, e, ".");
    MlpWeights w;
    w.inter = I;
    std::vector<float> gate, up, gate_up;
    V4W_RETURN_IF_ERROR(ld.Read(p + "gate_proj.weight", {I, H}, &gate));
    V4W_RETURN_IF_ERROR(ld.Read(p + "up_proj.weight", {I, H}, &up));
    gate_up = std::move(gate);
    gate_up.insert(gate_up.end(), up.begin(), up.end());
    w.gate_up = ld.UploadMatrix(gate_up);
    V4W_RETURN_IF_ERROR(ld.Matrix(p + "down_proj.weight", {H, I}, &w.down));
    (*out)[e] = std::move(w);
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

}  // namespace

absl::StatusOr<std::unique_ptr<DeepseekV4Weights>> DeepseekV4Weights::Load(
    const DeepseekV4Config& c, WeightSource* source, Backend* backend, const LoadOptions& options) {
  auto w = std::make_unique<DeepseekV4Weights>();
  Loader ld(source, backend);
  const int64_t H = c.hidden_size, V = c.vocab_size, hc = c.hc_mult, D = c.head_dim;
  const int64_t NH = c.num_heads, QL = c.q_lora_rank, I = c.moe_intermediate_size;
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
    const std::string a = p + "self_attn.";
    V4AttentionWeights& A = L.attention;
    V4W_RETURN_IF_ERROR(ld.Matrix(a + "q_a_proj.weight", {QL, H}, &A.q_a));
    V4W_RETURN_IF_ERROR(ld.Load(a + "q_a_norm.weight", {QL}, &A.q_a_norm));
    V4W_RETURN_IF_ERROR(ld.Matrix(a + "q_b_proj.weight", {NH * D, QL}, &A.q_b));
    V4W_RETURN_IF_ERROR(ld.Matrix(a + "kv_proj.weight", {D, H}, &A.kv_proj));
    V4W_RETURN_IF_ERROR(ld.Load(a + "kv_norm.weight", {D}, &A.kv_norm));
    V4W_RETURN_IF_ERROR(ld.Matrix(a + "o_a_proj.weight",
                                  {c.o_groups * c.o_lora_rank, NH * D / c.o_groups}, &A.o_a));
    V4W_RETURN_IF_ERROR(ld.Matrix(a + "o_b_proj.weight", {H, c.o_groups * c.o_lora_rank}, &A.o_b));
    V4W_RETURN_IF_ERROR(ld.Load(a + "sinks", {NH}, &A.sinks));
    if (c.compressed(l)) {
      const bool sparse = c.attention[l] == V4AttentionKind::kSparse;
      V4W_RETURN_IF_ERROR(
          LoadCompressor(ld, a + "compressor.", H, D, c.compress_rate[l], sparse, &A.compressor));
      if (sparse) {
        const std::string x = a + "compressor.indexer.";
        V4W_RETURN_IF_ERROR(
            LoadCompressor(ld, x, H, c.index_head_dim, c.compress_rate[l], true, &A.indexer));
        V4W_RETURN_IF_ERROR(ld.Matrix(x + "q_b_proj.weight",
                                      {c.index_n_heads * c.index_head_dim, QL}, &A.index_q_b));
        V4W_RETURN_IF_ERROR(
            ld.Matrix(x + "scorer.weights_proj.weight", {c.index_n_heads, H}, &A.index_weights));
      }
    }
    // MoE: router (+ correction bias, or the hash table), shared expert, routed experts.
    const std::string m = p + "mlp.";
    LayerWeights& M = w->moe.layers[l];
    M.moe = true;
    V4W_RETURN_IF_ERROR(ld.Load(m + "gate.weight", {E, H}, &M.router));
    if (c.hash_moe[l]) {
      std::vector<int32_t> ids(V * K);
      V4W_RETURN_IF_ERROR(source->ReadIndices(m + "gate.tid2eid", {V, K}, E, ids.data()));
      L.hash_table = backend->Allocate(ids.size() * sizeof(int32_t));
      backend->CopyToDevice(ids.data(), ids.size() * sizeof(int32_t), L.hash_table->data());
    } else {
      V4W_RETURN_IF_ERROR(ld.Load(m + "gate.e_score_correction_bias", {E}, &M.router_bias));
    }
    M.shared.inter = I;
    {
      std::vector<float> gate, up;
      const std::string s = m + "shared_experts.";
      V4W_RETURN_IF_ERROR(ld.Read(s + "gate_proj.weight", {I, H}, &gate));
      V4W_RETURN_IF_ERROR(ld.Read(s + "up_proj.weight", {I, H}, &up));
      gate.insert(gate.end(), up.begin(), up.end());
      M.shared.gate_up = ld.UploadMatrix(gate);
      V4W_RETURN_IF_ERROR(ld.Matrix(s + "down_proj.weight", {H, I}, &M.shared.down));
    }
    V4W_RETURN_IF_ERROR(LoadExperts(ld, c, l, HostedExperts(c, options, l), &M.experts));
  }
  w->moe.device_bytes = ld.bytes();
  return w;
}

int64_t DeepseekV4Weights::DeviceBytes(const DeepseekV4Config& c, WeightDType matrix_dtype,
                                       const LoadOptions& options) {
  const int64_t m = static_cast<int64_t>(WeightDTypeSize(matrix_dtype)), f = 4;
  const int64_t H = c.hidden_size, V = c.vocab_size, hc = c.hc_mult, D = c.head_dim;
  const int64_t NH = c.num_heads, QL = c.q_lora_rank, I = c.moe_intermediate_size;
  const int64_t E = c.n_routed_experts, K = c.num_experts_per_tok;
  int64_t bytes = V * H * f + H * f + V * H * m + (hc * hc * H + hc + 1) * f;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    bytes += 2 * H * f + 2 * (c.hc_mix() * (hc * H + 1) + 3) * f;
    bytes += (QL * H + NH * D * QL + D * H) * m + (QL + D + NH) * f;
    bytes +=
        (c.o_groups * c.o_lora_rank * NH * D / c.o_groups + H * c.o_groups * c.o_lora_rank) * m;
    if (c.compressed(l)) {
      const bool sparse = c.attention[l] == V4AttentionKind::kSparse;
      const int64_t width = sparse ? 2 * D : D;
      bytes += 2 * width * H * m + (c.compress_rate[l] * width + D) * f;
      if (sparse) {
        const int64_t iw = 2 * c.index_head_dim;
        bytes += 2 * iw * H * m + (c.compress_rate[l] * iw + c.index_head_dim) * f;
        bytes += (c.index_n_heads * c.index_head_dim * QL + c.index_n_heads * H) * m;
      }
    }
    bytes += E * H * f + (c.hash_moe[l] ? V * K * 4 : E * f) + 3 * I * H * m;
    bytes += static_cast<int64_t>(HostedExperts(c, options, l).size()) * 3 * I * H * m;
  }
  return bytes;
}

}  // namespace deepinfer
