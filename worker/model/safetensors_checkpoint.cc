// SafetensorsCheckpoint: index resolution, lazy shard mapping, dtype conversion, FP8 dequant.
#include "worker/model/safetensors_checkpoint.h"

#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace deepinfer {
namespace {

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

absl::Status SafetensorsCheckpoint::ReadFloat32(const std::string& name,
                                                const std::vector<int64_t>& shape, float* out) {
  std::string file;
  auto t_or = FindTensor(name, &file);
  if (!t_or.ok()) return t_or.status();
  const SafetensorsTensor& t = **t_or;
  if (t.shape != shape) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": tensor '", name, "' has shape [",
                                                   absl::StrJoin(t.shape, ","), "], expected [",
                                                   absl::StrJoin(shape, ","), "]"));
  }
  absl::Status st = ConvertToFloat32(t.dtype, t.data, t.num_elements(), out);
  if (!st.ok())
    return absl::InvalidArgumentError(absl::StrCat(file, ": tensor '", name, "': ", st.message()));
  if (t.dtype != DType::kF8E4M3) return absl::OkStatus();

  // FP8: multiply each block by its scale (DeepSeek's weight_dequant: y = x * s).
  if (shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": FP8 tensor '", name, "' must be 2-D for block scaling"));
  }
  const std::string scale_name = name + "_scale_inv";
  const int64_t rows = shape[0], cols = shape[1];
  const std::vector<int64_t> scale_shape = {(rows + block_rows_ - 1) / block_rows_,
                                            (cols + block_cols_ - 1) / block_cols_};
  std::vector<float> scale(scale_shape[0] * scale_shape[1]);
  if (!Contains(scale_name)) {
    return absl::NotFoundError(
        absl::StrCat(file, ": FP8 tensor '", name, "' has no scale '", scale_name, "'"));
  }
  st = ReadFloat32(scale_name, scale_shape, scale.data());
  if (!st.ok()) return st;
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = scale.data() + (r / block_rows_) * scale_shape[1];
    float* orow = out + r * cols;
    for (int64_t c = 0; c < cols; ++c) orow[c] *= srow[c / block_cols_];
  }
  return absl::OkStatus();
}

bool SafetensorsCheckpoint::StoresFp8(const std::string& name) {
  std::string file;
  auto t = FindTensor(name, &file);
  return t.ok() && (*t)->dtype == DType::kF8E4M3 && (*t)->shape.size() == 2 && block_rows_ == 128 &&
         block_cols_ == 128 && Contains(name + "_scale_inv");
}

absl::StatusOr<std::optional<WeightSource::Fp8Tensor>> SafetensorsCheckpoint::ReadFp8(
    const std::string& name, const std::vector<int64_t>& shape) {
  std::string file;
  auto t_or = FindTensor(name, &file);
  if (!t_or.ok()) return t_or.status();
  const SafetensorsTensor& t = **t_or;
  if (t.dtype != DType::kF8E4M3 || block_rows_ != 128 || block_cols_ != 128) return std::nullopt;
  if (t.shape != shape || shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": FP8 tensor '", name, "' has shape [",
                                                   absl::StrJoin(t.shape, ","), "], expected [",
                                                   absl::StrJoin(shape, ","), "] (2-D)"));
  }
  const std::string scale_name = name + "_scale_inv";
  if (!Contains(scale_name)) {
    return absl::NotFoundError(
        absl::StrCat(file, ": FP8 tensor '", name, "' has no scale '", scale_name, "'"));
  }
  Fp8Tensor out;
  const int64_t rows = shape[0], cols = shape[1];
  out.data.assign(static_cast<const uint8_t*>(t.data),
                  static_cast<const uint8_t*>(t.data) + rows * cols);
  out.scales.resize(((rows + 127) / 128) * ((cols + 127) / 128));
  absl::Status st =
      ReadFloat32(scale_name, {(rows + 127) / 128, (cols + 127) / 128}, out.scales.data());
  if (!st.ok()) return st;
  return std::optional<Fp8Tensor>(std::move(out));
}

}  // namespace deepinfer
