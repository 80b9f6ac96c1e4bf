// Mxfp4ExpertValuesSource: a weight source with every routed-expert tensor replaced by its MXFP4
// values in fp32 (rows of the last dimension in blocks of 32, as the device stores them): the
// checkpoint's MXFP4 bytes and scales as stored (WeightSource::ReadMxfp4), else the inner
// source's values quantised with the loader's quantiser (QuantizeMxfp4), dequantised here from
// the format's definition (an E2M1 code: sign bit 3, magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; times
// 2^(b - 127) for the block's UE8M0 byte b). A model loaded from it in fp32 computes with the
// expert values a `--dtype mxfp4` load of the inner source keeps on the device
// (cuda_v4_mxfp4_test's reference).
#ifndef DEEPINFER_TESTS_PARITY_MXFP4_EXPERT_VALUES_SOURCE_H_
#define DEEPINFER_TESTS_PARITY_MXFP4_EXPERT_VALUES_SOURCE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "worker/model/weight_source.h"

namespace deepinfer {

// HF's (`.mlp.experts.`) and the release's (`.ffn.experts.`, MTP modules) routed-expert names.
bool IsRoutedExpert(const std::string& name);

// HF's fused routed-expert tensors (`.mlp.experts.gate_up_proj` [E, 2I, H], `.down_proj`).
bool IsFusedExperts(const std::string& name);

// An E2M1 code's value (OCP Microscaling Formats v1.0, FP4 E2M1).
float E2m1Value(uint8_t code);

class Mxfp4ExpertValuesSource : public WeightSource {
 public:
  explicit Mxfp4ExpertValuesSource(WeightSource* inner) : inner_(inner) {}
  absl::Status ReadFloat32(const std::string& name, const std::vector<int64_t>& shape,
                           float* out) override;
  bool Contains(const std::string& name) const override { return inner_->Contains(name); }
  absl::StatusOr<WeightStorage> Storage(const std::string& name) override {
    return inner_->Storage(name);
  }
  absl::Status ReadIndices(const std::string& name, const std::vector<int64_t>& shape,
                           int64_t bound, int32_t* out) override {
    return inner_->ReadIndices(name, shape, bound, out);
  }
  // The inner source's recipes but for a routed expert's own tensors, which are read (above).
  // HF's fused expert tensors keep the inner's answer: DeepseekV4Weights asks it to choose the
  // layout (a generated source's experts are made per expert; the dummy format also generates
  // fused tensors, with other values), so this source's experts are the same tensors.
  std::optional<DummyFill> DummyFillFor(const std::string& name,
                                        const std::vector<int64_t>& shape) const override {
    return IsRoutedExpert(name) && !IsFusedExperts(name) ? std::nullopt
                                                         : inner_->DummyFillFor(name, shape);
  }
  std::string ShardOf(const std::string& name) const override { return inner_->ShardOf(name); }
  std::string description() const override { return "mxfp4 values of " + inner_->description(); }

 private:
  WeightSource* inner_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_TESTS_PARITY_MXFP4_EXPERT_VALUES_SOURCE_H_
