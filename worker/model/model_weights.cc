// ModelWeights loading: DeepSeek-V3 checkpoint names -> backend buffers.
#include "worker/model/model_weights.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/model/mxfp4_quantize.h"
#include "worker/model/weight_loader.h"

namespace deepinfer {
namespace {

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
  WeightLoader ld(source, backend, options.keep_fp8, UploadOptionsOf(options));
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
    // The query's first projection (q_a with q_lora, else q_proj) and kv_a: one matrix qkv_a
    // where they stack.
    const bool lora = c.q_lora_rank > 0;
    const std::vector<std::string> names = {a + (lora ? "q_a_proj.weight" : "q_proj.weight"),
                                            a + "kv_a_proj_with_mqa.weight"};
    const std::vector<int64_t> rows = {lora ? c.q_lora_rank : nh * c.qk_head_dim(), kvl + rope};
    if (ld.Stacks(names, rows, hid)) {
      DI_RETURN_IF_ERROR(ld.LoadStacked(names, rows, hid, &L.qkv_a));
    } else {
      DI_RETURN_IF_ERROR(ld.LoadMatrix(names[0], {rows[0], hid}, lora ? &L.q_a : &L.q));
      DI_RETURN_IF_ERROR(ld.LoadMatrix(names[1], {rows[1], hid}, &L.kv_a));
    }
    if (lora) {
      DI_RETURN_IF_ERROR(ld.Load(a + "q_a_layernorm.weight", {c.q_lora_rank}, &L.q_a_norm));
      DI_RETURN_IF_ERROR(
          ld.LoadMatrix(a + "q_b_proj.weight", {nh * c.qk_head_dim(), c.q_lora_rank}, &L.q_b));
    }
    DI_RETURN_IF_ERROR(ld.Load(a + "kv_a_layernorm.weight", {kvl}, &L.kv_a_norm));
    ld.LoadKvB(a + "kv_b_proj.weight", nh, nope, vd, kvl, &L.kv_b, &L.w_uk_t);
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
      const std::string prefix = absl::StrCat(m, "experts.", e, ".");
      DI_RETURN_IF_ERROR(options.mxfp4_experts
                             ? ld.LoadMxfp4Mlp(prefix + "gate_proj.weight",
                                               prefix + "up_proj.weight",
                                               prefix + "down_proj.weight", hid,
                                               c.moe_intermediate_size, &L.experts[e])
                             : ld.LoadMlp(prefix, hid, c.moe_intermediate_size, &L.experts[e]));
    }
  }
  DI_RETURN_IF_ERROR(ld.Finish());
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
  WeightLoader ld(nullptr, backend);
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
  const int64_t kv_a_rows = c.kv_lora_rank + c.qk_rope_head_dim;
  const int64_t shapes[] = {
      c.q_lora_rank * hid,
      nh * c.qk_head_dim() * std::max<int64_t>(c.q_lora_rank, hid),
      kv_a_rows * hid,
      ((c.q_lora_rank > 0 ? c.q_lora_rank : nh * c.qk_head_dim()) + kv_a_rows) * hid,  // qkv_a
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
    return n * k + Fp8ScaleBlocks(n) * Fp8ScaleStride(k) * f32;
  };
  auto mlp = [&](const std::string& prefix, int64_t inter) {
    const int64_t down = matrix(prefix + "down_proj.weight", hid, inter);
    if (keeps_fp8(prefix + "gate_proj.weight") && keeps_fp8(prefix + "up_proj.weight")) {
      return 2 * (inter * hid + Fp8ScaleBlocks(inter) * Fp8ScaleStride(hid) * f32) + down;
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
    // The query's first projection and kv_a: the same bytes stacked as qkv_a or not.
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
      if (options.mxfp4_experts) {  // packed e2m1 and a UE8M0 byte per 32, both matrices
        bytes += Mxfp4Bytes(3 * c.moe_intermediate_size * hid);
        continue;
      }
      bytes += mlp(absl::StrCat(m, "experts.", e, "."), c.moe_intermediate_size);
    }
  }
  return bytes;
}

}  // namespace deepinfer
