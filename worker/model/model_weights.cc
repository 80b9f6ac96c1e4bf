// ModelWeights loading: DeepSeek-V3 checkpoint names -> backend buffers.
#include "worker/model/model_weights.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

int64_t CeilBlocks(int64_t n) { return (n + 127) / 128; }
// The device scale rows' stride for `cols` columns: the block count rounded up to 4 (the CUDA
// kernels' kernels::Fp8ScaleLd; cuBLASLt's 128 x 128 block scaling needs a multiple of 4), the
// padding columns zero.
int64_t Fp8ScaleStride(int64_t cols) { return (CeilBlocks(cols) + 3) / 4 * 4; }

class Loader {
 public:
  Loader(WeightSource* src, Backend* be, std::function<bool(const std::string&)> keep_fp8 = nullptr)
      : src_(src), be_(be), keep_fp8_(std::move(keep_fp8)) {}
  int64_t bytes() const { return bytes_; }
  static int64_t Elements(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }

  absl::Status ReadHost(const std::string& name, const std::vector<int64_t>& shape,
                        std::vector<float>* out) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    out->resize(n);
    return src_->ReadFloat32(name, shape, out->data());
  }
  // A generated (dummy-format) tensor of n elements made in place by the backend, as dtype.
  std::unique_ptr<DeviceBuffer> Fill(const DummyFill& fill, int64_t n, WeightDType dtype) {
    auto buf = be_->Allocate(static_cast<size_t>(n) * WeightDTypeSize(dtype));
    be_->FillDummy(fill, n, dtype, buf->data());
    bytes_ += buf->size_bytes();
    return buf;
  }
  // fp32 (vectors, embedding, router).
  std::unique_ptr<DeviceBuffer> Upload(const std::vector<float>& v) {
    auto buf = be_->Allocate(v.size() * sizeof(float));
    be_->CopyToDevice(v.data(), v.size() * sizeof(float), buf->data());
    bytes_ += buf->size_bytes();
    return buf;
  }
  // In the backend's weight dtype.
  std::unique_ptr<DeviceBuffer> UploadMatrix(const std::vector<float>& v) {
    auto buf = be_->UploadWeight(v.data(), static_cast<int64_t>(v.size()));
    bytes_ += buf->size_bytes();
    return buf;
  }
  absl::Status Load(const std::string& name, const std::vector<int64_t>& shape,
                    std::unique_ptr<DeviceBuffer>* out) {
    if (std::optional<DummyFill> fill = src_->DummyFillFor(name, shape)) {
      *out = Fill(*fill, Elements(shape), WeightDType::kFloat32);
      return absl::OkStatus();
    }
    std::vector<float> host;
    absl::Status st = ReadHost(name, shape, &host);
    if (!st.ok()) return st;
    *out = Upload(host);
    return absl::OkStatus();
  }
  absl::Status LoadMatrix(const std::string& name, const std::vector<int64_t>& shape,
                          std::unique_ptr<DeviceBuffer>* out) {
    if (std::optional<DummyFill> fill = src_->DummyFillFor(name, shape)) {
      *out = Fill(*fill, Elements(shape), be_->weight_dtype());
      return absl::OkStatus();
    }
    std::vector<float> host;
    absl::Status st = ReadHost(name, shape, &host);
    if (!st.ok()) return st;
    *out = UploadMatrix(host);
    return absl::OkStatus();
  }
  // FP8 bytes as they are stored and their scales' rows (ceil(cols / 128) each) with the
  // stride Fp8ScaleStride(cols).
  MatrixBuffer UploadFp8(const std::vector<uint8_t>& data, const std::vector<float>& scales,
                         int64_t cols, int64_t split_rows) {
    MatrixBuffer m;
    m.data = be_->Allocate(data.size());
    be_->CopyToDevice(data.data(), data.size(), m.data->data());
    const int64_t blocks = CeilBlocks(cols), stride = Fp8ScaleStride(cols);
    const int64_t rows = static_cast<int64_t>(scales.size()) / blocks;
    std::vector<float> padded(rows * stride, 0.0f);
    for (int64_t r = 0; r < rows; ++r) {
      std::copy(scales.begin() + r * blocks, scales.begin() + (r + 1) * blocks,
                padded.begin() + r * stride);
    }
    m.fp8_scales = Upload(padded);
    m.scale_ld = stride;
    m.split_rows = split_rows;
    bytes_ += m.data->size_bytes();
    return m;
  }
  // The stored FP8 tensor where keep_fp8 names it and the source has it (nullopt otherwise).
  absl::StatusOr<std::optional<WeightSource::Fp8Tensor>> ReadFp8(
      const std::string& name, const std::vector<int64_t>& shape) {
    if (!keep_fp8_ || !keep_fp8_(name)) return std::nullopt;
    return src_->ReadFp8(name, shape);
  }
  absl::Status LoadMatrix(const std::string& name, const std::vector<int64_t>& shape,
                          MatrixBuffer* out) {
    auto fp8 = ReadFp8(name, shape);
    if (!fp8.ok()) return fp8.status();
    if (fp8->has_value()) {
      *out = UploadFp8((*fp8)->data, (*fp8)->scales, shape[1], 0);
      return absl::OkStatus();
    }
    *out = MatrixBuffer();
    return LoadMatrix(name, shape, &out->data);
  }
  // prefix: "...mlp." or "...experts.7."; gate and up stacked into one [2*inter, hidden] matrix
  // (FP8 where both are kept FP8: the bytes and the scale grids stacked, split at inter rows).
  absl::Status LoadMlp(const std::string& prefix, int64_t hidden, int64_t inter, MlpWeights* m) {
    auto gate8 = ReadFp8(prefix + "gate_proj.weight", {inter, hidden});
    if (!gate8.ok()) return gate8.status();
    if (gate8->has_value()) {
      auto up8 = ReadFp8(prefix + "up_proj.weight", {inter, hidden});
      if (!up8.ok()) return up8.status();
      if (up8->has_value()) {
        WeightSource::Fp8Tensor& g = **gate8;
        const WeightSource::Fp8Tensor& u = **up8;
        g.data.insert(g.data.end(), u.data.begin(), u.data.end());
        g.scales.insert(g.scales.end(), u.scales.begin(), u.scales.end());
        m->inter = inter;
        m->gate_up = UploadFp8(g.data, g.scales, hidden, inter);
        return LoadMatrix(prefix + "down_proj.weight", {hidden, inter}, &m->down);
      }
    }
    const std::optional<DummyFill> gate_fill =
        src_->DummyFillFor(prefix + "gate_proj.weight", {inter, hidden});
    const std::optional<DummyFill> up_fill =
        src_->DummyFillFor(prefix + "up_proj.weight", {inter, hidden});
    if (gate_fill && up_fill) {  // [gate; up] made in place, each with its own recipe
      const WeightDType dtype = be_->weight_dtype();
      const int64_t half = inter * hidden;
      m->inter = inter;
      m->gate_up = be_->Allocate(static_cast<size_t>(2 * half) * WeightDTypeSize(dtype));
      be_->FillDummy(*gate_fill, half, dtype, m->gate_up->data());
      be_->FillDummy(*up_fill, half, dtype,
                     static_cast<char*>(m->gate_up->data()) +
                         half * static_cast<int64_t>(WeightDTypeSize(dtype)));
      bytes_ += m->gate_up->size_bytes();
      return LoadMatrix(prefix + "down_proj.weight", {hidden, inter}, &m->down);
    }
    std::vector<float> gate, up;
    absl::Status st = ReadHost(prefix + "gate_proj.weight", {inter, hidden}, &gate);
    if (!st.ok()) return st;
    st = ReadHost(prefix + "up_proj.weight", {inter, hidden}, &up);
    if (!st.ok()) return st;
    gate.insert(gate.end(), up.begin(), up.end());
    m->inter = inter;
    m->gate_up = UploadMatrix(gate);
    return LoadMatrix(prefix + "down_proj.weight", {hidden, inter}, &m->down);
  }

 private:
  WeightSource* src_;
  Backend* be_;
  const std::function<bool(const std::string&)> keep_fp8_;
  int64_t bytes_ = 0;
};

