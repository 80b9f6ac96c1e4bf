// MoeDecodeFusedFp8 against a host reference in double on the dequantised weights (each e4m3 byte
// decoded by the loader's conversion, worker/model/dtype_conversion.h, times its block's scale):
// per token, each chosen expert's gate_up, silu(gate) * up, down, scaled by its routing weight and
// summed, plus the shared MLP computed whole (intermediate shared_parts * inter, its gate_up
// scale grid stacked at the gate / up boundary as the loader stacks it). 1 and 2 tokens,
// Moonlight's real shape and scaled-down ones, repeated experts across the two tokens, a
// non-identity slot table, an invalid expert id, all-subnormal e4m3 weights, top_k 0 (a dense
// MLP: the routed fields null), poisoned workspace and output, and the argument checks; every
// case run by each kernel pair (MoeDecodeFusedFp8Variant), kRowReuse also past its largest staged
// hidden size (where it runs kPerRow). kPipelined's own gate_up runs at 1 token where hidden <=
// 2048 (the Moonlight-like, V3-small, dense and Moonlight-size 1-token cases, also before
// kRowReuse's down past the stationary down's limit); elsewhere (hidden 4096 and 7168, V3's real
// sizes, 2 tokens) it runs kStationary's pair; its output must equal kStationary's bit for bit.
// kStationary's own down runs at 1 token where a feature has at most 3 x 384 chunks of 16 values
// ((top_k + shared_parts) * inter / 16): every 1-token case here but the one past that limit (where
// it runs kRowReuse's down) and those past kRowReuse's staged hidden size; its 2-chunk form up to
// 768 chunks (Moonlight's 704), its 3-chunk form above (the 896- and 1152-chunk cases: V3's real
// sizes); at V3's hidden (7168 features, 55 a block on 132 SMs) a block's features cross a 128-row
// scale block.
#include "kernels/moe/moe_decode_fused_fp8.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/fp8_test_util.h"
#include "kernels/testing/gpu_test_util.h"

namespace deepinfer {
namespace {

using kernels::fp8_testing::HostFp8;
using kernels::fp8_testing::MakeWeight;
using testing::DeviceArray;

struct Shape {
  int32_t experts, top_k, hidden, inter, shared_parts;
};

// y = down(silu(gate x) * up x) in double, gate_up [2 inter, hidden] and down [hidden, inter].
std::vector<double> HostMlp(const float* x, const HostFp8& gate_up, const HostFp8& down,
                            int64_t hidden, int64_t inter) {
  std::vector<double> act(inter), y(hidden, 0.0);
  for (int64_t j = 0; j < inter; ++j) {
    double g = 0, u = 0;
    for (int64_t p = 0; p < hidden; ++p) {
      g += x[p] * gate_up.At(j, p);
      u += x[p] * gate_up.At(inter + j, p);
    }
    act[j] = g / (1.0 + std::exp(-g)) * u;
  }
  for (int64_t f = 0; f < hidden; ++f) {
    double s = 0;
    for (int64_t j = 0; j < inter; ++j) s += act[j] * down.At(f, j);
    y[f] = s;
  }
  return y;
}

// Every byte of w replaced by a random e4m3 subnormal or zero (exponent field 0).
void MakeSubnormal(HostFp8* w, std::mt19937* gen) {
  std::uniform_int_distribution<int> d(0, 15);
  for (uint8_t& b : w->data) {
    const int r = d(*gen);
    b = static_cast<uint8_t>((r & 8) << 4 | (r & 7));
  }
}

// invalid_choice >= 0: token 0's choice of that index gets an expert id past the last expert.
void Check(const Shape& s, int32_t tokens, int32_t repeated, int32_t invalid_choice = -1,
           bool subnormal = false) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << "experts " << s.experts << " top_k " << s.top_k << " hidden " << s.hidden
               << " inter " << s.inter << " shared_parts " << s.shared_parts << " tokens " << tokens
               << " repeated " << repeated << " invalid choice " << invalid_choice << " subnormal "
               << subnormal << " seed " << seed);
  std::mt19937 gen(seed);
  const int64_t H = s.hidden, I = s.inter, SI = int64_t{s.shared_parts} * I;
  std::vector<HostFp8> gate_up, down;
  for (int32_t e = 0; e < s.experts; ++e) {
    gate_up.push_back(MakeWeight(2 * I, H, H, I, &gen));
    down.push_back(MakeWeight(H, I, I, 0, &gen));
    if (subnormal) MakeSubnormal(&gate_up.back(), &gen);
  }
  HostFp8 shared_gate_up, shared_down;
  if (SI > 0) {
    shared_gate_up = MakeWeight(2 * SI, H, H, SI, &gen);
    shared_down = MakeWeight(H, SI, SI, 0, &gen);
    if (subnormal) MakeSubnormal(&shared_gate_up, &gen);
  }
  const std::vector<float> hidden = testing::RandomFloats(tokens * H, seed + 1, 1.0f);

