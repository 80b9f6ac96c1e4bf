// DummyWeightSource: counter-based values keyed by a hash of the tensor name.
#include "worker/model/dummy_weight_source.h"

#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/sampling/counter_rng.h"

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

absl::Status DummyWeightSource::ReadFloat32(const std::string& name,
                                            const std::vector<int64_t>& shape, float* out) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (absl::StrContains(name, "norm")) {
    for (int64_t i = 0; i < n; ++i) out[i] = 1.0f;
    return absl::OkStatus();
  }
  const uint64_t key = seed_ ^ Fnv1a(name);
  float amplitude;
  if (absl::StrContains(name, "e_score_correction_bias")) {
    amplitude = 0.05f;
  } else if (absl::StrContains(name, "embed_tokens")) {
    amplitude = std::sqrt(3.0f);  // unit variance
  } else {
    const int64_t fan_in = shape.empty() ? 1 : shape.back();
    amplitude = std::sqrt(3.0f / static_cast<float>(fan_in));
  }
  for (int64_t i = 0; i < n; ++i) {
    out[i] = (2.0f * CounterRng::Uniform(key, 0, i) - 1.0f) * amplitude;
  }
  return absl::OkStatus();
}

std::string DummyWeightSource::description() const {
  return absl::StrCat("dummy(seed=", seed_, ")");
}

}  // namespace deepinfer
