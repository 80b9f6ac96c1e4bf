// Test support: DeepSeek-V4 decoding with and without verified drafts, recording what the model
// computes, so that tests can compare a run whose drafts are partly rejected with plain decoding
// (v4_speculative_test.cc on the CPU backend, bit for bit; v4_speculative_gpu_test.cc on CUDA).
//
// Every prompt runs in one batch: a prefill, then steps of one row per sequence (plain), or of
// 1 + k rows (k = 1, 2, 3 in turn) whose drafts are the plain continuation's tokens except one
// forced wrong at a rotating index, so that runs of drafts are accepted whole and cut at every
// index and the rejected rows fall on every phase of the compress ratios and sliding windows.
// Before each verification the MTP module drafts recursively over the same drafts (rows past
// the accepted ones in its own layer); after each step its round 1 runs over the accepted rows.
#ifndef DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_DRAFTING_RUN_H_
#define DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_DRAFTING_RUN_H_

#include <cstdint>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/causal_lm.h"

namespace deepinfer {

struct V4Drafted {
  int32_t token = 0;
  float probability = 0;
  std::vector<float> hidden;
};

// Per sequence: the logits after each position from the prompt's last on (rows whose inputs
// were accepted), and the MTP module's round-1 draft from each such position.
struct V4DraftingRun {
  std::vector<std::map<int64_t, std::vector<float>>> logits;
  std::vector<std::map<int64_t, V4Drafted>> drafts;
};

// Plain (`speculative` false): `continuation` is filled with each prompt and its greedy
// continuation, `generated` + 4 tokens. With drafts: `continuation` is the plain run's, and each
// sequence generates `generated` tokens.
absl::StatusOr<V4DraftingRun> RunV4Drafting(CausalLm* model, Backend* backend,
                                            const std::vector<std::vector<int32_t>>& prompts,
                                            int64_t generated, bool speculative,
                                            std::vector<std::vector<int32_t>>* continuation);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_DRAFTING_RUN_H_
