// CheckpointWithGeneratedMtp: a checkpoint's tensors, and generated ones (DummyWeightSource) for
// those it lacks: the HF fixtures keep no MTP module, so the speculative tests give the fixture's
// model a generated draft head.
#ifndef DEEPINFER_WORKER_ENGINE_GENERATED_MTP_SOURCE_H_
#define DEEPINFER_WORKER_ENGINE_GENERATED_MTP_SOURCE_H_

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "worker/model/dummy_weight_source.h"
#include "worker/model/weight_source.h"

namespace deepinfer {

class CheckpointWithGeneratedMtp : public WeightSource {
 public:
  explicit CheckpointWithGeneratedMtp(std::unique_ptr<WeightSource> base)
      : base_(std::move(base)), dummy_(7) {}
  absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                           float* out) override {
    if (base_->Contains(name)) return base_->ReadFloat32(name, shape, out);
    return dummy_.ReadFloat32(name, shape, out);
  }
  bool Contains(const std::string& name) const override { return true; }
  std::optional<DummyFill> DummyFillFor(const std::string& name,
                                        const std::vector<int64_t>& shape) const override {
    if (base_->Contains(name)) return std::nullopt;
    return dummy_.DummyFillFor(name, shape);
  }
  std::string description() const override { return base_->description() + " + generated MTP"; }

 private:
  std::unique_ptr<WeightSource> base_;
  DummyWeightSource dummy_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_GENERATED_MTP_SOURCE_H_
