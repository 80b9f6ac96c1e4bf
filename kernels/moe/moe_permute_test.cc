// MoePermuteF32 / MoeCombineF32 against the CPU reference (moe_reference.h) on fresh random
// routing: ids in random order within a token, slot maps with experts not hosted here (expert
// parallelism) and in non-monotone order, and a few invalid ids. The permutation must match
// exactly (it is deterministic), the combine bit for bit; outputs are poisoned first. Last, the
// whole device path permute -> grouped GEMM (offsets never leave the device) -> combine.
#include "kernels/moe/moe_permute.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe/grouped_gemm.h"
#include "kernels/moe/moe_reference.h"
#include "kernels/testing/gpu_test_util.h"

namespace deepinfer {
namespace {

using testing::DeviceArray;

struct Routing {
  int32_t tokens, top_k, experts, slots;
  std::vector<int32_t> ids, slot_of_expert;
  std::vector<float> weights;
};

// Distinct experts per token in random order; `hosted` of them map to slots in shuffled order.
// invalid_every > 0 replaces every n-th id by -1 or num_experts.
Routing MakeRouting(int32_t tokens, int32_t top_k, int32_t experts, int32_t hosted,
                    int invalid_every, uint32_t seed) {
  std::mt19937 gen(seed);
  Routing r{tokens, top_k, experts, hosted, {}, std::vector<int32_t>(experts, -1), {}};
  std::vector<int32_t> perm(experts);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), gen);
  for (int32_t s = 0; s < hosted; ++s) r.slot_of_expert[perm[s]] = s;
  for (int32_t t = 0; t < tokens; ++t) {
    std::shuffle(perm.begin(), perm.end(), gen);
    r.ids.insert(r.ids.end(), perm.begin(), perm.begin() + top_k);
  }
  if (invalid_every > 0) {
    for (size_t i = 0; i < r.ids.size(); i += invalid_every) r.ids[i] = i % 2 ? -1 : experts;
  }
  std::uniform_real_distribution<float> u(0.01f, 1.0f);
  for (size_t i = 0; i < r.ids.size(); ++i) r.weights.push_back(u(gen));
  return r;
}

struct DevicePermutation {
  explicit DevicePermutation(const Routing& r, int64_t hidden)
      : counts(r.slots),
        offsets(r.slots + 1),
        choice_row(r.ids.size()),
        row_token(r.ids.size()),
        permuted(r.ids.size() * hidden) {}
  DeviceArray<int32_t> counts, offsets, choice_row, row_token;
  DeviceArray<float> permuted;
};

// The multi-block plan's scratch for these sizes (empty below kMoeMultiBlockPlanChoices), or
// none when `workspace` is false (the one-block plan at any size).
DeviceArray<int32_t> PlanWorkspace(const Routing& r, bool workspace) {
  const int64_t bytes =
      workspace ? kernels::MoePermutePlanWorkspaceBytes(r.tokens, r.top_k, r.slots) : 0;
  return DeviceArray<int32_t>(bytes / sizeof(int32_t));
}

void RunPermute(const Routing& r, int64_t hidden_size, DeviceArray<float>& hidden,
                DeviceArray<int32_t>& ids, DeviceArray<int32_t>& map, DevicePermutation* d,
                bool workspace = true) {
  d->counts.Poison();
  d->offsets.Poison();
  d->choice_row.Poison();
  d->row_token.Poison();
  d->permuted.Poison();
  kernels::MoePermuteParams p;
  p.num_tokens = r.tokens;
  p.top_k = r.top_k;
  p.num_experts = r.experts;
  p.num_slots = r.slots;
  p.topk_ids = ids.get();
  p.slot_of_expert = map.get();
  p.hidden_size = hidden_size;
  p.hidden = hidden.get();
  p.slot_counts = d->counts.get();
  p.slot_offsets = d->offsets.get();
  p.choice_row = d->choice_row.get();
  p.row_token = d->row_token.get();
  p.permuted_hidden = d->permuted.get();
  DeviceArray<int32_t> ws = PlanWorkspace(r, workspace);
  p.plan_workspace = ws.size() > 0 ? ws.get() : nullptr;
  DEEPINFER_CUDA_OK(kernels::MoePermuteF32(p, nullptr));
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
}

