// SafetensorsCheckpoint: index resolution, lazy shard mapping, dtype conversion, FP8 and MXFP4
// dequantisation.
#include "worker/model/safetensors_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "nlohmann/json.hpp"

namespace deepinfer {
namespace {

// Values one MX scale covers along a row (OCP Microscaling v1.0: k = 32).
constexpr int64_t kMxBlock = 32;

bool FileExists(const std::string& path) {
  std::ifstream f(path);
  return static_cast<bool>(f);
}

}  // namespace

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& dir, int64_t br, int64_t bc) {
  std::unique_ptr<SafetensorsCheckpoint> ckpt(new SafetensorsCheckpoint(dir, br, bc));
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string single = dir + "/model.safetensors";
  if (FileExists(index_path)) {
    std::ifstream in(index_path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return absl::DataLossError(absl::StrCat(index_path, ": not a JSON object"));
    }
    auto wm = j.find("weight_map");
    if (wm == j.end() || !wm->is_object()) {
      return absl::DataLossError(absl::StrCat(index_path, ": missing weight_map"));
    }
    for (auto it = wm->begin(); it != wm->end(); ++it) {
      if (!it.value().is_string()) {
        return absl::DataLossError(
            absl::StrCat(index_path, ": weight_map entry '", it.key(), "' is not a file name"));
      }
      ckpt->weight_map_[it.key()] = it.value().get<std::string>();
    }
  } else if (FileExists(single)) {
    absl::MutexLock lock(&ckpt->mu_);
    auto f = SafetensorsFile::Open(single);
    if (!f.ok()) return f.status();
    for (const auto& [name, t] : (*f)->tensors()) ckpt->weight_map_[name] = "model.safetensors";
    ckpt->shards_["model.safetensors"] = std::move(*f);
  } else {
    return absl::NotFoundError(absl::StrCat(
        dir, ": no model.safetensors.index.json or model.safetensors in checkpoint directory"));
  }
  return ckpt;
}

bool SafetensorsCheckpoint::Contains(const std::string& name) const {
  return weight_map_.count(name) > 0;
}

absl::StatusOr<const SafetensorsTensor*> SafetensorsCheckpoint::FindTensor(const std::string& name,
                                                                           std::string* file) {
  auto it = weight_map_.find(name);
  if (it == weight_map_.end()) {
    return absl::NotFoundError(
        absl::StrCat(dir_, ": tensor '", name, "' is missing from the checkpoint"));
  }
  *file = dir_ + "/" + it->second;
  absl::MutexLock lock(&mu_);
  auto sh = shards_.find(it->second);
  if (sh == shards_.end()) {
    auto f = SafetensorsFile::Open(*file);
    if (!f.ok()) return f.status();
    sh = shards_.emplace(it->second, std::move(*f)).first;
  }
  const SafetensorsTensor* t = sh->second->Find(name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        *file, ": tensor '", name, "' is listed in the index but not present in the file"));
  }
  return t;
}

