// Mxfp4ExpertValuesSource: MXFP4 bytes and scales of a routed expert, dequantised.
#include "tests/parity/mxfp4_expert_values_source.h"

#include <cmath>

#include "absl/strings/match.h"
#include "worker/model/mxfp4_quantize.h"

namespace deepinfer {

bool IsRoutedExpert(const std::string& name) {
  return name.find(".mlp.experts.") != std::string::npos ||
         name.find(".ffn.experts.") != std::string::npos;
}

bool IsFusedExperts(const std::string& name) {
  return absl::EndsWith(name, ".mlp.experts.gate_up_proj") ||
         absl::EndsWith(name, ".mlp.experts.down_proj");
}

float E2m1Value(uint8_t code) {
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMagnitude[code & 7];
  return (code & 8) != 0 ? -m : m;
}

absl::Status Mxfp4ExpertValuesSource::ReadFloat32(const std::string& name,
                                                  const std::vector<int64_t>& shape, float* out) {
  if (!IsRoutedExpert(name)) return inner_->ReadFloat32(name, shape, out);
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  std::vector<uint8_t> packed(n / 2), scales(n / kMxfp4Block);
  if (inner_->StoresMxfp4(name)) {
    auto t = inner_->ReadMxfp4(name, shape);
    if (!t.ok()) return t.status();
    if (!t->has_value()) return absl::InternalError(name + ": no MXFP4 bytes");
    packed = (*t)->packed;
    scales = (*t)->scales;
  } else {
    absl::Status st = inner_->ReadFloat32(name, shape, out);
    if (!st.ok()) return st;
    const int64_t cols = shape.back();
    st = QuantizeMxfp4(out, n / cols, cols, packed.data(), scales.data(), name.c_str());
    if (!st.ok()) return st;
  }
  if (static_cast<int64_t>(packed.size()) != n / 2 ||
      static_cast<int64_t>(scales.size()) != n / kMxfp4Block) {
    return absl::InternalError(name + ": MXFP4 sizes");
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t code = (i % 2 == 0) ? packed[i / 2] & 0xF : packed[i / 2] >> 4;
    out[i] = E2m1Value(code) * std::ldexp(1.0f, static_cast<int>(scales[i / kMxfp4Block]) - 127);
  }
  return absl::OkStatus();
}

}  // namespace deepinfer