void CheckPermuteAndCombine(int32_t tokens, int32_t top_k, int32_t experts, int32_t hosted,
                            int invalid_every, int64_t hidden_size, bool workspace = true) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " top_k " << top_k << " experts "
                                    << experts << " slots " << hosted << " hidden " << hidden_size
                                    << " workspace " << workspace << " seed " << seed);
  const Routing r = MakeRouting(tokens, top_k, experts, hosted, invalid_every, seed);
  const auto hidden = testing::RandomFloats(size_t(tokens) * hidden_size, seed + 1);
  const kernels::MoePermutation want =
      kernels::MoePermuteReference(tokens, top_k, experts, hosted, r.ids.data(),
                                   r.slot_of_expert.data(), hidden_size, hidden.data());
  const int32_t rows = want.slot_offsets.back();

  DeviceArray<float> dhidden(hidden);
  DeviceArray<int32_t> dids(r.ids), dmap(r.slot_of_expert);
  DevicePermutation d(r, hidden_size);
  RunPermute(r, hidden_size, dhidden, dids, dmap, &d, workspace);
  std::vector<int32_t> counts, offsets, choice_row, row_token;
  std::vector<float> permuted;
  DEEPINFER_CUDA_OK(d.counts.Download(&counts));
  DEEPINFER_CUDA_OK(d.offsets.Download(&offsets));
  DEEPINFER_CUDA_OK(d.choice_row.Download(&choice_row));
  DEEPINFER_CUDA_OK(d.row_token.Download(&row_token));
  DEEPINFER_CUDA_OK(d.permuted.Download(&permuted));
  EXPECT_EQ(counts, want.slot_counts);
  EXPECT_EQ(offsets, want.slot_offsets);
  EXPECT_EQ(choice_row, want.choice_row);
  EXPECT_EQ(std::vector<int32_t>(row_token.begin(), row_token.begin() + rows), want.row_token);
  for (size_t i = rows; i < row_token.size(); ++i) ASSERT_EQ(row_token[i], -1) << "poison";
  if (rows > 0) {
    EXPECT_EQ(0, std::memcmp(permuted.data(), want.permuted_hidden.data(),
                             want.permuted_hidden.size() * sizeof(float)));
  }
  for (size_t i = size_t(rows) * hidden_size; i < permuted.size(); ++i) {
    ASSERT_TRUE(std::isnan(permuted[i])) << "row " << i / hidden_size << " beyond rows written";
  }

  // The bf16 gather (the operand of the cuBLAS expert GEMMs): the same rows, each value rounded
  // to nearest even as the host reference rounds it; nothing written past `rows`.
  {
    DeviceArray<uint16_t> permuted16(r.ids.size() * hidden_size);
    permuted16.Poison();
    kernels::MoePermuteParams p;
    p.num_tokens = r.tokens;
    p.top_k = r.top_k;
    p.num_experts = r.experts;
    p.num_slots = r.slots;
    p.topk_ids = dids.get();
    p.slot_of_expert = dmap.get();
    p.hidden_size = hidden_size;
    p.hidden = dhidden.get();
    p.slot_counts = d.counts.get();
    p.slot_offsets = d.offsets.get();
    p.choice_row = d.choice_row.get();
    p.row_token = d.row_token.get();
    p.permuted_hidden = nullptr;
    p.permuted_hidden_bf16 = permuted16.get();
    DeviceArray<int32_t> ws = PlanWorkspace(r, workspace);
    p.plan_workspace = ws.size() > 0 ? ws.get() : nullptr;
    DEEPINFER_CUDA_OK(kernels::MoePermuteF32(p, nullptr));
    std::vector<uint16_t> got16;
    DEEPINFER_CUDA_OK(permuted16.Download(&got16));
    size_t wrong = 0;
    for (size_t i = 0; i < size_t(rows) * hidden_size; ++i) {
      wrong += got16[i] != kernels::FloatToBf16(want.permuted_hidden[i]);
    }
    EXPECT_EQ(wrong, 0u) << "bf16 gather differs from the rounded reference rows";
    for (size_t i = size_t(rows) * hidden_size; i < got16.size(); ++i) {
      ASSERT_EQ(got16[i], 0xFFFF) << "bf16 row " << i / hidden_size << " beyond rows written";
    }
  }

  // Combine: bit for bit, into a non-zero output.
  const auto expert_out = testing::RandomFloats(std::max(rows, 1) * hidden_size, seed + 2);
  const auto out0 = testing::RandomFloats(size_t(tokens) * hidden_size, seed + 3);
  std::vector<float> want_out = out0;
  kernels::MoeCombineReference(tokens, top_k, hidden_size, want.choice_row.data(), r.weights.data(),
                               expert_out.data(), want_out.data());
  DeviceArray<float> dexpert(expert_out), dout(out0), dw(r.weights);
  kernels::MoeCombineParams c;
  c.num_tokens = tokens;
  c.top_k = top_k;
  c.hidden_size = hidden_size;
  c.choice_row = d.choice_row.get();
  c.topk_weights = dw.get();
  c.expert_out = dexpert.get();
  c.out = dout.get();
  DEEPINFER_CUDA_OK(kernels::MoeCombineF32(c, nullptr));
  std::vector<float> got_out;
  DEEPINFER_CUDA_OK(dout.Download(&got_out));
  ASSERT_EQ(got_out.size(), want_out.size());
  size_t differ = 0;
  for (size_t i = 0; i < got_out.size(); ++i)
    differ += std::memcmp(&got_out[i], &want_out[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << "combine elements not bit-identical to the reference";

  // The bf16 combine of the cuBLAS path: bf16 expert outputs, out overwritten (poisoned here,
  // never read): bit for bit the reference on the widened values into zeros.
  std::vector<uint16_t> expert16(expert_out.size());
  std::vector<float> expert_widened(expert_out.size());
  for (size_t i = 0; i < expert_out.size(); ++i) {
    expert16[i] = kernels::FloatToBf16(expert_out[i]);
    expert_widened[i] = kernels::Bf16ToFloat(expert16[i]);
  }
  std::vector<float> want16(size_t(tokens) * hidden_size, 0.0f);
  kernels::MoeCombineReference(tokens, top_k, hidden_size, want.choice_row.data(), r.weights.data(),
                               expert_widened.data(), want16.data());
  DeviceArray<uint16_t> dexpert16(expert16);
  DeviceArray<float> dout16(size_t(tokens) * hidden_size);
  dout16.Poison();
  c.expert_out = nullptr;
  c.expert_out_bf16 = dexpert16.get();
  c.accumulate = false;
  c.out = dout16.get();
  DEEPINFER_CUDA_OK(kernels::MoeCombineF32(c, nullptr));
  DEEPINFER_CUDA_OK(dout16.Download(&got_out));
  ASSERT_EQ(got_out.size(), want16.size());
  differ = 0;
  for (size_t i = 0; i < got_out.size(); ++i)
    differ += std::memcmp(&got_out[i], &want16[i], 4) != 0;
  EXPECT_EQ(differ, 0u) << "bf16 combine elements not bit-identical to the reference";
}

// row_align > 1 (the chunked cuBLAS path's layout): the reference permutation with each slot
// moved to a start padded to a multiple of `align`; gap rows are never written.
void CheckPaddedPermute(int32_t tokens, int32_t top_k, int32_t experts, int32_t hosted,
                        int invalid_every, int64_t hidden_size, int32_t align, bool bf16,
                        bool workspace = true) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message()
               << "tokens " << tokens << " top_k " << top_k << " slots " << hosted << " hidden "
               << hidden_size << " row_align " << align << (bf16 ? " bf16" : " fp32")
               << " workspace " << workspace << " seed " << seed);
  const Routing r = MakeRouting(tokens, top_k, experts, hosted, invalid_every, seed);
  const auto hidden = testing::RandomFloats(size_t(tokens) * hidden_size, seed + 1);
  const kernels::MoePermutation want =
      kernels::MoePermuteReference(tokens, top_k, experts, hosted, r.ids.data(),
                                   r.slot_of_expert.data(), hidden_size, hidden.data());
  std::vector<int32_t> padded(hosted + 1, 0);
  for (int32_t s = 0; s < hosted; ++s) {
    padded[s + 1] = padded[s] + (want.slot_counts[s] + align - 1) / align * align;
  }
  const int64_t bound = kernels::MoePermutedRowsBound(tokens, top_k, hosted, align);
  ASSERT_LE(padded[hosted], bound);
  // Reference row -> padded row.
  std::vector<int32_t> moved(std::max<int32_t>(want.slot_offsets.back(), 1), -1);
  for (int32_t s = 0; s < hosted; ++s) {
    for (int32_t q = want.slot_offsets[s]; q < want.slot_offsets[s + 1]; ++q) {
      moved[q] = q - want.slot_offsets[s] + padded[s];
    }
  }
  DeviceArray<float> dhidden(hidden);
  DeviceArray<int32_t> dids(r.ids), dmap(r.slot_of_expert);
  DeviceArray<int32_t> counts(hosted), offsets(hosted + 1), choice_row(r.ids.size()),
      row_token(std::max<int64_t>(bound, 1));
  DeviceArray<float> out32(std::max<int64_t>(bound, 1) * hidden_size);
  DeviceArray<uint16_t> out16(std::max<int64_t>(bound, 1) * hidden_size);
  for (auto* a : {&counts, &offsets, &choice_row, &row_token}) a->Poison();
  out32.Poison();
  out16.Poison();
  kernels::MoePermuteParams p;
  p.num_tokens = tokens;
  p.top_k = top_k;
  p.num_experts = experts;
  p.num_slots = hosted;
  p.topk_ids = dids.get();
  p.slot_of_expert = dmap.get();
  p.hidden_size = hidden_size;
  p.hidden = dhidden.get();
  p.slot_counts = counts.get();
  p.slot_offsets = offsets.get();
  p.choice_row = choice_row.get();
  p.row_token = row_token.get();
  if (bf16) {
    p.permuted_hidden_bf16 = out16.get();
  } else {
    p.permuted_hidden = out32.get();
  }
  p.row_align = align;
  DeviceArray<int32_t> ws = PlanWorkspace(r, workspace);
  p.plan_workspace = ws.size() > 0 ? ws.get() : nullptr;
  DEEPINFER_CUDA_OK(kernels::MoePermuteF32(p, nullptr));
  std::vector<int32_t> got_counts, got_offsets, got_choice, got_token;
  DEEPINFER_CUDA_OK(counts.Download(&got_counts));
  DEEPINFER_CUDA_OK(offsets.Download(&got_offsets));
  DEEPINFER_CUDA_OK(choice_row.Download(&got_choice));
  DEEPINFER_CUDA_OK(row_token.Download(&got_token));
  EXPECT_EQ(got_counts, want.slot_counts);
  EXPECT_EQ(got_offsets, padded);
  std::vector<int32_t> want_choice(want.choice_row.size()), want_token(got_token.size(), -1);
  for (size_t i = 0; i < want.choice_row.size(); ++i) {
    want_choice[i] = want.choice_row[i] < 0 ? -1 : moved[want.choice_row[i]];
  }
  for (int32_t q = 0; q < want.slot_offsets.back(); ++q) want_token[moved[q]] = want.row_token[q];
  EXPECT_EQ(got_choice, want_choice);
  EXPECT_EQ(got_token, want_token);  // gap rows keep the poison (-1)
  size_t wrong = 0, gap_written = 0;
  std::vector<bool> real(std::max<int64_t>(bound, 1), false);
  for (int32_t q = 0; q < want.slot_offsets.back(); ++q) real[moved[q]] = true;
  if (bf16) {
    std::vector<uint16_t> got;
    DEEPINFER_CUDA_OK(out16.Download(&got));
    for (int32_t q = 0; q < want.slot_offsets.back(); ++q) {
      for (int64_t c = 0; c < hidden_size; ++c) {
        wrong += got[moved[q] * hidden_size + c] !=
                 kernels::FloatToBf16(want.permuted_hidden[q * hidden_size + c]);
      }
    }
    for (size_t i = 0; i < got.size(); ++i)
      gap_written += !real[i / hidden_size] && got[i] != 0xFFFF;
  } else {
    std::vector<float> got;
    DEEPINFER_CUDA_OK(out32.Download(&got));
    for (int32_t q = 0; q < want.slot_offsets.back(); ++q) {
      wrong += std::memcmp(&got[moved[q] * hidden_size], &want.permuted_hidden[q * hidden_size],
                           hidden_size * sizeof(float)) != 0;
    }
    for (size_t i = 0; i < got.size(); ++i) {
      gap_written += !real[i / hidden_size] && !std::isnan(got[i]);
    }
  }
  EXPECT_EQ(wrong, 0u) << "gathered rows differ from the reference";
  EXPECT_EQ(gap_written, 0u) << "padding rows were written";
}