absl::StatusOr<WeightStorage> SafetensorsCheckpoint::Describe(const std::string& name,
                                                              const SafetensorsTensor** weight,
                                                              const SafetensorsTensor** scale,
                                                              std::string* file) {
  auto t_or = FindTensor(name, file);
  if (!t_or.ok()) return t_or.status();
  const SafetensorsTensor& t = **t_or;
  *weight = &t;
  *scale = nullptr;
  WeightStorage s;
  s.dtype = t.dtype;
  s.shape = s.stored_shape = t.shape;
  s.stored_bytes = static_cast<int64_t>(t.nbytes);
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(*file, ": tensor '", name, "' ", why));
  };

  switch (t.dtype) {
    case DType::kF64:
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kF8E8M0:  // a scale tensor read on its own
      return s;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
      s.kind = WeightStorageKind::kFp8Block;
      s.block_rows = block_rows_;
      s.block_cols = block_cols_;
      break;
    case DType::kU8:
    case DType::kI8:
    case DType::kF4:
      s.kind = WeightStorageKind::kMxfp4;
      s.block_rows = 1;
      s.block_cols = kMxBlock;
      break;
    default:
      return bad(absl::StrCat("has dtype ", DTypeName(t.dtype), ", which no weight can have"));
  }

  // The scale, under one of the names checkpoints use.
  std::vector<std::string> candidates = {name + "_scale_inv", name + "_scale"};
  if (absl::EndsWith(name, ".weight")) {
    candidates.push_back(absl::StrCat(absl::StripSuffix(name, ".weight"), ".scale"));
  }
  for (const std::string& c : candidates) {
    if (!Contains(c)) continue;
    if (!s.scale_name.empty()) {
      return bad(absl::StrCat("has two scale tensors, '", s.scale_name, "' and '", c,
                              "'; a checkpoint must hold one"));
    }
    s.scale_name = c;
  }
  const char* kind = s.kind == WeightStorageKind::kMxfp4 ? "MXFP4" : "FP8";
  if (s.scale_name.empty()) {
    if (s.kind == WeightStorageKind::kFp8Block) {
      return absl::NotFoundError(
          absl::StrCat(*file, ": FP8 tensor '", name, "' has no scale '", candidates[0], "'"));
    }
    return absl::NotFoundError(
        absl::StrCat(*file, ": tensor '", name, "' of dtype ", DTypeName(t.dtype),
                     " has no scale ('", absl::StrJoin(candidates, "', '"), "'); a ",
                     DTypeName(t.dtype), " tensor is a weight only as MXFP4 with E8M0 scales"));
  }
  if (t.shape.size() < 2) {
    return bad(absl::StrCat("of shape [", absl::StrJoin(t.shape, ","), "] is ", kind,
                            " but not a matrix; block scaling needs at least 2 dimensions"));
  }
  // Packed MXFP4 holds two values a byte along the input dimension.
  if (t.dtype == DType::kU8 || t.dtype == DType::kI8) s.shape.back() *= 2;

  std::string scale_file;
  auto sc_or = FindTensor(s.scale_name, &scale_file);
  if (!sc_or.ok()) return sc_or.status();
  const SafetensorsTensor& sc = **sc_or;
  *scale = &sc;
  s.scale_dtype = sc.dtype;
  s.scale_shape = sc.shape;
  s.scale_bytes = static_cast<int64_t>(sc.nbytes);
  switch (sc.dtype) {
    case DType::kF32:
    case DType::kBF16:
    case DType::kF16:
    case DType::kF8E8M0:
    case DType::kU8:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          scale_file, ": scale '", s.scale_name, "' of ", kind, " tensor '", name, "' has dtype ",
          DTypeName(sc.dtype), "; a scale is F32, BF16, F16, F8_E8M0 or U8 (E8M0 bytes)"));
  }
  std::vector<int64_t> grid(s.shape.begin(), s.shape.end() - 2);
  const int64_t rows = s.shape[s.shape.size() - 2], cols = s.shape.back();
  grid.push_back((rows + s.block_rows - 1) / s.block_rows);
  grid.push_back((cols + s.block_cols - 1) / s.block_cols);
  if (sc.shape != grid) {
    return absl::InvalidArgumentError(absl::StrCat(
        scale_file, ": scale '", s.scale_name, "' has shape [", absl::StrJoin(sc.shape, ","),
        "], but ", kind, " tensor '", name, "' of shape [", absl::StrJoin(s.shape, ","), "] in ",
        s.block_rows, "x", s.block_cols, " blocks needs [", absl::StrJoin(grid, ","), "]"));
  }
  return s;
}

namespace {

// The block scales of `name` (storage s, scale tensor sc) as float multipliers: float types
// converted, F8_E8M0 and U8 bytes as 2^(b - 127). INVALID_ARGUMENT naming the element for a
// scale that is not finite and non-negative (0xFF, the E8M0 NaN, included).
absl::Status ScaleValues(const std::string& name, const WeightStorage& s,
                         const SafetensorsTensor& sc, std::vector<float>* out) {
  const int64_t scale_n = sc.num_elements();
  std::vector<float>& scale = *out;
  scale.resize(scale_n);
  if (sc.dtype == DType::kU8) {
    for (int64_t i = 0; i < scale_n; ++i) scale[i] = E8M0ToFloat(sc.data[i]);
  } else {
    absl::Status st = ConvertToFloat32(sc.dtype, sc.data, scale_n, scale.data());
    if (!st.ok()) return st;
  }
  for (int64_t i = 0; i < scale_n; ++i) {
    if (!std::isfinite(scale[i]) || scale[i] < 0) {
      const std::string bits =
          DTypeBits(sc.dtype) == 8 ? absl::StrCat(" (byte 0x", absl::Hex(sc.data[i]), ")") : "";
      return absl::InvalidArgumentError(
          absl::StrCat("scale '", s.scale_name, "' of tensor '", name, "' element ", i, " is ",
                       scale[i], bits, "; block scales must be finite and non-negative"));
    }
  }
  return absl::OkStatus();
}

// FP8 storage the block-scaled FP8 GEMMs take as stored: e4m3 values of a matrix in 128 x 128
// blocks, with any scale dtype Describe accepts (UE8M0 bytes become their float powers of two).
bool KeepableFp8(const WeightStorage& s) {
  return s.kind == WeightStorageKind::kFp8Block && s.dtype == DType::kF8E4M3 &&
         s.shape.size() == 2 && s.block_rows == 128 && s.block_cols == 128;
}

// MXFP4 storage the device keeps as stored: e2m1 bytes with E8M0 byte scales, rows of whole
// 32-value blocks.
bool KeepableMxfp4(const WeightStorage& s) {
  return s.kind == WeightStorageKind::kMxfp4 && s.block_rows == 1 && s.block_cols == 32 &&
         s.shape.size() >= 2 && s.shape.back() % 32 == 0 &&
         (s.scale_dtype == DType::kF8E8M0 || s.scale_dtype == DType::kU8);
}

}  // namespace

