// ModelWeights loading: DeepSeek-V3 checkpoint names -> backend buffers.
#include "worker/model/model_weights.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/backend/bf16.h"
#include "worker/model/mxfp4_quantize.h"
#include "worker/model/weight_uploader.h"

namespace deepinfer {
namespace {

int64_t CeilBlocks(int64_t n) { return (n + 127) / 128; }
// The device scale rows' stride for `cols` columns: the block count rounded up to 4 (the CUDA
// kernels' kernels::Fp8ScaleLd; cuBLASLt's 128 x 128 block scaling needs a multiple of 4), the
// padding columns zero.
int64_t Fp8ScaleStride(int64_t cols) { return (CeilBlocks(cols) + 3) / 4 * 4; }

WeightUploadOptions UploadOptionsOf(const LoadOptions& options) {
  WeightUploadOptions upload;
  upload.threads = options.load_threads;
  if (upload.threads <= 0) {
    upload.threads = std::clamp<int>(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  }
  upload.staging_bytes = options.staging_bytes;
  return upload;
}

// Makes the model's device buffers. Generated (dummy-format) tensors are filled on the backend
// at once; checkpoint tensors become WeightUploader jobs, read, converted and uploaded by
// Finish() (in parallel with LoadOptions::load_threads > 1). UploadMatrix uploads at once.
class Loader {
 public:
  Loader(WeightSource* src, Backend* be, std::function<bool(const std::string&)> keep_fp8 = nullptr,
         WeightUploadOptions upload = {})
      : src_(src), be_(be), keep_fp8_(std::move(keep_fp8)), uploader_(be, upload) {}
  int64_t bytes() const { return bytes_ + uploader_.bytes(); }
  absl::Status Finish() { return uploader_.Run(); }
  static int64_t Elements(const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }

  // A generated (dummy-format) tensor of n elements made in place by the backend, as dtype.
  std::unique_ptr<DeviceBuffer> Fill(const DummyFill& fill, int64_t n, WeightDType dtype) {
    auto buf = be_->Allocate(static_cast<size_t>(n) * WeightDTypeSize(dtype));
    be_->FillDummy(fill, n, dtype, buf->data());
    bytes_ += buf->size_bytes();
    return buf;
  }
  // fp32 values, now (vectors).
  std::unique_ptr<DeviceBuffer> Upload(const std::vector<float>& v) {
    auto buf = be_->Allocate(v.size() * sizeof(float));
    be_->CopyToDevice(v.data(), v.size() * sizeof(float), buf->data());
    bytes_ += buf->size_bytes();
    return buf;
  }
  // In the backend's weight dtype, now.
  std::unique_ptr<DeviceBuffer> UploadMatrix(const std::vector<float>& v) {
    auto buf = be_->UploadWeight(v.data(), static_cast<int64_t>(v.size()));
    bytes_ += buf->size_bytes();
    return buf;
  }
  // fp32 (vectors, embedding, router).
  absl::Status Load(const std::string& name, const std::vector<int64_t>& shape,
                    std::unique_ptr<DeviceBuffer>* out) {
    const int64_t n = Elements(shape);
    if (std::optional<DummyFill> fill = src_->DummyFillFor(name, shape)) {
      *out = Fill(*fill, n, WeightDType::kFloat32);
      return absl::OkStatus();
    }
    WeightSource* src = src_;
    uploader_.Add(src_->ShardOf(name), {static_cast<size_t>(n) * sizeof(float)}, {out}, 0,
                  [src, name, shape](const std::vector<char*>& dst) {
                    return src->ReadFloat32(name, shape, reinterpret_cast<float*>(dst[0]));
                  });
    return absl::OkStatus();
  }
  // In the backend's weight dtype.
  absl::Status LoadMatrix(const std::string& name, const std::vector<int64_t>& shape,
                          std::unique_ptr<DeviceBuffer>* out) {
    const int64_t n = Elements(shape);
    if (std::optional<DummyFill> fill = src_->DummyFillFor(name, shape)) {
      *out = Fill(*fill, n, be_->weight_dtype());
      return absl::OkStatus();
    }
    WeightSource* src = src_;
    AddMatrices(src_->ShardOf(name), {n}, {out},
                [src, name, shape](std::vector<std::vector<float>>* v) {
                  return src->ReadFloat32(name, shape, (*v)[0].data());
                });
    return absl::OkStatus();
  }
  // A job making matrices of `elements` each in the weight dtype from fp32 values that `read`
  // writes into vectors of those sizes.
  void AddMatrices(const std::string& shard, const std::vector<int64_t>& elements,
                   std::vector<std::unique_ptr<DeviceBuffer>*> outs,
                   std::function<absl::Status(std::vector<std::vector<float>>*)> read) {
    const WeightDType dtype = be_->weight_dtype();
    std::vector<size_t> sizes;
    int64_t scratch = 0;
    for (int64_t n : elements) {
      sizes.push_back(static_cast<size_t>(n) * WeightDTypeSize(dtype));
      scratch += n * static_cast<int64_t>(sizeof(float));
    }
    uploader_.Add(shard, std::move(sizes), std::move(outs), scratch,
                  [dtype, elements, read](const std::vector<char*>& dst) -> absl::Status {
                    std::vector<std::vector<float>> values(elements.size());
                    for (size_t i = 0; i < elements.size(); ++i) values[i].resize(elements[i]);
                    if (absl::Status st = read(&values); !st.ok()) return st;
                    for (size_t i = 0; i < values.size(); ++i) {
                      const std::vector<float>& v = values[i];
                      if (dtype == WeightDType::kFloat32) {
                        std::memcpy(dst[i], v.data(), v.size() * sizeof(float));
                        continue;
                      }
                      uint16_t* bits = reinterpret_cast<uint16_t*>(dst[i]);
                      for (size_t k = 0; k < v.size(); ++k) bits[k] = FloatToBf16Bits(v[k]);
                    }
                    return absl::OkStatus();
                  });
  }
  // Whether `name` stays FP8 on the device: keep_fp8 names it and the source stores it so.
  bool KeepsFp8(const std::string& name) {
    return keep_fp8_ && keep_fp8_(name) && src_->StoresFp8(name);
  }
  // FP8 bytes as stored and their scales' rows (ceil(cols / 128) each) with the stride
  // Fp8ScaleStride(cols), the padding zero, of the tensors `names`, each [rows, cols], stacked
  // (split at the first one's rows when there are two).
  void LoadFp8(const std::vector<std::string>& names, int64_t rows, int64_t cols,
               MatrixBuffer* out) {
    const int64_t k = static_cast<int64_t>(names.size());
    const int64_t blocks = CeilBlocks(cols), stride = Fp8ScaleStride(cols);
    const int64_t scale_rows = CeilBlocks(rows);
    out->scale_ld = stride;
    out->split_rows = k > 1 ? rows : 0;
    const std::vector<int64_t> shape = {rows, cols};
    const size_t data_bytes = static_cast<size_t>(rows * cols);
    const size_t scale_bytes = static_cast<size_t>(scale_rows * stride) * sizeof(float);
    WeightSource* src = src_;
    uploader_.Add(src_->ShardOf(names[0]), {k * data_bytes, k * scale_bytes},
                  {&out->data, &out->fp8_scales}, 0,
                  [src, names, shape, data_bytes, scale_bytes, blocks, stride,
                   scale_rows](const std::vector<char*>& dst) -> absl::Status {
                    for (size_t i = 0; i < names.size(); ++i) {
                      auto t = src->ReadFp8(names[i], shape);
                      if (!t.ok()) return t.status();
                      if (!t->has_value() || (*t)->data.size() != data_bytes ||
                          static_cast<int64_t>((*t)->scales.size()) != scale_rows * blocks) {
                        return absl::InternalError(
                            absl::StrCat(src->description(), ": '", names[i],
                                         "' is not the FP8 tensor its header describes"));
                      }
                      std::memcpy(dst[0] + i * data_bytes, (*t)->data.data(), data_bytes);
                      float* scales = reinterpret_cast<float*>(dst[1] + i * scale_bytes);
                      std::fill(scales, scales + scale_rows * stride, 0.0f);
                      for (int64_t r = 0; r < scale_rows; ++r) {
                        std::copy((*t)->scales.begin() + r * blocks,
                                  (*t)->scales.begin() + (r + 1) * blocks, scales + r * stride);
                      }
                    }
                    return absl::OkStatus();
                  });
  }
  absl::Status LoadMatrix(const std::string& name, const std::vector<int64_t>& shape,
                          MatrixBuffer* out) {
    *out = MatrixBuffer();
    if (KeepsFp8(name)) {
      LoadFp8({name}, shape[0], shape[1], out);
      return absl::OkStatus();
    }
    return LoadMatrix(name, shape, &out->data);
  }
  // prefix: "...mlp." or "...experts.7."; gate and up stacked into one [2*inter, hidden] matrix
  // (FP8 where both are kept FP8: the bytes and the scale grids stacked, split at inter rows).
  absl::Status LoadMlp(const std::string& prefix, int64_t hidden, int64_t inter, MlpWeights* m) {
    const std::string gate = prefix + "gate_proj.weight", up = prefix + "up_proj.weight";
    m->inter = inter;
    if (KeepsFp8(gate) && KeepsFp8(up)) {
      LoadFp8({gate, up}, inter, hidden, &m->gate_up);
      return LoadMatrix(prefix + "down_proj.weight", {hidden, inter}, &m->down);
    }
    const std::optional<DummyFill> gate_fill = src_->DummyFillFor(gate, {inter, hidden});
    const std::optional<DummyFill> up_fill = src_->DummyFillFor(up, {inter, hidden});
    if (gate_fill && up_fill) {  // [gate; up] made in place, each with its own recipe
      const WeightDType dtype = be_->weight_dtype();
      const int64_t half = inter * hidden;
      m->gate_up = be_->Allocate(static_cast<size_t>(2 * half) * WeightDTypeSize(dtype));
      be_->FillDummy(*gate_fill, half, dtype, m->gate_up->data());
      be_->FillDummy(*up_fill, half, dtype,
                     static_cast<char*>(m->gate_up->data()) +
                         half * static_cast<int64_t>(WeightDTypeSize(dtype)));
      bytes_ += m->gate_up->size_bytes();
      return LoadMatrix(prefix + "down_proj.weight", {hidden, inter}, &m->down);
    }
    WeightSource* src = src_;
    m->gate_up = MatrixBuffer();
    AddMatrices(src_->ShardOf(gate), {2 * inter * hidden}, {&m->gate_up.data},
                [src, gate, up, inter, hidden](std::vector<std::vector<float>>* v) {
                  float* out = (*v)[0].data();
                  absl::Status st = src->ReadFloat32(gate, {inter, hidden}, out);
                  if (!st.ok()) return st;
                  return src->ReadFloat32(up, {inter, hidden}, out + inter * hidden);
                });
    return LoadMatrix(prefix + "down_proj.weight", {hidden, inter}, &m->down);
  }
  // A routed expert in MXFP4 (LoadOptions::mxfp4_experts): [gate; up] [2 * inter, hidden] and
  // down [hidden, inter], each packed with its scales, quantised from the fp32 values.
  absl::Status LoadMxfp4Mlp(const std::string& prefix, int64_t hidden, int64_t inter,
                            MlpWeights* m) {
    if (hidden % kMxfp4Block != 0 || inter % kMxfp4Block != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "*: MXFP4 experts need hidden_size and moe_intermediate_size to be multiples of ",
          kMxfp4Block, ", not ", hidden, " and ", inter));
    }
    const std::string gate = prefix + "gate_proj.weight", up = prefix + "up_proj.weight",
                      down = prefix + "down_proj.weight";
    m->inter = inter;
    m->gate_up = MatrixBuffer();
    m->down = MatrixBuffer();
    m->gate_up.scale_ld = hidden / kMxfp4Block;
    m->down.scale_ld = inter / kMxfp4Block;
    const int64_t gu = 2 * inter * hidden, dn = hidden * inter;
    WeightSource* src = src_;
    uploader_.Add(
        src_->ShardOf(gate),
        {static_cast<size_t>(gu / 2), static_cast<size_t>(gu / kMxfp4Block),
         static_cast<size_t>(dn / 2), static_cast<size_t>(dn / kMxfp4Block)},
        {&m->gate_up.data, &m->gate_up.mx_scales, &m->down.data, &m->down.mx_scales},
        (gu + dn) * static_cast<int64_t>(sizeof(float)),
        [src, gate, up, down, inter, hidden, gu,
         dn](const std::vector<char*>& dst) -> absl::Status {
          std::vector<float> v(std::max(gu, dn));
          absl::Status st = src->ReadFloat32(gate, {inter, hidden}, v.data());
          if (st.ok()) st = src->ReadFloat32(up, {inter, hidden}, v.data() + inter * hidden);
          if (st.ok()) {
            st = QuantizeMxfp4(v.data(), 2 * inter, hidden, reinterpret_cast<uint8_t*>(dst[0]),
                               reinterpret_cast<uint8_t*>(dst[1]), gate.c_str());
          }
          if (st.ok()) st = src->ReadFloat32(down, {hidden, inter}, v.data());
          if (st.ok()) {
            st = QuantizeMxfp4(v.data(), hidden, inter, reinterpret_cast<uint8_t*>(dst[2]),
                               reinterpret_cast<uint8_t*>(dst[3]), down.c_str());
          }
          return st;
        });
    return absl::OkStatus();
  }
  // kv_b_proj as the checkpoint has it [heads * (nope + v), kv_lora], and its key half
  // transposed per head, W_uk^T [heads, kv_lora, nope].
  void LoadKvB(const std::string& name, int64_t nh, int64_t nope, int64_t vd, int64_t kvl,
               std::unique_ptr<DeviceBuffer>* kv_b, std::unique_ptr<DeviceBuffer>* uk_t) {
    WeightSource* src = src_;
    AddMatrices(src_->ShardOf(name), {nh * (nope + vd) * kvl, nh * kvl * nope}, {kv_b, uk_t},
                [src, name, nh, nope, vd, kvl](std::vector<std::vector<float>>* v) {
                  std::vector<float>& kv = (*v)[0];
                  std::vector<float>& t = (*v)[1];
                  absl::Status st = src->ReadFloat32(name, {nh * (nope + vd), kvl}, kv.data());
                  if (!st.ok()) return st;
                  for (int64_t h = 0; h < nh; ++h) {
                    for (int64_t d = 0; d < nope; ++d) {
                      const float* row = kv.data() + (h * (nope + vd) + d) * kvl;
                      for (int64_t ci = 0; ci < kvl; ++ci) t[(h * kvl + ci) * nope + d] = row[ci];
                    }
                  }
                  return absl::OkStatus();
                });
  }

 private:
  WeightSource* src_;
  Backend* be_;
  const std::function<bool(const std::string&)> keep_fp8_;
  WeightUploader uploader_;
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
  Loader ld(source, backend, options.keep_fp8, UploadOptionsOf(options));
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
                             ? ld.LoadMxfp4Mlp(prefix, hid, c.moe_intermediate_size, &L.experts[e])
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
      if (options.mxfp4_experts) {  // packed e2m1 and a UE8M0 byte per 32, both matrices
        const int64_t elements = 3 * c.moe_intermediate_size * hid;
        bytes += elements / 2 + elements / kMxfp4Block;
        continue;
      }
      bytes += mlp(absl::StrCat(m, "experts.", e, "."), c.moe_intermediate_size);
    }
  }
  return bytes;
}

}  // namespace deepinfer