  // Routing: distinct ids ascending per token; token 1 repeats `repeated` of token 0's experts.
  std::vector<int32_t> all(s.experts), ids;
  std::iota(all.begin(), all.end(), 0);
  std::shuffle(all.begin(), all.end(), gen);
  std::vector<int32_t> first(all.begin(), all.begin() + s.top_k);
  ids = first;
  std::sort(ids.begin(), ids.end());
  if (tokens == 2) {
    // Token 1's top_k - repeated fresh experts come after token 0's top_k in `all`.
    ASSERT_LE(2 * s.top_k - repeated, s.experts) << "too few experts for two tokens' choices";
    std::vector<int32_t> second(first.begin(), first.begin() + repeated);
    for (int32_t j = s.top_k; static_cast<int32_t>(second.size()) < s.top_k; ++j) {
      second.push_back(all[j]);
    }
    std::sort(second.begin(), second.end());
    ids.insert(ids.end(), second.begin(), second.end());
  }
  if (invalid_choice >= 0) ids[invalid_choice] = s.experts + 3;
  std::uniform_real_distribution<float> uni(0.05f, 1.0f);
  std::vector<float> topk_w(tokens * s.top_k);
  for (float& v : topk_w) v = uni(gen);
  // Expert e lives in table entry slot_of[e] (reversed order).
  std::vector<int32_t> slot_of(s.experts);
  for (int32_t e = 0; e < s.experts; ++e) slot_of[e] = s.experts - 1 - e;

  std::vector<std::unique_ptr<DeviceArray<uint8_t>>> dw;
  std::vector<std::unique_ptr<DeviceArray<float>>> ds;
  auto upload = [&](const HostFp8& w, const uint8_t** data, const float** scales) {
    dw.push_back(std::make_unique<DeviceArray<uint8_t>>(w.data));
    ds.push_back(std::make_unique<DeviceArray<float>>(w.scales));
    *data = dw.back()->get();
    *scales = ds.back()->get();
  };
  std::vector<const uint8_t*> gu_table(s.experts), dn_table(s.experts);
  std::vector<const float*> gu_scales(s.experts), dn_scales(s.experts);
  for (int32_t e = 0; e < s.experts; ++e) {
    upload(gate_up[e], &gu_table[slot_of[e]], &gu_scales[slot_of[e]]);
    upload(down[e], &dn_table[slot_of[e]], &dn_scales[slot_of[e]]);
  }
  const uint8_t *sgu = nullptr, *sdn = nullptr;
  const float *sgu_scales = nullptr, *sdn_scales = nullptr;
  if (SI > 0) {
    upload(shared_gate_up, &sgu, &sgu_scales);
    upload(shared_down, &sdn, &sdn_scales);
  }
  const bool routed = s.top_k > 0;
  // Tables of at least one entry (a DeviceArray of none has no storage); null when unrouted.
  auto table = [](auto v) {
    if (v.empty()) v.resize(1);
    return DeviceArray<typename decltype(v)::value_type>(v);
  };
  auto dgu = table(gu_table);
  auto ddn = table(dn_table);
  auto dgus = table(gu_scales);
  auto ddns = table(dn_scales);
  DeviceArray<float> dhidden(hidden), dtopk_w(std::max<size_t>(1, topk_w.size()));
  if (!topk_w.empty()) dtopk_w.Upload(topk_w);
  auto dids = table(ids);
  auto dslot = table(slot_of);
  DeviceArray<float> dact(kernels::MoeDecodeFusedActFloats(tokens, s.top_k, s.shared_parts, I));
  DeviceArray<float> dout(tokens * H);

