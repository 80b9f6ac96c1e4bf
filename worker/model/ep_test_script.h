// Test helper for expert-parallel model tests: scripted sequences (prefill in chunks, then
// decode) stepped through a model on one rank or on the ranks of a group, the logits of every
// (sequence, step) recorded, and bit-exact comparison. Shared by the CPU (TCP) and GPU (NCCL)
// expert-parallel tests.
#ifndef DEEPINFER_WORKER_MODEL_EP_TEST_SCRIPT_H_
#define DEEPINFER_WORKER_MODEL_EP_TEST_SCRIPT_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/causal_lm.h"

namespace deepinfer::ep_testing {

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline float MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  float m = a.size() == b.size() ? 0.0f : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

inline std::string FixtureDir(const std::string& name) {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/" + name;
}

// A sequence of the model tests: on `rank`, prefilled at step `start` (in chunks of
// `chunk` tokens), then decoding `decode` fixed tokens; all logits are compared.
struct Script {
  int rank;
  int start;
  int prompt_len;
  int chunk;
  int decode;
};

struct ScriptedSeq {
  Script s;
  std::vector<int32_t> tokens;  // prompt then decode tokens
  int64_t done = 0;             // tokens in the cache
  std::vector<int32_t> blocks;
};

constexpr int32_t kBlockSize = 4;

// What sequence i feeds at `step` (empty: not active).
inline std::vector<int32_t> TokensAt(const ScriptedSeq& q, int step) {
  if (step < q.s.start) return {};
  const int64_t total = static_cast<int64_t>(q.tokens.size());
  if (q.done >= total) return {};
  int64_t n = q.done < q.s.prompt_len ? std::min<int64_t>(q.s.chunk, q.s.prompt_len - q.done) : 1;
  return std::vector<int32_t>(q.tokens.begin() + q.done, q.tokens.begin() + q.done + n);
}

inline std::vector<ScriptedSeq> MakeSeqs(const std::vector<Script>& scripts) {
  std::vector<ScriptedSeq> seqs;
  for (size_t i = 0; i < scripts.size(); ++i) {
    ScriptedSeq q;
    q.s = scripts[i];
    for (int j = 0; j < q.s.prompt_len + q.s.decode; ++j) {
      q.tokens.push_back(2 + static_cast<int32_t>((i * 389 + j * 53 + j * j * 7) % 990));
    }
    seqs.push_back(std::move(q));
  }
  return seqs;
}

// logits[(sequence, step)] of one run.
using LogitsMap = std::map<std::pair<int, int>, std::vector<float>>;

// Steps the sequences whose rank is in `ranks` (all of them when ranks is empty) through
// `model` for `steps` steps; a step with no active sequence is an empty batch. `before_step`,
// if set, runs before each step (e.g. an EPLB placement switch).
inline absl::Status RunScript(CausalLm* model, Backend* backend, std::vector<ScriptedSeq> seqs,
                              int only_rank, int steps, LogitsMap* out,
                              const std::function<absl::Status(int step)>& before_step = nullptr) {
  auto pool = KvBlockPool::Create(backend, KvBlockPoolOptions{model->CacheSpec(), 256, kBlockSize});
  if (!pool.ok()) return pool.status();
  for (int step = 0; step < steps; ++step) {
    if (before_step) {
      if (absl::Status st = before_step(step); !st.ok()) return st;
    }
    std::vector<SequenceStep> batch;
    std::vector<int> which;
    for (size_t i = 0; i < seqs.size(); ++i) {
      ScriptedSeq& q = seqs[i];
      if (only_rank >= 0 && q.s.rank != only_rank) continue;
      std::vector<int32_t> tokens = TokensAt(q, step);
      if (tokens.empty()) continue;
      const int64_t need = (q.done + tokens.size() + kBlockSize - 1) / kBlockSize;
      if (static_cast<int64_t>(q.blocks.size()) < need) {
        auto more = (*pool)->Allocate(need - q.blocks.size());
        if (!more.ok()) return more.status();
        q.blocks.insert(q.blocks.end(), more->begin(), more->end());
      }
      SequenceStep s;
      s.tokens = tokens;
      s.position_offset = q.done;
      s.block_table = q.blocks;
      s.all_logits = true;
      batch.push_back(std::move(s));
      which.push_back(static_cast<int>(i));
    }
    absl::StatusOr<StepOutput> r = model->Step(batch, pool->get());
    if (!r.ok()) return r.status();
    if (r->logits.size() != batch.size()) return absl::InternalError("wrong number of logits");
    for (size_t b = 0; b < batch.size(); ++b) {
      (*out)[{which[b], step}] = r->logits[b];
      seqs[which[b]].done += static_cast<int64_t>(batch[b].tokens.size());
    }
  }
  return absl::OkStatus();
}

}  // namespace deepinfer::ep_testing

#endif  // DEEPINFER_WORKER_MODEL_EP_TEST_SCRIPT_H_
