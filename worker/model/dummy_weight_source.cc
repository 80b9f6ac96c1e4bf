// DummyWeightSource: counter-based values keyed by a hash of the tensor name.
#include "worker/model/dummy_weight_source.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

uint64_t Fnv1a(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

DummyFill DummyTensorFill(uint64_t seed, const std::string& name,
                          const std::vector<int64_t>& shape) {
  DummyFill fill;
  if (absl::StrContains(name, "norm")) {
    fill.constant = true;
    fill.value = 1.0f;
    return fill;
  }
  fill.key = seed ^ Fnv1a(name);
  if (absl::StrContains(name, "e_score_correction_bias")) {
    fill.amplitude = 0.05f;
  } else if (absl::StrContains(name, "embed_tokens")) {
    fill.amplitude = std::sqrt(3.0f);  // unit variance
  } else {
    const int64_t fan_in = shape.empty() ? 1 : shape.back();
    fill.amplitude = std::sqrt(3.0f / static_cast<float>(fan_in));
  }
  return fill;
}

absl::Status DummyWeightSource::ReadFloat32(const std::string& name,
                                            const std::vector<int64_t>& shape, float* out) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const DummyFill fill = DummyTensorFill(seed_, name, shape);
  for (int64_t i = 0; i < n; ++i) out[i] = DummyFillValue(fill, i);
  return absl::OkStatus();
}

std::string DummyWeightSource::description() const {
  return absl::StrCat("dummy(seed=", seed_, ")");
}

}  // namespace deepinfer