TEST(MoePermuteTest, PaddedRowsForChunkedGemms) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CheckPaddedPermute(1, 6, 64, 64, 0, 2048, 64, /*bf16=*/true);
  CheckPaddedPermute(700, 6, 64, 64, 0, 256, 128, /*bf16=*/true);
  CheckPaddedPermute(333, 8, 256, 100, 37, 70, 16, /*bf16=*/false);  // subset, invalid ids
  CheckPaddedPermute(4099, 8, 512, kernels::kMaxMoeSlots, 0, 64, 256, /*bf16=*/true);
  CheckPaddedPermute(0, 6, 64, 64, 0, 32, 64, /*bf16=*/false);
  // Both element types on both gather widths (hidden % 4 == 0: 16-byte loads).
  CheckPaddedPermute(300, 6, 64, 64, 0, 512, 128, /*bf16=*/false);
  CheckPaddedPermute(300, 6, 64, 64, 0, 70, 64, /*bf16=*/true);
}

TEST(MoePermuteTest, DecodeOneToken) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CheckPermuteAndCombine(1, 6, 64, 64, 0, 2048);
}

TEST(MoePermuteTest, MoonlightBatch) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CheckPermuteAndCombine(128, 6, 64, 64, 0, 2048);
}

TEST(MoePermuteTest, ExpertParallelSubsetWithInvalidIds) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CheckPermuteAndCombine(333, 8, 256, 100, 37, 70);  // odd hidden: scalar gather path
}