  std::vector<double> want(tokens * H, 0.0);
  for (int32_t t = 0; t < tokens; ++t) {
    const float* x = hidden.data() + t * H;
    double* o = want.data() + t * H;
    for (int32_t k = 0; k < s.top_k; ++k) {
      const int32_t e = ids[t * s.top_k + k];
      if (e >= s.experts) continue;
      const std::vector<double> y = HostMlp(x, gate_up[e], down[e], H, I);
      for (int64_t i = 0; i < H; ++i) o[i] += topk_w[t * s.top_k + k] * y[i];
    }
    if (SI > 0) {
      const std::vector<double> y = HostMlp(x, shared_gate_up, shared_down, H, SI);
      for (int64_t i = 0; i < H; ++i) o[i] += y[i];
    }
  }
  double scale = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));

  kernels::MoeDecodeFusedFp8Params p;
  p.num_tokens = tokens;
  p.top_k = s.top_k;
  p.num_experts = s.experts;
  p.hidden_size = s.hidden;
  p.inter = s.inter;
  p.hidden = dhidden.get();
  // top_k 0 (a dense MLP): the routed fields must not be read; null them (a read faults).
  p.topk_ids = routed ? dids.get() : nullptr;
  p.topk_weights = routed ? dtopk_w.get() : nullptr;
  p.slot_of_expert = routed ? dslot.get() : nullptr;
  p.gate_up = routed ? dgu.get() : nullptr;
  p.gate_up_scales = routed ? dgus.get() : nullptr;
  p.down = routed ? ddn.get() : nullptr;
  p.down_scales = routed ? ddns.get() : nullptr;
  if (routed) {
    p.gate_up_scale_ld = static_cast<int32_t>(gate_up[0].scale_ld);
    p.down_scale_ld = static_cast<int32_t>(down[0].scale_ld);
  }
  p.shared_parts = s.shared_parts;
  if (SI > 0) {
    p.shared_gate_up = sgu;
    p.shared_gate_up_scales = sgu_scales;
    p.shared_gate_up_scale_ld = static_cast<int32_t>(shared_gate_up.scale_ld);
    p.shared_gate_up_split_rows = static_cast<int32_t>(SI);
    p.shared_down = sdn;
    p.shared_down_scales = sdn_scales;
    p.shared_down_scale_ld = static_cast<int32_t>(shared_down.scale_ld);
  }
  p.act = dact.get();
  p.out = dout.get();

  std::vector<float> stationary_out;
  for (const kernels::MoeDecodeFusedFp8Variant variant :
       {kernels::MoeDecodeFusedFp8Variant::kPerRow, kernels::MoeDecodeFusedFp8Variant::kRowReuse,
        kernels::MoeDecodeFusedFp8Variant::kStationary,
        kernels::MoeDecodeFusedFp8Variant::kPipelined}) {
    SCOPED_TRACE(::testing::Message() << "variant " << static_cast<int>(variant));
    p.variant = variant;
    dact.Poison();
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MoeDecodeFusedFp8(p, nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dout.Download(&got));
    // fp32 sums of a few thousand products in another order (and the fp32 SiLU): far below 1e-4
    // of the largest output; a missing or doubled part, a wrong row, scale or routing weight, a
    // misdecoded byte is of the order of the output.
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_LE(std::abs(static_cast<double>(got[i]) - want[i]), 1e-4 * scale + 1e-30)
          << "element " << i << " got " << got[i] << " want " << want[i];
    }
    // kPipelined's gate_up forms kRowReuse's gate_up sums in the same order and is followed by
    // the down kStationary runs; where it does not apply kPipelined runs kStationary: the
    // outputs are equal bit for bit in every case.
    if (variant == kernels::MoeDecodeFusedFp8Variant::kStationary) stationary_out = got;
    if (variant == kernels::MoeDecodeFusedFp8Variant::kPipelined) {
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], stationary_out[i]) << "element " << i << " (kPipelined vs kStationary)";
      }
    }
  }
}

const Shape kMoonlightSmall{16, 6, 256, 96, 2};
const Shape kV3Small{32, 8, 512, 128, 1};

TEST(MoeDecodeFusedFp8Test, OneTokenMatchesHostReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check(kMoonlightSmall, 1, 0);
  Check(kV3Small, 1, 0);
  Check({16, 6, 256, 96, 0}, 1, 0);   // no shared experts
  Check({8, 2, 4096, 48, 3}, 1, 0);   // hidden beyond one unrolled chunk of the gate_up warp
  Check({8, 6, 256, 2048, 1}, 1, 0);  // a feature's parts beyond one down batch (896 chunks)
  Check({8, 6, 256, 4096, 1}, 1, 0);  // 1792 chunks: past kStationary's down (kRowReuse's runs)
  Check({16, 8, 256, 176, 3}, 1, 0);  // shared parts not on 128-column block boundaries
  Check({10, 8, 7168, 64, 1}, 1, 0);  // DeepSeek-V3's hidden size
  // Past kRowReuse's largest staged hidden size.
  Check({8, 2, kernels::kMoeDecodeFusedFp8MaxStagedHidden + 16, 48, 1}, 1, 0);
  Check({8, 2, kernels::kMoeDecodeFusedFp8MaxStagedHidden + 16, 48, 1}, 2, 1);
}

TEST(MoeDecodeFusedFp8Test, SubnormalWeightsMatchHostReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check(kMoonlightSmall, 1, 0, -1, /*subnormal=*/true);
  Check(kMoonlightSmall, 2, 2, -1, /*subnormal=*/true);
}

TEST(MoeDecodeFusedFp8Test, InvalidExpertIdContributesNothing) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check(kMoonlightSmall, 1, 0, /*invalid_choice=*/2);
}

