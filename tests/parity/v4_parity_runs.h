// The runs the DeepSeek-V4 parity tests make of a model against an HF fixture, shared by the CPU
// (deepseek_v4_parity_test) and CUDA (cuda_v4_parity_test) tests. V4 fixtures' logits.bin holds
// HF's logits at every position of each prompt followed by the first 23 tokens of its greedy
// continuation (tools/make_fixtures_v4.py): the "covered" sequence.
#ifndef DEEPINFER_TESTS_PARITY_V4_PARITY_RUNS_H_
#define DEEPINFER_TESTS_PARITY_V4_PARITY_RUNS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/parity/hf_fixture.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/causal_lm.h"

namespace deepinfer {

// The prompt and the first 23 greedy tokens: the rows logits.bin covers.
std::vector<int32_t> CoveredIds(const FixturePrompt& p);

// Runs `ids` in steps of `chunk` tokens (0: one step) in fresh blocks, freed after; every row's
// logits.
absl::StatusOr<std::vector<float>> RunInSteps(CausalLm* model, KvBlockPool* pool,
                                              const std::vector<int32_t>& ids, int64_t chunk);

// Per row of p's covered sequence, max |ours - HF| / max |HF| (the max over the whole
// sequence); rows `ours` does not have are 0.
std::vector<double> CoveredRowErrors(const Fixture& fx, const FixturePrompt& p,
                                     const std::vector<float>& ours);

// The lowest index of the largest of n values.
int32_t ArgmaxRow(const float* row, int64_t n);

// `got` against `want`, rows of `vocab` logits: each row's max |got - want| / max |want| (its
// median, 90th percentile and max over the rows), the rows whose argmax agree, and the non-finite
// values of `got`.
struct LogitRowErrors {
  double median = 0, p90 = 0, max = 0;
  int64_t rows = 0, argmax_match = 0, nonfinite = 0;
};
LogitRowErrors RowErrors(const std::vector<float>& got, const std::vector<float>& want,
                         int64_t vocab);

}  // namespace deepinfer

#endif  // DEEPINFER_TESTS_PARITY_V4_PARITY_RUNS_H_