TEST(MoePermuteTest, MaxSlotsManyTokens) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CheckPermuteAndCombine(4099, 8, 512, kernels::kMaxMoeSlots, 0, 64);
}

// The plan kernel keeps each choice's slot in shared memory when they fit (the 4099 x 8 case
// above: 64 KB, beyond the default 48 KB) and reloads them otherwise: 8192 x 6 as in a Moonlight
// prefill, and 40000 x 6 (480 KB of slots: more than any GPU's shared memory).
TEST(MoePermuteTest, PrefillSizesWithAndWithoutSlotCache) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CheckPermuteAndCombine(8192, 6, 64, 64, 0, 16);
  CheckPermuteAndCombine(40000, 6, 64, 50, 101, 8);
}

// Prefill sizes through the multi-block plan and the by-token gather (from
// kMoeMultiBlockPlanChoices choices with a workspace), and through the one-block plan with the
// by-token gather (no workspace): every output exactly the reference. Odd token counts, a subset
// of slots with invalid ids, a hidden size that is not a multiple of 4 (the gather by row), and
// padded layouts.
TEST(MoePermuteTest, MultiBlockPlanAndTokenGatherAtPrefillSizes) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CheckPermuteAndCombine(8192, 6, 64, 64, 0, 256);
  CheckPermuteAndCombine(32771, 6, 64, 64, 0, 8);
  CheckPermuteAndCombine(5001, 8, 256, 100, 37, 70);
  CheckPermuteAndCombine(683, 6, 64, 64, 0, 2048);  // 4098 choices: just above the threshold
  CheckPaddedPermute(32768, 6, 64, 64, 0, 64, 128, /*bf16=*/true);
  CheckPaddedPermute(8193, 6, 64, 64, 0, 256, 64, /*bf16=*/false);
  CheckPaddedPermute(4099, 8, 512, kernels::kMaxMoeSlots, 0, 64, 256, /*bf16=*/true);
  CheckPermuteAndCombine(8192, 6, 64, 64, 0, 256, /*workspace=*/false);
  CheckPaddedPermute(20000, 6, 64, 64, 0, 64, 128, /*bf16=*/true, /*workspace=*/false);
}