absl::StatusOr<WeightStorage> SafetensorsCheckpoint::Storage(const std::string& name) {
  const SafetensorsTensor* weight = nullptr;
  const SafetensorsTensor* scale = nullptr;
  std::string file;
  return Describe(name, &weight, &scale, &file);
}

absl::Status SafetensorsCheckpoint::ReadIndices(const std::string& name,
                                                const std::vector<int64_t>& shape, int64_t bound,
                                                int32_t* out) {
  std::string file;
  auto t_or = FindTensor(name, &file);
  if (!t_or.ok()) return t_or.status();
  const SafetensorsTensor& t = **t_or;
  auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": tensor '", name, "' ", why));
  };
  if (t.shape != shape) {
    return bad(absl::StrCat("has shape [", absl::StrJoin(t.shape, ","), "], expected [",
                            absl::StrJoin(shape, ","), "]"));
  }
  const bool is_signed = t.dtype == DType::kI8 || t.dtype == DType::kI16 ||
                         t.dtype == DType::kI32 || t.dtype == DType::kI64;
  const bool is_unsigned = t.dtype == DType::kU8 || t.dtype == DType::kU16 ||
                           t.dtype == DType::kU32 || t.dtype == DType::kU64;
  if (!is_signed && !is_unsigned) {
    return bad(absl::StrCat("has dtype ", DTypeName(t.dtype), "; an index table is an integer"));
  }
  const int bytes = DTypeBits(t.dtype) / 8;
  const int64_t n = t.num_elements();
  for (int64_t i = 0; i < n; ++i) {
    uint64_t u = 0;
    for (int b = 0; b < bytes; ++b) u |= static_cast<uint64_t>(t.data[i * bytes + b]) << (8 * b);
    int64_t v = static_cast<int64_t>(u);
    if (is_signed && bytes < 8 && (u >> (8 * bytes - 1)) != 0) {
      v = static_cast<int64_t>(u | (~uint64_t{0} << (8 * bytes)));  // sign-extend
    }
    if ((is_unsigned && u >= static_cast<uint64_t>(bound)) || v < 0 || v >= bound) {
      return bad(absl::StrCat("element ", i, " is ",
                              is_unsigned ? absl::StrCat(u) : absl::StrCat(v), ", outside [0, ",
                              bound, ")"));
    }
    out[i] = static_cast<int32_t>(v);
  }
  return absl::OkStatus();
}

std::string SafetensorsCheckpoint::ShardOf(const std::string& name) const {
  auto it = weight_map_.find(name);
  return it == weight_map_.end() ? "" : it->second;
}