TEST(MoeDecodeFusedFp8Test, TwoTokensWithRepeatedExpertsMatchHostReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check(kMoonlightSmall, 2, 0);
  Check(kMoonlightSmall, 2, 3);
  Check(kMoonlightSmall, 2, 6);  // the same experts for both tokens
  Check(kV3Small, 2, 5);
  Check({16, 8, 7168, 64, 1}, 2, 3);  // 2 x 28 KB of staged hidden rows
}

// top_k 0: a dense MLP as shared parts only (null routed fields), 1 and 2 tokens.
TEST(MoeDecodeFusedFp8Test, DenseMlpWithoutRoutingMatchesHostReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Check({0, 0, 256, 96, 8}, 1, 0);
  Check({0, 0, 512, 128, 9}, 1, 0);
  Check({0, 0, 256, 768, 1}, 1, 0);
  Check({0, 0, 256, 96, 8}, 2, 0);
}

// Moonlight's real sizes (hidden 2048, moe_intermediate 1408, 2 shared parts: 704 chunks of a
// feature), 8 experts, also with one choice invalid, and its dense layer (intermediate 11264 as
// one part).
TEST(MoeDecodeFusedFp8Test, MoonlightSizesMatchHostReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Shape moonlight{8, 6, 2048, 1408, 2};
  Check(moonlight, 1, 0);
  Check(moonlight, 1, 0, /*invalid_choice=*/3);  // kPipelined's ring past an invalid expert
  Check(moonlight, 2, 4);
  Check({0, 0, 2048, 11264, 1}, 1, 0);
}

// DeepSeek-V3's real sizes (hidden 7168, moe_intermediate 2048, top-8 and 1 shared part: 1152
// chunks of a feature, kStationary's largest), 8 experts, 1 token; one choice invalid.
TEST(MoeDecodeFusedFp8Test, V3SizesMatchHostReference) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Shape v3{8, 8, 7168, 2048, 1};
  Check(v3, 1, 0);
  Check(v3, 1, 0, /*invalid_choice=*/5);
}

TEST(MoeDecodeFusedFp8Test, RejectsBadArguments) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  DeviceArray<float> buf(64);
  DeviceArray<int32_t> ids(4);
  DeviceArray<const uint8_t*> table(1);
  DeviceArray<const float*> scales(1);
  DeviceArray<uint8_t> bytes(64);
  kernels::MoeDecodeFusedFp8Params p;
  p.num_tokens = 1;
  p.top_k = 1;
  p.num_experts = 1;
  p.hidden_size = 16;
  p.inter = 16;
  p.hidden = buf.get();
  p.topk_ids = ids.get();
  p.topk_weights = buf.get();
  p.slot_of_expert = ids.get();
  p.gate_up = table.get();
  p.gate_up_scales = scales.get();
  p.gate_up_scale_ld = 1;
  p.down = table.get();
  p.down_scales = scales.get();
  p.down_scale_ld = 1;
  p.act = buf.get();
  p.out = buf.get();
  auto expect_invalid = [](kernels::MoeDecodeFusedFp8Params q, const char* what) {
    EXPECT_EQ(kernels::MoeDecodeFusedFp8(q, nullptr), cudaErrorInvalidValue) << what;
  };
  kernels::MoeDecodeFusedFp8Params q = p;
  q.num_tokens = 3;
  expect_invalid(q, "3 tokens");
  q = p;
  q.hidden_size = 24;
  expect_invalid(q, "hidden not a multiple of 16");
  q = p;
  q.inter = 8;
  expect_invalid(q, "inter not a multiple of 16");
  q = p;
  q.gate_up_scale_ld = 0;
  expect_invalid(q, "short gate_up scale stride");
  q = p;
  q.down_scales = nullptr;
  expect_invalid(q, "null down scales");
  q = p;
  q.shared_parts = 1;
  expect_invalid(q, "shared parts without weights");
  q.shared_gate_up = bytes.get() + 1;
  q.shared_gate_up_scales = buf.get();
  q.shared_gate_up_scale_ld = 1;
  q.shared_down = bytes.get();
  q.shared_down_scales = buf.get();
  q.shared_down_scale_ld = 1;
  expect_invalid(q, "misaligned shared gate_up");
  q = p;
  q.top_k = kernels::kMoeDecodeFusedMaxParts + 1;
  expect_invalid(q, "too many parts");
  q = p;
  q.hidden = buf.get() + 1;
  expect_invalid(q, "misaligned hidden");
  q = p;
  q.out = nullptr;
  expect_invalid(q, "null out");
  q = p;
  q.top_k = 0;
  expect_invalid(q, "no routed experts and no shared parts");
  q = p;
  q.topk_ids = nullptr;
  expect_invalid(q, "null topk_ids with top_k > 0");
  q = p;
  q.variant = static_cast<kernels::MoeDecodeFusedFp8Variant>(5);
  expect_invalid(q, "unknown variant");
}

}  // namespace
}  // namespace deepinfer
