// SafetensorsCheckpoint: a WeightSource over a checkpoint directory, either sharded through
// model.safetensors.index.json or a single model.safetensors. Shards are memory-mapped when
// first needed, so a rank that hosts few experts touches only their pages. Quantised weights
// are dequantised on the host with their scale tensor (weight_storage.h lists the kinds):
//   * FP8 (F8_E4M3): one multiplier per block_rows x block_cols block (DeepSeek: 128 x 128),
//     float32 or E8M0 exponent bytes (F8_E8M0 or U8, 2^(b - 127));
//   * MXFP4 (U8 / I8 packed two E2M1 values a byte, or F4): one E8M0 scale per 32 values of a
//     row.
// The scale of weight `N` is `N_scale_inv`, `N_scale` or, for `P.weight`, `P.scale` (DeepSeek's
// own naming); exactly one of them may exist.
#ifndef DEEPINFER_WORKER_MODEL_SAFETENSORS_CHECKPOINT_H_
#define DEEPINFER_WORKER_MODEL_SAFETENSORS_CHECKPOINT_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/model/safetensors_file.h"
#include "worker/model/weight_source.h"

namespace deepinfer {

class SafetensorsCheckpoint : public WeightSource {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& dir,
                                                                     int64_t fp8_block_rows = 128,
                                                                     int64_t fp8_block_cols = 128);

  absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                           float* out) override;
  // F8_E4M3 matrices of a checkpoint with 128 x 128 blocks, with float32, BF16, F16 or UE8M0
  // (F8_E8M0 / U8) scales under any of the scale names above; nullopt for other storage.
  absl::StatusOr<std::optional<Fp8Tensor>> ReadFp8(const std::string& name,
                                                   const std::vector<int64_t>& shape) override;
  bool StoresFp8(const std::string& name) override;
  // MXFP4 weights (U8 / I8 packed, or F4) whose scales are E8M0 bytes (F8_E8M0 or U8) and whose
  // rows are whole 32-value blocks; nullopt for other storage (float scales among them).
  absl::StatusOr<std::optional<Mxfp4Tensor>> ReadMxfp4(const std::string& name,
                                                       const std::vector<int64_t>& shape) override;
  bool StoresMxfp4(const std::string& name) override;
  bool Contains(const std::string& name) const override;
  std::string ShardOf(const std::string& name) const override;
  absl::StatusOr<WeightStorage> Storage(const std::string& name) override;
  // I8 .. I64, U8 .. U64 tensors.
  absl::Status ReadIndices(const std::string& name, const std::vector<int64_t>& shape,
                           int64_t bound, int32_t* out) override;
  std::string description() const override { return dir_; }

 private:
  SafetensorsCheckpoint(std::string dir, int64_t br, int64_t bc)
      : dir_(std::move(dir)), block_rows_(br), block_cols_(bc) {}
  // The mapped shard holding `name` (opened on first use), or an error.
  absl::StatusOr<const SafetensorsTensor*> FindTensor(const std::string& name, std::string* file);
  // Storage, with the weight and scale tensors it describes.
  absl::StatusOr<WeightStorage> Describe(const std::string& name, const SafetensorsTensor** weight,
                                         const SafetensorsTensor** scale, std::string* file);
  // Describe's storage of `name` where `keepable` takes it as stored and its shape is `shape`
  // (`kind` names the format in the error); nullopt where `keepable` does not take it.
  absl::StatusOr<std::optional<WeightStorage>> KeptStorage(const std::string& name,
                                                           const std::vector<int64_t>& shape,
                                                           bool (*keepable)(const WeightStorage&),
                                                           const char* kind,
                                                           const SafetensorsTensor** weight,
                                                           const SafetensorsTensor** scale);

  const std::string dir_;
  const int64_t block_rows_, block_cols_;
  std::map<std::string, std::string> weight_map_;  // tensor -> shard file name
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> shards_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_SAFETENSORS_CHECKPOINT_H_