absl::Status SafetensorsCheckpoint::ReadFloat32(const std::string& name,
                                                const std::vector<int64_t>& shape, float* out) {
  const SafetensorsTensor* t = nullptr;
  const SafetensorsTensor* sc = nullptr;
  std::string file;
  absl::StatusOr<WeightStorage> s_or = Describe(name, &t, &sc, &file);
  if (!s_or.ok()) return s_or.status();
  const WeightStorage& s = *s_or;
  if (s.shape != shape) {
    std::string stored;
    if (s.stored_shape != s.shape) {
      stored = absl::StrCat(" (stored packed as ", DTypeName(s.dtype), " [",
                            absl::StrJoin(s.stored_shape, ","), "])");
    }
    return absl::InvalidArgumentError(absl::StrCat(file, ": tensor '", name, "' has shape [",
                                                   absl::StrJoin(s.shape, ","), "]", stored,
                                                   ", expected [", absl::StrJoin(shape, ","), "]"));
  }
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (t->dtype == DType::kU8 || t->dtype == DType::kI8) {
    for (int64_t i = 0; i < n / 2; ++i) {
      out[2 * i] = E2M1ToFloat(t->data[i] & 0xF);
      out[2 * i + 1] = E2M1ToFloat(t->data[i] >> 4);
    }
  } else {
    absl::Status st = ConvertToFloat32(t->dtype, t->data, n, out);
    if (!st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(file, ": tensor '", name, "': ", st.message()));
    }
  }
  if (!s.scaled()) return absl::OkStatus();

  // y = x * s over each block (DeepSeek's weight_dequant; the MX spec's X_i = S * P_i).
  std::vector<float> scale;
  absl::Status st = ScaleValues(name, s, *sc, &scale);
  if (!st.ok()) return st;
  const int64_t rows = shape[shape.size() - 2], cols = shape.back();
  const int64_t scale_rows = s.scale_shape[s.scale_shape.size() - 2];
  const int64_t scale_cols = s.scale_shape.back();
  const int64_t batches = n / (rows * std::max<int64_t>(cols, 1));
  for (int64_t b = 0; b < batches && rows * cols > 0; ++b) {
    for (int64_t r = 0; r < rows; ++r) {
      const float* srow = scale.data() + (b * scale_rows + r / s.block_rows) * scale_cols;
      float* orow = out + (b * rows + r) * cols;
      for (int64_t c = 0; c < cols; ++c) orow[c] *= srow[c / s.block_cols];
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<WeightStorage>> SafetensorsCheckpoint::KeptStorage(
    const std::string& name, const std::vector<int64_t>& shape,
    bool (*keepable)(const WeightStorage&), const char* kind, const SafetensorsTensor** weight,
    const SafetensorsTensor** scale) {
  std::string file;
  absl::StatusOr<WeightStorage> s = Describe(name, weight, scale, &file);
  if (!s.ok()) return s.status();
  if (!keepable(*s)) return std::nullopt;
  if (s->shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": ", kind, " tensor '", name, "' has shape [", absl::StrJoin(s->shape, ","),
        "], expected [", absl::StrJoin(shape, ","), "]"));
  }
  return std::optional<WeightStorage>(*std::move(s));
}

bool SafetensorsCheckpoint::StoresFp8(const std::string& name) {
  absl::StatusOr<WeightStorage> s = Storage(name);
  return s.ok() && KeepableFp8(*s);
}

absl::StatusOr<std::optional<WeightSource::Fp8Tensor>> SafetensorsCheckpoint::ReadFp8(
    const std::string& name, const std::vector<int64_t>& shape) {
  const SafetensorsTensor* t = nullptr;
  const SafetensorsTensor* sc = nullptr;
  absl::StatusOr<std::optional<WeightStorage>> s_or =
      KeptStorage(name, shape, KeepableFp8, "FP8", &t, &sc);
  if (!s_or.ok()) return s_or.status();
  if (!s_or->has_value()) return std::nullopt;
  const WeightStorage& s = **s_or;
  Fp8Tensor out;
  out.data.assign(t->data, t->data + shape[0] * shape[1]);
  absl::Status st = ScaleValues(name, s, *sc, &out.scales);
  if (!st.ok()) return st;
  return std::optional<Fp8Tensor>(std::move(out));
}

bool SafetensorsCheckpoint::StoresMxfp4(const std::string& name) {
  absl::StatusOr<WeightStorage> s = Storage(name);
  return s.ok() && KeepableMxfp4(*s);
}

absl::StatusOr<std::optional<WeightSource::Mxfp4Tensor>> SafetensorsCheckpoint::ReadMxfp4(
    const std::string& name, const std::vector<int64_t>& shape) {
  const SafetensorsTensor* t = nullptr;
  const SafetensorsTensor* sc = nullptr;
  absl::StatusOr<std::optional<WeightStorage>> s_or =
      KeptStorage(name, shape, KeepableMxfp4, "MXFP4", &t, &sc);
  if (!s_or.ok()) return s_or.status();
  if (!s_or->has_value()) return std::nullopt;
  const WeightStorage& s = **s_or;
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  Mxfp4Tensor out;
  out.packed.assign(t->data, t->data + n / 2);
  out.scales.assign(sc->data, sc->data + n / 32);
  for (size_t i = 0; i < out.scales.size(); ++i) {
    if (out.scales[i] == 0xFF) {
      return absl::InvalidArgumentError(
          absl::StrCat("scale '", s.scale_name, "' of tensor '", name, "' element ", i,
                       " is nan (byte 0xff); block scales must be finite and non-negative"));
    }
  }
  return std::optional<Mxfp4Tensor>(std::move(out));
}

}  // namespace deepinfer
