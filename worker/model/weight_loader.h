// WeightLoader: makes a model's device buffers from a WeightSource, the way every model loads
// (ModelWeights for DeepSeek-V3, DeepseekV4Weights for V4):
//   * generated (dummy-format) tensors are made in place by the backend at once
//     (Backend::FillDummy: on the device with CUDA), each with its own recipe, also where two
//     tensors are stacked into one buffer ([gate; up]);
//   * checkpoint tensors become WeightUploader jobs, read, converted and uploaded by Finish()
//     (on LoadOptions::load_threads threads with staging buffers; the same bytes either way).
// Buffers of jobs are set only when Finish() returns: what `out` points to must stay where it is
// until then (no vector that holds it may grow).
//
// Not thread-safe: one thread adds the tensors and calls Finish().
#ifndef DEEPINFER_WORKER_MODEL_WEIGHT_LOADER_H_
#define DEEPINFER_WORKER_MODEL_WEIGHT_LOADER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/backend.h"
#include "worker/model/model_weights.h"
#include "worker/model/weight_source.h"
#include "worker/model/weight_uploader.h"

namespace deepinfer {

// 128-element blocks covering n (an FP8 scale grid's rows or columns).
int64_t Fp8ScaleBlocks(int64_t n);
// The device scale rows' stride for `cols` columns: the block count rounded up to 4 (the CUDA
// kernels' kernels::Fp8ScaleLd; cuBLASLt's 128 x 128 block scaling needs a multiple of 4), the
// padding columns zero.
int64_t Fp8ScaleStride(int64_t cols);

// LoadOptions' threads (0: the machine's hardware threads, at most 8) and staging bound.
WeightUploadOptions UploadOptionsOf(const LoadOptions& options);

class WeightLoader {
 public:
  // `keep_fp8`: LoadOptions::keep_fp8 (null: every matrix in the backend's weight dtype).
  WeightLoader(WeightSource* src, Backend* be,
               std::function<bool(const std::string&)> keep_fp8 = nullptr,
               WeightUploadOptions upload = {});

  // Device bytes of everything made or added so far.
  int64_t bytes() const { return bytes_ + uploader_.bytes(); }
  // Runs the jobs added since the last Finish(); the first error.
  absl::Status Finish() { return uploader_.Run(); }
  WeightSource* source() const { return src_; }

  static int64_t Elements(const std::vector<int64_t>& shape);

  // Now: a generated tensor of n elements made by the backend as dtype; fp32 values (vectors);
  // values in the backend's weight dtype.
  std::unique_ptr<DeviceBuffer> Fill(const DummyFill& fill, int64_t n, WeightDType dtype);
  std::unique_ptr<DeviceBuffer> Upload(const std::vector<float>& v);
  std::unique_ptr<DeviceBuffer> UploadMatrix(const std::vector<float>& v);