// shared_slots: each token's last `shared` choices go to the last `shared` slots, not read from
// the ids, and weigh 1 in the combine. Against the reference on the routing written out in full
// (ids [tokens, top_k + shared] with the shared experts as ids experts .. experts + shared - 1 at
// slots hosted ..), exactly; the combine bit for bit.
void CheckSharedSlots(int32_t tokens, int32_t top_k, int32_t experts, int32_t hosted,
                      int32_t shared, bool workspace) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "tokens " << tokens << " top_k " << top_k << " slots "
                                    << hosted << " shared " << shared << " seed " << seed);
  const Routing r = MakeRouting(tokens, top_k, experts, hosted, 0, seed);
  const int32_t all_k = top_k + shared, slots = hosted + shared;
  std::vector<int32_t> ids, map = r.slot_of_expert;
  std::vector<float> weights;
  for (int32_t t = 0; t < tokens; ++t) {
    for (int32_t k = 0; k < top_k; ++k) {
      ids.push_back(r.ids[t * top_k + k]);
      weights.push_back(r.weights[t * top_k + k]);
    }
    for (int32_t j = 0; j < shared; ++j) {
      ids.push_back(experts + j);
      weights.push_back(1.0f);
    }
  }
  for (int32_t j = 0; j < shared; ++j) map.push_back(hosted + j);
  const kernels::MoePermutation want = kernels::MoePermuteReference(
      tokens, all_k, experts + shared, slots, ids.data(), map.data(), 0, nullptr);
  const int64_t choices = int64_t{tokens} * all_k;
  DeviceArray<int32_t> dids(r.ids), dmap(r.slot_of_expert);
  DeviceArray<int32_t> counts(slots), offsets(slots + 1), choice_row(choices), row_token(choices);
  counts.Poison(), offsets.Poison(), choice_row.Poison(), row_token.Poison();
  kernels::MoePermuteParams p;
  p.num_tokens = tokens;
  p.top_k = all_k;
  p.shared_slots = shared;
  p.num_experts = experts;
  p.num_slots = slots;
  p.topk_ids = dids.get();
  p.slot_of_expert = dmap.get();
  p.slot_counts = counts.get();
  p.slot_offsets = offsets.get();
  p.choice_row = choice_row.get();
  p.row_token = row_token.get();
  const int64_t ws_bytes =
      workspace ? kernels::MoePermutePlanWorkspaceBytes(tokens, all_k, slots) : 0;
  DeviceArray<int32_t> ws(ws_bytes / sizeof(int32_t));
  p.plan_workspace = ws_bytes > 0 ? ws.get() : nullptr;
  DEEPINFER_CUDA_OK(kernels::MoePermuteF32(p, nullptr));
  std::vector<int32_t> got_counts, got_offsets, got_rows, got_tokens;
  DEEPINFER_CUDA_OK(counts.Download(&got_counts));
  DEEPINFER_CUDA_OK(offsets.Download(&got_offsets));
  DEEPINFER_CUDA_OK(choice_row.Download(&got_rows));
  DEEPINFER_CUDA_OK(row_token.Download(&got_tokens));
  EXPECT_EQ(got_counts, want.slot_counts);
  EXPECT_EQ(got_offsets, want.slot_offsets);
  EXPECT_EQ(got_rows, want.choice_row);
  got_tokens.resize(want.row_token.size());
  EXPECT_EQ(got_tokens, want.row_token);

  const int64_t hidden_size = 36;
  const int32_t rows = want.slot_offsets.back();
  const auto expert_out = testing::RandomFloats(std::max(rows, 1) * hidden_size, seed + 2);
  std::vector<float> want_out(size_t(tokens) * hidden_size, 0.0f);
  kernels::MoeCombineReference(tokens, all_k, hidden_size, want.choice_row.data(), weights.data(),
                               expert_out.data(), want_out.data());
  DeviceArray<float> dexpert(expert_out), dw(r.weights), dout(want_out.size());
  dout.Poison();
  kernels::MoeCombineParams c;
  c.num_tokens = tokens;
  c.top_k = all_k;
  c.shared_slots = shared;
  c.hidden_size = hidden_size;
  c.choice_row = choice_row.get();
  c.topk_weights = dw.get();
  c.expert_out = dexpert.get();
  c.accumulate = false;
  c.out = dout.get();
  DEEPINFER_CUDA_OK(kernels::MoeCombineF32(c, nullptr));
  std::vector<float> got_out;
  DEEPINFER_CUDA_OK(dout.Download(&got_out));
  size_t differ = 0;
  for (size_t i = 0; i < got_out.size(); ++i) {
    differ += std::memcmp(&got_out[i], &want_out[i], 4) != 0;
  }
  EXPECT_EQ(differ, 0u) << "combine elements not bit-identical to the reference";
}

