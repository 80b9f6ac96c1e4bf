// DummyWeightSource: the `dummy` load format. Produces random weights for any tensor name and
// shape from a seed alone, so full-size shapes can be benchmarked without checkpoint files.
// Values are a pure function of (seed, tensor name, element index), so every rank generates
// the same weights for the tensors it hosts. Scales keep activations O(1): matrices are
// uniform with variance 1/in_features, norm weights are 1, correction biases small.
#ifndef DEEPINFER_WORKER_MODEL_DUMMY_WEIGHT_SOURCE_H_
#define DEEPINFER_WORKER_MODEL_DUMMY_WEIGHT_SOURCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/backend/dummy_fill.h"
#include "worker/model/weight_source.h"

namespace deepinfer {

// The recipe of a dummy tensor (the rules above); element i is DummyFillValue(fill, i).
DummyFill DummyTensorFill(uint64_t seed, const std::string& name,
                          const std::vector<int64_t>& shape);

class DummyWeightSource : public WeightSource {
 public:
  explicit DummyWeightSource(uint64_t seed) : seed_(seed) {}

  absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                           float* out) override;
  // Row r (the last dimension's runs) holds (h(r) + j) mod bound for j = 0, 1, ...: distinct
  // experts per token when a row is no longer than `bound`.
  absl::Status ReadIndices(const std::string& name, const std::vector<int64_t>& shape,
                           int64_t bound, int32_t* out) override;
  bool Contains(const std::string& name) const override { return true; }
  std::optional<DummyFill> DummyFillFor(const std::string& name,
                                        const std::vector<int64_t>& shape) const override {
    return DummyTensorFill(seed_, name, shape);
  }
  std::string description() const override;

 private:
  const uint64_t seed_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DUMMY_WEIGHT_SOURCE_H_