#define DI_RETURN_IF_ERROR(expr) \
  do {                           \
    absl::Status _st = (expr);   \
    if (!_st.ok()) return _st;   \
  } while (0)

}  // namespace

absl::StatusOr<std::unique_ptr<ModelWeights>> ModelWeights::Load(const ModelConfig& c,
                                                                 WeightSource* source,
                                                                 Backend* backend,
                                                                 const LoadOptions& options) {
  Loader ld(source, backend, options.keep_fp8);
  auto w = std::make_unique<ModelWeights>();
  w->matrix_dtype = backend->weight_dtype();
  const int64_t hid = c.hidden_size, nh = c.num_attention_heads;
  const int64_t nope = c.qk_nope_head_dim, rope = c.qk_rope_head_dim, vd = c.v_head_dim;
  const int64_t kvl = c.kv_lora_rank;
  DI_RETURN_IF_ERROR(ld.Load("model.embed_tokens.weight", {c.vocab_size, hid}, &w->embed));
  DI_RETURN_IF_ERROR(ld.Load("model.norm.weight", {hid}, &w->final_norm));
  DI_RETURN_IF_ERROR(
      ld.LoadMatrix(c.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
                    {c.vocab_size, hid}, &w->lm_head));
  if (c.num_draft_layers < 0 || c.num_draft_layers > c.num_nextn_predict_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_draft_layers ", c.num_draft_layers, " is not within the model's ",
                     c.num_nextn_predict_layers, " MTP layers (num_nextn_predict_layers)"));
  }
  // Layers >= num_hidden_layers are MTP modules; the first num_draft_layers are loaded.
  const int64_t num_layers = c.num_hidden_layers + c.num_draft_layers;
  w->layers.resize(num_layers);
  w->mtp.resize(c.num_draft_layers);
  for (int64_t l = 0; l < num_layers; ++l) {
    LayerWeights& L = w->layers[l];
    const bool is_mtp = l >= c.num_hidden_layers;
    const std::string p = absl::StrCat("model.layers.", l, ".");
    if (is_mtp) {
      MtpWeights& M = w->mtp[l - c.num_hidden_layers];
      DI_RETURN_IF_ERROR(ld.Load(p + "enorm.weight", {hid}, &M.enorm));
      DI_RETURN_IF_ERROR(ld.Load(p + "hnorm.weight", {hid}, &M.hnorm));
      DI_RETURN_IF_ERROR(ld.LoadMatrix(p + "eh_proj.weight", {hid, 2 * hid}, &M.eh_proj));
      DI_RETURN_IF_ERROR(ld.Load(p + "shared_head.norm.weight", {hid}, &M.head_norm));
    }
    DI_RETURN_IF_ERROR(ld.Load(p + "input_layernorm.weight", {hid}, &L.input_norm));
    DI_RETURN_IF_ERROR(
        ld.Load(p + "post_attention_layernorm.weight", {hid}, &L.post_attention_norm));
    const std::string a = p + "self_attn.";
    if (c.q_lora_rank > 0) {
      DI_RETURN_IF_ERROR(ld.LoadMatrix(a + "q_a_proj.weight", {c.q_lora_rank, hid}, &L.q_a));
      DI_RETURN_IF_ERROR(ld.Load(a + "q_a_layernorm.weight", {c.q_lora_rank}, &L.q_a_norm));
      DI_RETURN_IF_ERROR(
          ld.LoadMatrix(a + "q_b_proj.weight", {nh * c.qk_head_dim(), c.q_lora_rank}, &L.q_b));
    } else {
      DI_RETURN_IF_ERROR(ld.LoadMatrix(a + "q_proj.weight", {nh * c.qk_head_dim(), hid}, &L.q));
    }
    DI_RETURN_IF_ERROR(ld.LoadMatrix(a + "kv_a_proj_with_mqa.weight", {kvl + rope, hid}, &L.kv_a));
    DI_RETURN_IF_ERROR(ld.Load(a + "kv_a_layernorm.weight", {kvl}, &L.kv_a_norm));
    std::vector<float> kv_b;
    DI_RETURN_IF_ERROR(ld.ReadHost(a + "kv_b_proj.weight", {nh * (nope + vd), kvl}, &kv_b));
    std::vector<float> uk_t(nh * kvl * nope);
    for (int64_t h = 0; h < nh; ++h) {
      for (int64_t d = 0; d < nope; ++d) {
        const float* row = kv_b.data() + (h * (nope + vd) + d) * kvl;
        for (int64_t ci = 0; ci < kvl; ++ci) uk_t[(h * kvl + ci) * nope + d] = row[ci];
      }
    }
    L.kv_b = ld.UploadMatrix(kv_b);
    L.w_uk_t = ld.UploadMatrix(uk_t);
    DI_RETURN_IF_ERROR(ld.LoadMatrix(a + "o_proj.weight", {hid, nh * vd}, &L.o_proj));

    const std::string m = p + "mlp.";
    L.moe = c.IsMoeLayer(l);
    if (!L.moe) {
      DI_RETURN_IF_ERROR(ld.LoadMlp(m, hid, c.intermediate_size, &L.dense));
      continue;
    }
    DI_RETURN_IF_ERROR(ld.Load(m + "gate.weight", {c.n_routed_experts, hid}, &L.router));
    // Older V2-style checkpoints have no correction bias; treat it as zero.
    if (source->Contains(m + "gate.e_score_correction_bias")) {
      DI_RETURN_IF_ERROR(
          ld.Load(m + "gate.e_score_correction_bias", {c.n_routed_experts}, &L.router_bias));
    } else {
      L.router_bias = ld.Upload(std::vector<float>(c.n_routed_experts, 0.0f));
    }
    if (c.n_shared_experts > 0) {
      DI_RETURN_IF_ERROR(ld.LoadMlp(m + "shared_experts.", hid,
                                    c.moe_intermediate_size * c.n_shared_experts, &L.shared));
    }
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      if (!is_mtp && options.hosts_expert && !options.hosts_expert(l, e)) continue;
      DI_RETURN_IF_ERROR(ld.LoadMlp(absl::StrCat(m, "experts.", e, "."), hid,
                                    c.moe_intermediate_size, &L.experts[e]));
    }
  }
  w->device_bytes = ld.bytes();
  return w;
}