TEST(MoePermuteTest, SharedSlotsAsExtraChoices) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CheckSharedSlots(128, 6, 64, 64, 2, /*workspace=*/true);    // Moonlight: two shared parts
  CheckSharedSlots(128, 8, 256, 256, 1, /*workspace=*/true);  // V3: one shared expert
  CheckSharedSlots(9, 4, 16, 12, 3, /*workspace=*/true);      // a subset of the experts hosted
  CheckSharedSlots(1000, 6, 64, 64, 2, /*workspace=*/true);   // the multi-block plan
  CheckSharedSlots(1000, 6, 64, 64, 2, /*workspace=*/false);
}

TEST(MoePermuteTest, NoTokens) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CheckPermuteAndCombine(0, 6, 64, 64, 0, 32);
}

TEST(MoePermuteTest, RejectsBadSizes) {
  kernels::MoePermuteParams p;
  p.num_slots = kernels::kMaxMoeSlots + 1;
  EXPECT_EQ(kernels::MoePermuteF32(p, nullptr), cudaErrorInvalidValue);
  p.num_slots = 0;
  EXPECT_EQ(kernels::MoePermuteF32(p, nullptr), cudaErrorInvalidValue);
  p.num_slots = 4;
  p.num_tokens = 1 << 20;
  p.top_k = 1 << 12;
  EXPECT_EQ(kernels::MoePermuteF32(p, nullptr), cudaErrorInvalidValue);
  p.num_tokens = 4;
  p.top_k = 2;
  p.row_align = 0;
  EXPECT_EQ(kernels::MoePermuteF32(p, nullptr), cudaErrorInvalidValue);
  p.row_align = 1;
  p.shared_slots = 3;  // more than top_k
  EXPECT_EQ(kernels::MoePermuteF32(p, nullptr), cudaErrorInvalidValue);
  kernels::MoeCombineParams c;
  c.hidden_size = -1;
  EXPECT_EQ(kernels::MoeCombineF32(c, nullptr), cudaErrorInvalidValue);
}