  // fp32 (vectors, embedding, router).
  absl::Status Load(const std::string& name, const std::vector<int64_t>& shape,
                    std::unique_ptr<DeviceBuffer>* out);
  // In the backend's weight dtype.
  absl::Status LoadMatrix(const std::string& name, const std::vector<int64_t>& shape,
                          std::unique_ptr<DeviceBuffer>* out);
  // A 2-D matrix, FP8 with its scales where KeepsFp8(name), else in the weight dtype.
  absl::Status LoadMatrix(const std::string& name, const std::vector<int64_t>& shape,
                          MatrixBuffer* out);
  // Matrices names[i] [rows[i], cols] stacked by rows into one [sum of rows, cols] matrix,
  // names[0]'s rows first, each part's values as LoadMatrix would make them: FP8 with the parts'
  // scale grids stacked where every part is kept FP8 (MatrixBuffer::split_rows: where the second
  // part's grid starts, 0 where the first part's rows fill whole 128-row blocks; at most two
  // parts then), made in place with each part's own recipe where the source generates every
  // part, else read and converted to the weight dtype. Stacks() says whether the parts allow it.
  bool Stacks(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
              int64_t cols);
  absl::Status LoadStacked(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                           int64_t cols, MatrixBuffer* out);
  // A SwiGLU MLP: gate and up [inter, hidden] stacked into one [2 * inter, hidden] matrix (FP8
  // where both are kept FP8: the bytes and the scale grids stacked, split at inter rows), down
  // [hidden, inter]. The first form names them prefix + {gate,up,down}_proj.weight.
  absl::Status LoadMlp(const std::string& gate, const std::string& up, const std::string& down,
                       int64_t hidden, int64_t inter, MlpWeights* m);
  absl::Status LoadMlp(const std::string& prefix, int64_t hidden, int64_t inter, MlpWeights* m);
  // A routed expert in MXFP4 (LoadOptions::mxfp4_experts): [gate; up] [2 * inter, hidden] and
  // down [hidden, inter], each packed e2m1 with its UE8M0 scales (MatrixBuffer::mx_scales): the
  // checkpoint's bytes and scales as stored where it stores all three MXFP4
  // (WeightSource::StoresMxfp4), else quantised on the host from the fp32 values
  // (worker/model/mxfp4_quantize.h). INVALID_ARGUMENT for hidden or inter not a multiple of 32.
  absl::Status LoadMxfp4Mlp(const std::string& gate, const std::string& up, const std::string& down,
                            int64_t hidden, int64_t inter, MlpWeights* m);
  // LoadFusedExperts' experts in MXFP4, as LoadMxfp4Mlp makes them: each fused tensor's bytes and
  // scales sliced as stored where the source stores it MXFP4, else quantised from its values.
  absl::Status LoadFusedMxfp4Experts(const std::string& gate_up, const std::string& down,
                                     int64_t num_experts, int64_t hidden, int64_t inter,
                                     const std::vector<int64_t>& experts,
                                     std::map<int64_t, MlpWeights>* out);
  // Routed experts stored fused, HF's layout: gate_up [E, 2 * inter, hidden] and down
  // [E, hidden, inter]; experts[i] of them into (*out)[experts[i]] (each tensor read once).
  void LoadFusedExperts(const std::string& gate_up, const std::string& down, int64_t num_experts,
                        int64_t hidden, int64_t inter, const std::vector<int64_t>& experts,
                        std::map<int64_t, MlpWeights>* out);
  // An integer table (WeightSource::ReadIndices: every value in [0, bound)), int32 on the
  // device.
  void LoadIndices(const std::string& name, const std::vector<int64_t>& shape, int64_t bound,
                   std::unique_ptr<DeviceBuffer>* out);
  // kv_b_proj as the checkpoint has it [heads * (nope + v), kv_lora], and its key half
  // transposed per head, W_uk^T [heads, kv_lora, nope].
  void LoadKvB(const std::string& name, int64_t nh, int64_t nope, int64_t vd, int64_t kvl,
               std::unique_ptr<DeviceBuffer>* kv_b, std::unique_ptr<DeviceBuffer>* uk_t);
  // Whether `name` stays FP8 on the device: keep_fp8 names it and the source stores it so.
  bool KeepsFp8(const std::string& name);
  // Whether the source generates `name` (the dummy format).
  bool Generated(const std::string& name, const std::vector<int64_t>& shape) const {
    return src_->DummyFillFor(name, shape).has_value();
  }

 private:
  // A job making matrices of `elements` each in the weight dtype from fp32 values that `read`
  // writes into vectors of those sizes (and `extra_scratch` bytes of its own meanwhile).
  void AddMatrices(const std::string& shard, const std::vector<int64_t>& elements,
                   std::vector<std::unique_ptr<DeviceBuffer>*> outs,
                   std::function<absl::Status(std::vector<std::vector<float>>*)> read,
                   int64_t extra_scratch = 0);
  // FP8 bytes as stored and their scales' rows (Fp8ScaleBlocks(cols) each) with the stride
  // Fp8ScaleStride(cols), the padding zero, of the tensors names[i], [rows[i], cols], stacked
  // by rows, the scale grids one after the other; out->split_rows = split_rows.
  void LoadFp8(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
               int64_t cols, int64_t split_rows, MatrixBuffer* out);

  WeightSource* src_;
  Backend* be_;
  const std::function<bool(const std::string&)> keep_fp8_;
  WeightUploader uploader_;
  int64_t bytes_ = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_WEIGHT_LOADER_H_