absl::StatusOr<ModelWeights::HostExperts> ModelWeights::ReadRoutedExperts(
    const ModelConfig& c, WeightSource* source, const std::vector<std::vector<int64_t>>& experts) {
  HostExperts out(experts.size());
  const int64_t hid = c.hidden_size, inter = c.moe_intermediate_size;
  int64_t moe = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    if (!c.IsMoeLayer(l)) continue;
    if (moe >= static_cast<int64_t>(experts.size())) break;
    // HF's fused layout ([E, 2I, H] and [E, H, I], as save_pretrained writes DeepSeek-V4), read
    // once per layer when the checkpoint has it instead of per-expert tensors.
    const std::string fused = absl::StrCat("model.layers.", l, ".mlp.experts.");
    std::vector<float> fused_gate_up, fused_down;
    const bool is_fused =
        !experts[moe].empty() &&
        !source->Contains(absl::StrCat(fused, experts[moe][0], ".down_proj.weight")) &&
        source->Contains(fused + "gate_up_proj");
    if (is_fused) {
      const int64_t E = c.n_routed_experts;
      fused_gate_up.resize(E * 2 * inter * hid);
      fused_down.resize(E * hid * inter);
      DI_RETURN_IF_ERROR(
          source->ReadFloat32(fused + "gate_up_proj", {E, 2 * inter, hid}, fused_gate_up.data()));
      DI_RETURN_IF_ERROR(
          source->ReadFloat32(fused + "down_proj", {E, hid, inter}, fused_down.data()));
    }
    for (int64_t e : experts[moe]) {
      if (e < 0 || e >= c.n_routed_experts) {
        return absl::InvalidArgumentError(absl::StrCat(
            "routed expert ", e, " of layer ", l, " is outside the model's ", c.n_routed_experts));
      }
      if (out[moe].count(e)) continue;
      const std::string prefix = absl::StrCat("model.layers.", l, ".mlp.experts.", e, ".");
      HostMlp& m = out[moe][e];
      m.inter = inter;
      if (is_fused) {
        m.gate_up.assign(fused_gate_up.begin() + e * 2 * inter * hid,
                         fused_gate_up.begin() + (e + 1) * 2 * inter * hid);
        m.down.assign(fused_down.begin() + e * hid * inter,
                      fused_down.begin() + (e + 1) * hid * inter);
        continue;
      }
      m.gate_up.resize(2 * inter * hid);
      m.down.resize(hid * inter);
      DI_RETURN_IF_ERROR(
          source->ReadFloat32(prefix + "gate_proj.weight", {inter, hid}, m.gate_up.data()));
      DI_RETURN_IF_ERROR(source->ReadFloat32(prefix + "up_proj.weight", {inter, hid},
                                             m.gate_up.data() + inter * hid));
      DI_RETURN_IF_ERROR(
          source->ReadFloat32(prefix + "down_proj.weight", {hid, inter}, m.down.data()));
    }
    ++moe;
  }
  return out;
}

