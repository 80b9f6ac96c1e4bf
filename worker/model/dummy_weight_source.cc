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
  // Router correction biases: HF's name, and the release's (`gate.bias`, DeepSeek-V4's MTP).
  if (absl::StrContains(name, "e_score_correction_bias") || absl::EndsWith(name, ".gate.bias")) {
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

absl::Status DummyWeightSource::ReadIndices(const std::string& name,
                                            const std::vector<int64_t>& shape, int64_t bound,
                                            int32_t* out) {
  if (bound < 1 || bound > (int64_t{1} << 31)) {
    return absl::InvalidArgumentError(
        absl::StrCat(description(), ": bound ", bound, " for '", name, "' is not in [1, 2^31]"));
  }
  const int64_t cols = shape.empty() ? 1 : shape.back();
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const uint64_t key = seed_ ^ Fnv1a(name);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = cols > 0 ? i / cols : 0, j = cols > 0 ? i % cols : 0;
    uint64_t h = key + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(row + 1);  // SplitMix64
    h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
    h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
    h ^= h >> 31;
    out[i] = static_cast<int32_t>((h % static_cast<uint64_t>(bound) + j) % bound);
  }
  return absl::OkStatus();
}

std::string DummyWeightSource::description() const {
  return absl::StrCat("dummy(seed=", seed_, ")");
}

}  // namespace deepinfer
