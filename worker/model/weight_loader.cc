// WeightLoader: generated tensors made in place, checkpoint tensors as WeightUploader jobs.
#include "worker/model/weight_loader.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/backend/bf16.h"
#include "worker/model/mxfp4_quantize.h"

namespace deepinfer {

int64_t Fp8ScaleBlocks(int64_t n) { return (n + 127) / 128; }

int64_t Fp8ScaleStride(int64_t cols) { return (Fp8ScaleBlocks(cols) + 3) / 4 * 4; }

WeightUploadOptions UploadOptionsOf(const LoadOptions& options) {
  WeightUploadOptions upload;
  upload.threads = options.load_threads;
  if (upload.threads <= 0) {
    upload.threads = std::clamp<int>(static_cast<int>(std::thread::hardware_concurrency()), 1, 8);
  }
  upload.staging_bytes = options.staging_bytes;
  return upload;
}

WeightLoader::WeightLoader(WeightSource* src, Backend* be,
                           std::function<bool(const std::string&)> keep_fp8,
                           WeightUploadOptions upload)
    : src_(src), be_(be), keep_fp8_(std::move(keep_fp8)), uploader_(be, upload) {}

int64_t WeightLoader::Elements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::unique_ptr<DeviceBuffer> WeightLoader::Fill(const DummyFill& fill, int64_t n,
                                                 WeightDType dtype) {
  auto buf = be_->Allocate(static_cast<size_t>(n) * WeightDTypeSize(dtype));
  be_->FillDummy(fill, n, dtype, buf->data());
  bytes_ += buf->size_bytes();
  return buf;
}

std::unique_ptr<DeviceBuffer> WeightLoader::Upload(const std::vector<float>& v) {
  auto buf = be_->Allocate(v.size() * sizeof(float));
  be_->CopyToDevice(v.data(), v.size() * sizeof(float), buf->data());
  bytes_ += buf->size_bytes();
  return buf;
}

std::unique_ptr<DeviceBuffer> WeightLoader::UploadMatrix(const std::vector<float>& v) {
  auto buf = be_->UploadWeight(v.data(), static_cast<int64_t>(v.size()));
  bytes_ += buf->size_bytes();
  return buf;
}

absl::Status WeightLoader::Load(const std::string& name, const std::vector<int64_t>& shape,
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

absl::Status WeightLoader::LoadMatrix(const std::string& name, const std::vector<int64_t>& shape,
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

void WeightLoader::AddMatrices(const std::string& shard, const std::vector<int64_t>& elements,
                               std::vector<std::unique_ptr<DeviceBuffer>*> outs,
                               std::function<absl::Status(std::vector<std::vector<float>>*)> read,
                               int64_t extra_scratch) {
  const WeightDType dtype = be_->weight_dtype();
  std::vector<size_t> sizes;
  int64_t scratch = extra_scratch;
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

bool WeightLoader::KeepsFp8(const std::string& name) {
  return keep_fp8_ && keep_fp8_(name) && src_->StoresFp8(name);
}

void WeightLoader::LoadFp8(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                           int64_t cols, int64_t split_rows, MatrixBuffer* out) {
  const int64_t blocks = Fp8ScaleBlocks(cols), stride = Fp8ScaleStride(cols);
  out->scale_ld = stride;
  out->split_rows = split_rows;
  size_t data_bytes = 0, scale_bytes = 0;
  for (int64_t r : rows) {
    data_bytes += static_cast<size_t>(r * cols);
    scale_bytes += static_cast<size_t>(Fp8ScaleBlocks(r) * stride) * sizeof(float);
  }
  WeightSource* src = src_;
  uploader_.Add(
      src_->ShardOf(names[0]), {data_bytes, scale_bytes}, {&out->data, &out->fp8_scales}, 0,
      [src, names, rows, cols, blocks, stride](const std::vector<char*>& dst) -> absl::Status {
        char* data = dst[0];
        float* scales = reinterpret_cast<float*>(dst[1]);
        for (size_t i = 0; i < names.size(); ++i) {
          const size_t part_bytes = static_cast<size_t>(rows[i] * cols);
          const int64_t scale_rows = Fp8ScaleBlocks(rows[i]);
          auto t = src->ReadFp8(names[i], {rows[i], cols});
          if (!t.ok()) return t.status();
          if (!t->has_value() || (*t)->data.size() != part_bytes ||
              static_cast<int64_t>((*t)->scales.size()) != scale_rows * blocks) {
            return absl::InternalError(
                absl::StrCat(src->description(), ": '", names[i],
                             "' is not the FP8 tensor its header describes"));
          }
          std::memcpy(data, (*t)->data.data(), part_bytes);
          std::fill(scales, scales + scale_rows * stride, 0.0f);
          for (int64_t r = 0; r < scale_rows; ++r) {
            std::copy((*t)->scales.begin() + r * blocks, (*t)->scales.begin() + (r + 1) * blocks,
                      scales + r * stride);
          }
          data += part_bytes;
          scales += scale_rows * stride;
        }
        return absl::OkStatus();
      });
}

bool WeightLoader::Stacks(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                          int64_t cols) {
  size_t fp8 = 0, generated = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    fp8 += KeepsFp8(names[i]) ? 1 : 0;
    generated += Generated(names[i], {rows[i], cols}) ? 1 : 0;
  }
  if (fp8 == names.size()) {
    // The stacked grid restarts at most once (split_rows): past two parts, every part but the
    // last must fill whole 128-row blocks.
    if (names.size() <= 2) return true;
    for (size_t i = 0; i + 1 < rows.size(); ++i) {
      if (rows[i] % 128 != 0) return false;
    }
    return true;
  }
  return fp8 == 0 && (generated == 0 || generated == names.size());
}

absl::Status WeightLoader::LoadStacked(const std::vector<std::string>& names,
                                       const std::vector<int64_t>& rows, int64_t cols,
                                       MatrixBuffer* out) {
  if (names.empty() || names.size() != rows.size() || !Stacks(names, rows, cols)) {
    return absl::InvalidArgumentError(absl::StrCat("'", names.empty() ? std::string() : names[0],
                                                   "' and the matrices after it do not stack"));
  }
  *out = MatrixBuffer();
  if (KeepsFp8(names[0])) {
    LoadFp8(names, rows, cols, names.size() > 1 && rows[0] % 128 != 0 ? rows[0] : 0, out);
    return absl::OkStatus();
  }
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  if (Generated(names[0], {rows[0], cols})) {  // made in place, each part with its own recipe
    const WeightDType dtype = be_->weight_dtype();
    const int64_t elem = static_cast<int64_t>(WeightDTypeSize(dtype));
    out->data = be_->Allocate(static_cast<size_t>(total * cols * elem));
    char* part = static_cast<char*>(out->data->data());
    for (size_t i = 0; i < names.size(); ++i) {
      const int64_t n = rows[i] * cols;
      be_->FillDummy(*src_->DummyFillFor(names[i], {rows[i], cols}), n, dtype, part);
      part += n * elem;
    }
    bytes_ += out->data->size_bytes();
    return absl::OkStatus();
  }
  WeightSource* src = src_;
  AddMatrices(src_->ShardOf(names[0]), {total * cols}, {&out->data},
              [src, names, rows, cols](std::vector<std::vector<float>>* v) {
                float* part = (*v)[0].data();
                for (size_t i = 0; i < names.size(); ++i) {
                  absl::Status st = src->ReadFloat32(names[i], {rows[i], cols}, part);
                  if (!st.ok()) return st;
                  part += rows[i] * cols;
                }
                return absl::OkStatus();
              });
  return absl::OkStatus();
}

absl::Status WeightLoader::LoadMatrix(const std::string& name, const std::vector<int64_t>& shape,
                                      MatrixBuffer* out) {
  *out = MatrixBuffer();
  if (KeepsFp8(name)) {
    LoadFp8({name}, {shape[0]}, shape[1], 0, out);
    return absl::OkStatus();
  }
  return LoadMatrix(name, shape, &out->data);
}

absl::Status WeightLoader::LoadMlp(const std::string& prefix, int64_t hidden, int64_t inter,
                                   MlpWeights* m) {
  return LoadMlp(prefix + "gate_proj.weight", prefix + "up_proj.weight",
                 prefix + "down_proj.weight", hidden, inter, m);
}

absl::Status WeightLoader::LoadMlp(const std::string& gate, const std::string& up,
                                   const std::string& down, int64_t hidden, int64_t inter,
                                   MlpWeights* m) {
  m->inter = inter;
  if (KeepsFp8(gate) && KeepsFp8(up)) {
    LoadFp8({gate, up}, {inter, inter}, hidden, inter, &m->gate_up);
    return LoadMatrix(down, {hidden, inter}, &m->down);
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
    return LoadMatrix(down, {hidden, inter}, &m->down);
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
  return LoadMatrix(down, {hidden, inter}, &m->down);
}

absl::Status WeightLoader::LoadMxfp4Mlp(const std::string& gate, const std::string& up,
                                        const std::string& down, int64_t hidden, int64_t inter,
                                        MlpWeights* m) {
  if (hidden % kMxfp4Block != 0 || inter % kMxfp4Block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        gate, ": MXFP4 experts need hidden_size and moe_intermediate_size to be multiples of ",
        kMxfp4Block, ", not ", hidden, " and ", inter));
  }
  m->inter = inter;
  m->gate_up = MatrixBuffer();
  m->down = MatrixBuffer();
  m->gate_up.scale_ld = hidden / kMxfp4Block;
  m->down.scale_ld = inter / kMxfp4Block;
  const int64_t gu = 2 * inter * hidden, dn = hidden * inter;
  WeightSource* src = src_;
  const std::vector<size_t> sizes = {
      static_cast<size_t>(gu / 2), static_cast<size_t>(gu / kMxfp4Block),
      static_cast<size_t>(dn / 2), static_cast<size_t>(dn / kMxfp4Block)};
  if (src_->StoresMxfp4(gate) && src_->StoresMxfp4(up) && src_->StoresMxfp4(down)) {
    // As stored: [gate; up] is the two tensors' rows one after the other, bytes and scales.
    uploader_.Add(
        src_->ShardOf(gate), sizes,
        {&m->gate_up.data, &m->gate_up.mx_scales, &m->down.data, &m->down.mx_scales}, 0,
        [src, gate, up, down, inter, hidden](const std::vector<char*>& dst) -> absl::Status {
          struct Part {
            const std::string* name;
            std::vector<int64_t> shape;
            char *packed, *scales;
          };
          const int64_t half = inter * hidden;
          const Part parts[] = {
              {&gate, {inter, hidden}, dst[0], dst[1]},
              {&up, {inter, hidden}, dst[0] + half / 2, dst[1] + half / kMxfp4Block},
              {&down, {hidden, inter}, dst[2], dst[3]}};
          for (const Part& p : parts) {
            auto t = src->ReadMxfp4(*p.name, p.shape);
            if (!t.ok()) return t.status();
            if (!t->has_value() || static_cast<int64_t>((*t)->packed.size()) != half / 2 ||
                static_cast<int64_t>((*t)->scales.size()) != half / kMxfp4Block) {
              return absl::InternalError(
                  absl::StrCat(src->description(), ": '", *p.name,
                               "' is not the MXFP4 tensor its header describes"));
            }
            std::memcpy(p.packed, (*t)->packed.data(), (*t)->packed.size());
            std::memcpy(p.scales, (*t)->scales.data(), (*t)->scales.size());
          }
          return absl::OkStatus();
        });
    return absl::OkStatus();
  }
  uploader_.Add(
      src_->ShardOf(gate), sizes,
      {&m->gate_up.data, &m->gate_up.mx_scales, &m->down.data, &m->down.mx_scales},
      std::max(gu, dn) * static_cast<int64_t>(sizeof(float)),
      [src, gate, up, down, inter, hidden, gu, dn](const std::vector<char*>& dst) -> absl::Status {
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

void WeightLoader::LoadFusedExperts(const std::string& gate_up, const std::string& down,
                                    int64_t num_experts, int64_t hidden, int64_t inter,
                                    const std::vector<int64_t>& experts,
                                    std::map<int64_t, MlpWeights>* out) {
  // One job per fused tensor: it is read whole (its fp32 values are the job's own scratch) and
  // sliced into the hosted experts' buffers.
  struct Part {
    std::string name;
    std::vector<int64_t> shape;
    int64_t per_expert;
  };
  const Part parts[] = {{gate_up, {num_experts, 2 * inter, hidden}, 2 * inter * hidden},
                        {down, {num_experts, hidden, inter}, hidden * inter}};
  for (int64_t e : experts) (*out)[e].inter = inter;
  for (int which = 0; which < 2; ++which) {
    const Part& part = parts[which];
    std::vector<std::unique_ptr<DeviceBuffer>*> outs;
    for (int64_t e : experts) {
      MlpWeights& m = (*out)[e];
      outs.push_back(which == 0 ? &m.gate_up.data : &m.down.data);
    }
    WeightSource* src = src_;
    AddMatrices(
        src_->ShardOf(part.name), std::vector<int64_t>(experts.size(), part.per_expert),
        std::move(outs),
        [src, part, experts](std::vector<std::vector<float>>* v) {
          std::vector<float> all(static_cast<size_t>(Elements(part.shape)));
          if (absl::Status st = src->ReadFloat32(part.name, part.shape, all.data()); !st.ok()) {
            return st;
          }
          for (size_t i = 0; i < experts.size(); ++i) {
            std::copy(all.begin() + experts[i] * part.per_expert,
                      all.begin() + (experts[i] + 1) * part.per_expert, (*v)[i].begin());
          }
          return absl::OkStatus();
        },
        Elements(part.shape) * static_cast<int64_t>(sizeof(float)));
  }
}

absl::Status WeightLoader::LoadFusedMxfp4Experts(const std::string& gate_up,
                                                 const std::string& down, int64_t num_experts,
                                                 int64_t hidden, int64_t inter,
                                                 const std::vector<int64_t>& experts,
                                                 std::map<int64_t, MlpWeights>* out) {
  if (hidden % kMxfp4Block != 0 || inter % kMxfp4Block != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        gate_up, ": MXFP4 experts need hidden_size and moe_intermediate_size to be multiples of ",
        kMxfp4Block, ", not ", hidden, " and ", inter));
  }
  // One job per fused tensor, read whole and sliced into the hosted experts' buffers.
  struct Part {
    std::string name;
    int64_t rows, cols;
  };
  const Part parts[] = {{gate_up, 2 * inter, hidden}, {down, hidden, inter}};
  for (int64_t e : experts) {
    MlpWeights& m = (*out)[e];
    m.inter = inter;
    m.gate_up = MatrixBuffer();
    m.down = MatrixBuffer();
    m.gate_up.scale_ld = hidden / kMxfp4Block;
    m.down.scale_ld = inter / kMxfp4Block;
  }
  for (int which = 0; which < 2; ++which) {
    const Part& part = parts[which];
    const int64_t per_expert = part.rows * part.cols;
    const std::vector<int64_t> shape = {num_experts, part.rows, part.cols};
    std::vector<size_t> sizes;
    std::vector<std::unique_ptr<DeviceBuffer>*> outs;
    for (int64_t e : experts) {
      MatrixBuffer& m = which == 0 ? (*out)[e].gate_up : (*out)[e].down;
      sizes.push_back(static_cast<size_t>(per_expert / 2));
      sizes.push_back(static_cast<size_t>(per_expert / kMxfp4Block));
      outs.push_back(&m.data);
      outs.push_back(&m.mx_scales);
    }
    const bool stored = src_->StoresMxfp4(part.name);
    const int64_t scratch = stored ? Mxfp4Bytes(num_experts * per_expert)
                                   : num_experts * per_expert * static_cast<int64_t>(sizeof(float));
    WeightSource* src = src_;
    uploader_.Add(
        src_->ShardOf(part.name), std::move(sizes), std::move(outs), scratch,
        [src, part, shape, experts, per_expert, stored](const std::vector<char*>& dst) {
          if (stored) {
            auto t = src->ReadMxfp4(part.name, shape);
            if (!t.ok()) return t.status();
            if (!t->has_value()) {
              return absl::InternalError(absl::StrCat(src->description(), ": '", part.name,
                                                      "' is not the MXFP4 tensor its header "
                                                      "describes"));
            }
            for (size_t i = 0; i < experts.size(); ++i) {
              const int64_t e = experts[i];
              std::memcpy(dst[2 * i], (*t)->packed.data() + e * per_expert / 2, per_expert / 2);
              std::memcpy(dst[2 * i + 1], (*t)->scales.data() + e * per_expert / kMxfp4Block,
                          per_expert / kMxfp4Block);
            }
            return absl::OkStatus();
          }
          std::vector<float> all(static_cast<size_t>(Elements(shape)));
          if (absl::Status st = src->ReadFloat32(part.name, shape, all.data()); !st.ok()) {
            return st;
          }
          for (size_t i = 0; i < experts.size(); ++i) {
            absl::Status st =
                QuantizeMxfp4(all.data() + experts[i] * per_expert, part.rows, part.cols,
                              reinterpret_cast<uint8_t*>(dst[2 * i]),
                              reinterpret_cast<uint8_t*>(dst[2 * i + 1]), part.name.c_str());
            if (!st.ok()) return st;
          }
          return absl::OkStatus();
        });
  }
  return absl::OkStatus();
}

void WeightLoader::LoadIndices(const std::string& name, const std::vector<int64_t>& shape,
                               int64_t bound, std::unique_ptr<DeviceBuffer>* out) {
  WeightSource* src = src_;
  uploader_.Add(src_->ShardOf(name), {static_cast<size_t>(Elements(shape)) * sizeof(int32_t)},
                {out}, 0, [src, name, shape, bound](const std::vector<char*>& dst) {
                  return src->ReadIndices(name, shape, bound, reinterpret_cast<int32_t*>(dst[0]));
                });
}

void WeightLoader::LoadKvB(const std::string& name, int64_t nh, int64_t nope, int64_t vd,
                           int64_t kvl, std::unique_ptr<DeviceBuffer>* kv_b,
                           std::unique_ptr<DeviceBuffer>* uk_t) {
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

}  // namespace deepinfer