std::vector<std::map<int64_t, MlpWeights>> ModelWeights::UploadRoutedExperts(
    const HostExperts& host, Backend* backend) {
  Loader ld(nullptr, backend);
  std::vector<std::map<int64_t, MlpWeights>> out(host.size());
  for (size_t moe = 0; moe < host.size(); ++moe) {
    for (const auto& [e, m] : host[moe]) {
      MlpWeights& w = out[moe][e];
      w.inter = m.inter;
      w.gate_up = ld.UploadMatrix(m.gate_up);
      w.down = ld.UploadMatrix(m.down);
    }
  }
  return out;
}

absl::StatusOr<std::vector<std::map<int64_t, MlpWeights>>> ModelWeights::LoadRoutedExperts(
    const ModelConfig& c, WeightSource* source, Backend* backend,
    const std::vector<std::vector<int64_t>>& experts) {
  absl::StatusOr<HostExperts> host = ReadRoutedExperts(c, source, experts);
  if (!host.ok()) return host.status();
  return UploadRoutedExperts(*host, backend);
}

int64_t ModelWeights::Fp8DequantScratchBytes(const ModelConfig& c, const LoadOptions& options) {
  if (!options.keep_fp8) return 0;
  const int64_t hid = c.hidden_size, nh = c.num_attention_heads;
  const int64_t shapes[] = {
      c.q_lora_rank * hid,
      nh * c.qk_head_dim() * std::max<int64_t>(c.q_lora_rank, hid),
      (c.kv_lora_rank + c.qk_rope_head_dim) * hid,
      hid * nh * c.v_head_dim,
      2 * c.intermediate_size * hid,
      2 * c.moe_intermediate_size * std::max<int64_t>(1, c.n_shared_experts) * hid,
  };
  int64_t largest = 0;
  for (int64_t n : shapes) largest = std::max(largest, n);
  return largest * static_cast<int64_t>(sizeof(uint16_t));
}