// The device path end to end: permute, gate-like GEMM on the permuted rows with the group
// offsets the permute left in device memory, combine. Against the reference pipeline.
TEST(MoePermuteTest, PermuteGroupedGemmCombine) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int32_t tokens = 37, top_k = 4, experts = 32, hosted = 20;
  const int32_t H = 256, N = 96;
  const Routing r = MakeRouting(tokens, top_k, experts, hosted, 0, seed);
  const auto hidden = testing::RandomFloats(size_t(tokens) * H, seed + 1);
  const auto wf = testing::RandomFloats(size_t(hosted) * N * H, seed + 2, 0.05f);
  std::vector<uint16_t> w(wf.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = kernels::FloatToBf16(wf[i]);

  const kernels::MoePermutation want = kernels::MoePermuteReference(
      tokens, top_k, experts, hosted, r.ids.data(), r.slot_of_expert.data(), H, hidden.data());
  const int32_t rows = want.slot_offsets.back();
  std::vector<const uint16_t*> host_w;
  for (int32_t s = 0; s < hosted; ++s) host_w.push_back(w.data() + size_t(s) * N * H);
  std::vector<float> want_y(std::max(rows, 1) * size_t(N));
  kernels::GroupedGemmBf16Reference(hosted, want.slot_offsets.data(), N, H,
                                    want.permuted_hidden.data(), host_w, want_y.data());
  std::vector<float> want_out(size_t(tokens) * N, 0.0f);
  kernels::MoeCombineReference(tokens, top_k, N, want.choice_row.data(), r.weights.data(),
                               want_y.data(), want_out.data());

  DeviceArray<float> dhidden(hidden), dy(r.ids.size() * N), dweights(r.weights);
  DeviceArray<float> dout(std::vector<float>(want_out.size(), 0.0f));
  DeviceArray<int32_t> dids(r.ids), dmap(r.slot_of_expert);
  DeviceArray<uint16_t> dw(w);
  std::vector<uint64_t> ptrs;
  for (int32_t s = 0; s < hosted; ++s) {
    ptrs.push_back(reinterpret_cast<uint64_t>(dw.get() + size_t(s) * N * H));
  }
  DeviceArray<uint64_t> dptrs(ptrs);
  DevicePermutation d(r, H);
  RunPermute(r, H, dhidden, dids, dmap, &d);
  dy.Poison();
  kernels::GroupedGemmBf16Params g;
  g.num_slots = hosted;
  g.max_rows = tokens * top_k;
  g.slot_offsets = d.offsets.get();
  g.n = N;
  g.k = H;
  g.x = d.permuted.get();
  g.weights = reinterpret_cast<const uint16_t* const*>(dptrs.get());
  g.y = dy.get();
  g.rows_per_slot_hint = tokens;
  DEEPINFER_CUDA_OK(kernels::GroupedGemmBf16(g, nullptr));
  kernels::MoeCombineParams c;
  c.num_tokens = tokens;
  c.top_k = top_k;
  c.hidden_size = N;
  c.choice_row = d.choice_row.get();
  c.topk_weights = dweights.get();
  c.expert_out = dy.get();
  c.out = dout.get();
  DEEPINFER_CUDA_OK(kernels::MoeCombineF32(c, nullptr));
  std::vector<float> got;
  DEEPINFER_CUDA_OK(dout.Download(&got));
  // GEMM summation order differs (fp32, k = 256): well inside 1e-4 relative for these sizes.
  EXPECT_TRUE(testing::AllClose(got, want_out, 1e-4, 1e-4));
}

}  // namespace
}  // namespace deepinfer
