// Backend helpers shared by every implementation: weight dtypes, weight upload, and the
// reference RouteTokens.
#include "worker/backend/backend.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/backend/bf16.h"

namespace deepinfer {

const char* WeightDTypeName(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::kBFloat16:
      return "bfloat16";
    case WeightDType::kFp8E4M3:
      return "float8_e4m3";
    case WeightDType::kMxfp4E2M1:
      return "mxfp4_e2m1";
    case WeightDType::kFloat32:
      break;
  }
  return "float32";
}

size_t WeightDTypeSize(WeightDType dtype) {
  switch (dtype) {
    case WeightDType::kBFloat16:
      return 2;
    case WeightDType::kFp8E4M3:
    case WeightDType::kMxfp4E2M1:
      return 1;
    case WeightDType::kFloat32:
      break;
  }
  return 4;
}

absl::StatusOr<WeightDType> ParseWeightDType(const std::string& name) {
  if (name == "float32" || name == "fp32") return WeightDType::kFloat32;
  if (name == "bfloat16" || name == "bf16") return WeightDType::kBFloat16;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown weight dtype '", name, "' (expected bfloat16 or float32)"));
}

void Backend::AddRmsNormGemms(int64_t rows, int64_t dim, float* x, const float* y,
                              const float* weight, float eps, float* normed, uint16_t* normed_bf16,
                              const std::vector<NormedGemm>& gemms) {
  AddRmsNorm(rows, dim, x, y, weight, eps, normed_bf16 != nullptr ? nullptr : normed, normed_bf16);
  const ActivationView a =
      normed_bf16 != nullptr ? ActivationView::Bf16(normed_bf16) : ActivationView(normed);
  for (const NormedGemm& g : gemms) Gemm(rows, g.n, dim, a, dim, g.w, g.ldw, g.c, g.ldc, false);
}

namespace {

class PlainStagingBuffer : public HostStagingBuffer {
 public:
  explicit PlainStagingBuffer(size_t bytes) : data_(std::max<size_t>(bytes, 1)), bytes_(bytes) {}
  void* data() override { return data_.data(); }
  size_t size_bytes() const override { return bytes_; }

 private:
  std::vector<char> data_;
  size_t bytes_;
};

}  // namespace

std::unique_ptr<HostStagingBuffer> Backend::AllocateHostStaging(size_t bytes) {
  return std::make_unique<PlainStagingBuffer>(bytes);
}

std::unique_ptr<DeviceBuffer> Backend::UploadWeight(const float* host, int64_t n) {
  const WeightDType dtype = weight_dtype();
  auto buf = Allocate(static_cast<size_t>(n) * WeightDTypeSize(dtype));
  if (dtype == WeightDType::kFloat32) {
    CopyToDevice(host, n * sizeof(float), buf->data());
    return buf;
  }
  std::vector<uint16_t> bits(n);
  for (int64_t i = 0; i < n; ++i) bits[i] = FloatToBf16Bits(host[i]);
  CopyToDevice(bits.data(), n * sizeof(uint16_t), buf->data());
  return buf;
}

void Backend::FillDummy(const DummyFill& fill, int64_t n, WeightDType dtype, void* out) {
  constexpr int64_t kSlice = int64_t{1} << 20;  // bounds the host staging buffer
  const bool bf16 = dtype == WeightDType::kBFloat16;
  std::vector<float> values;
  std::vector<uint16_t> bits;
  for (int64_t first = 0; first < n; first += kSlice) {
    const int64_t count = std::min(kSlice, n - first);
    char* dst = static_cast<char*>(out) + first * static_cast<int64_t>(WeightDTypeSize(dtype));
    if (bf16) {
      bits.resize(count);
      for (int64_t i = 0; i < count; ++i)
        bits[i] = FloatToBf16Bits(DummyFillValue(fill, first + i));
      CopyToDevice(bits.data(), count * sizeof(uint16_t), dst);
    } else {
      values.resize(count);
      for (int64_t i = 0; i < count; ++i) values[i] = DummyFillValue(fill, first + i);
      CopyToDevice(values.data(), count * sizeof(float), dst);
    }
  }
}

void Backend::RouteTokens(const RouteTokensArgs& a) {
  const int64_t T = a.route.num_tokens, E = a.route.num_experts;
  if (T <= 0) return;
  const float* hidden = a.hidden;
  if (a.norm.weight != nullptr) {
    const RouteTokensArgs::Norm& n = a.norm;
    AddRmsNorm(T, a.hidden_size, n.x, n.y, n.weight, n.eps, n.out, n.out_bf16);
    hidden = n.out;
  }
  auto logits = AllocateScratch(static_cast<size_t>(T * E) * sizeof(float));
  Gemm(T, E, a.hidden_size, hidden, a.hidden_size, a.router_weight, a.hidden_size,
       logits->as<float>(), E, false);
  NoauxTcRouteArgs route = a.route;
  route.router_logits = logits->as<float>();
  NoauxTcRoute(route);
  if (a.expert_counts != nullptr) {
    AccumulateExpertCounts(T * a.route.top_k, a.route.topk_ids, E, a.count_limit, a.expert_counts);
  }
}

void Backend::MaskLogitsRows(int64_t n, int64_t vocab, float* logits, const int32_t* rows,
                             const uint32_t* masks) {
  if (n <= 0) return;
  const int64_t words = (vocab + 31) / 32;
  std::vector<int32_t> host_rows(n);
  std::vector<uint32_t> host_masks(n * words);
  CopyToHost(rows, n * sizeof(int32_t), host_rows.data());
  CopyToHost(masks, n * words * sizeof(uint32_t), host_masks.data());
  std::vector<float> row(vocab);
  for (int64_t i = 0; i < n; ++i) {
    float* device_row = logits + static_cast<int64_t>(host_rows[i]) * vocab;
    CopyToHost(device_row, vocab * sizeof(float), row.data());
    const uint32_t* m = host_masks.data() + i * words;
    for (int64_t t = 0; t < vocab; ++t) {
      if (!(m[t >> 5] >> (t & 31) & 1u)) row[t] = -std::numeric_limits<float>::infinity();
    }
    CopyToDevice(row.data(), vocab * sizeof(float), device_row);
  }
}

}  // namespace deepinfer