int64_t ModelWeights::DeviceBytes(const ModelConfig& c, WeightDType matrix_dtype,
                                  const LoadOptions& options) {
  const int64_t f32 = sizeof(float), mat = static_cast<int64_t>(WeightDTypeSize(matrix_dtype));
  const int64_t hid = c.hidden_size, nh = c.num_attention_heads;
  const int64_t rope = c.qk_rope_head_dim, kvl = c.kv_lora_rank;
  const int64_t nope = c.qk_nope_head_dim, vd = c.v_head_dim;
  // A matrix [n, k] named `name`: FP8 bytes and scales where options.keep_fp8 names it.
  auto keeps_fp8 = [&](const std::string& name) {
    return options.keep_fp8 && options.keep_fp8(name);
  };
  auto matrix = [&](const std::string& name, int64_t n, int64_t k) {
    if (!keeps_fp8(name)) return n * k * mat;
    return n * k + CeilBlocks(n) * Fp8ScaleStride(k) * f32;
  };
  auto mlp = [&](const std::string& prefix, int64_t inter) {
    const int64_t down = matrix(prefix + "down_proj.weight", hid, inter);
    if (keeps_fp8(prefix + "gate_proj.weight") && keeps_fp8(prefix + "up_proj.weight")) {
      return 2 * (inter * hid + CeilBlocks(inter) * Fp8ScaleStride(hid) * f32) + down;
    }
    return 2 * inter * hid * mat + down;
  };
  int64_t bytes = c.vocab_size * hid * (f32 + mat) + hid * f32;  // embed, lm_head, final norm
  for (int64_t l = 0; l < c.num_hidden_layers + c.num_draft_layers; ++l) {
    const bool is_mtp = l >= c.num_hidden_layers;
    const std::string a = absl::StrCat("model.layers.", l, ".self_attn.");
    const std::string m = absl::StrCat("model.layers.", l, ".mlp.");
    if (is_mtp) bytes += 3 * hid * f32 + 2 * hid * hid * mat;  // enorm, hnorm, head norm, eh_proj
    bytes += 2 * hid * f32;                                    // input / post-attention norms
    if (c.q_lora_rank > 0) {
      bytes += matrix(a + "q_a_proj.weight", c.q_lora_rank, hid) +
               matrix(a + "q_b_proj.weight", nh * c.qk_head_dim(), c.q_lora_rank) +
               c.q_lora_rank * f32;
    } else {
      bytes += matrix(a + "q_proj.weight", nh * c.qk_head_dim(), hid);
    }
    bytes += matrix(a + "kv_a_proj_with_mqa.weight", kvl + rope, hid) + kvl * f32;  // + kv_a_norm
    bytes += (nh * (nope + vd) * kvl + nh * kvl * nope) * mat;                      // kv_b, uk_t
    bytes += matrix(a + "o_proj.weight", hid, nh * vd);
    if (!c.IsMoeLayer(l)) {
      bytes += mlp(m, c.intermediate_size);
      continue;
    }
    bytes += (c.n_routed_experts * hid + c.n_routed_experts) * f32;  // router and its bias
    if (c.n_shared_experts > 0) {
      bytes += mlp(m + "shared_experts.", c.moe_intermediate_size * c.n_shared_experts);
    }
    for (int64_t e = 0; e < c.n_routed_experts; ++e) {
      if (!is_mtp && options.hosts_expert && !options.hosts_expert(l, e)) continue;
      bytes += mlp(absl::StrCat(m, "experts.", e, "."), c.moe_intermediate_size);
    }
  }
  return bytes;
}

}  // namespace deepinfer
