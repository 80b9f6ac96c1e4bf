// Shared by the decode-graph tests (decode_graph_test.cc on a CPU backend that records by
// storing the callable, decode_graph_gpu_test.cc on CUDA graphs): a small DeepSeek-V3 config for
// dummy weights, and a driver that prefills a set of prompts and then decodes them with a
// schedule of batch sizes (the first n sequences take part in a step, so the batch size changes
// between steps and contexts grow), collecting every sampled token and logprob and the EPLB
// counts.
#ifndef DEEPINFER_WORKER_MODEL_DECODE_GRAPH_TEST_DRIVER_H_
#define DEEPINFER_WORKER_MODEL_DECODE_GRAPH_TEST_DRIVER_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/causal_lm.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace testing {

struct TinyMoeShape {
  int64_t hidden = 256;
  int64_t heads = 4;
  int64_t kv_lora = 64;
  int64_t nope = 32;
  int64_t rope = 32;
  int64_t v = 32;
  int64_t layers = 3;  // the first dense, the rest MoE
  int64_t experts = 16;
  int64_t top_k = 4;
  int64_t moe_inter = 64;
  int64_t inter = 512;
  int64_t vocab = 1024;
};

// Writes a config.json for `shape` under TEST_TMPDIR; returns the "dummy:<path>@seed" spec.
inline std::string WriteDummyModelSpec(const TinyMoeShape& s, const std::string& name, int seed) {
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/", name, ".json");
  std::ofstream(path) << absl::StrCat(
      R"({"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",)",
      R"("vocab_size": )", s.vocab, R"(, "hidden_size": )", s.hidden, R"(, "intermediate_size": )",
      s.inter, R"(, "moe_intermediate_size": )", s.moe_inter, R"(, "num_hidden_layers": )",
      s.layers, R"(, "num_attention_heads": )", s.heads, R"(, "num_key_value_heads": )", s.heads,
      R"(, "q_lora_rank": null, "kv_lora_rank": )", s.kv_lora, R"(, "qk_nope_head_dim": )", s.nope,
      R"(, "qk_rope_head_dim": )", s.rope, R"(, "v_head_dim": )", s.v, R"(, "n_routed_experts": )",
      s.experts, R"(, "n_shared_experts": 1, "num_experts_per_tok": )", s.top_k,
      R"(, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc", "scoring_func": "sigmoid",)",
      R"("norm_topk_prob": true, "routed_scaling_factor": 2.5, "first_k_dense_replace": 1,)",
      R"("moe_layer_freq": 1, "rms_norm_eps": 1e-05, "max_position_embeddings": 4096,)",
      R"("rope_theta": 10000.0, "rope_scaling": null, "tie_word_embeddings": false})");
  return absl::StrCat("dummy:", path, "@", seed);
}

struct DecodeRun {
  std::vector<std::vector<int32_t>> tokens;  // per decode step, per sequence of the step
  std::vector<std::vector<float>> logprobs;
  std::vector<int64_t> counts;  // TakeExpertCounts after the run (prefill included)
  int64_t prefill_tokens = 0;
};

// Per-step sampling parameters of a decode schedule: sampling(i, s, &p) sets sequence i's
// parameters p (greedy before the call) for decode step s.
using StepSampling = std::function<void(int64_t seq, size_t step, SamplingParams* p)>;

// Prefills `num_seqs` prompts (lengths 1..61, in steps of 16 sequences) in a fresh cache, then
// runs one decode step per schedule entry n over sequences 0..n-1 (sampled on the device, no
// logits: the decode-graph case), greedy unless `sampling` sets the parameters. With `forced`,
// each step's input tokens are forced's outputs of the step before (teacher forcing), so two
// models are compared on equal inputs.
inline absl::StatusOr<DecodeRun> RunDecodeSchedule(
    CausalLm* model, Backend* backend, const std::vector<int64_t>& schedule, int64_t num_seqs,
    const DecodeRun* forced = nullptr, const StepSampling& sampling = nullptr,
    const std::function<absl::Status(KvBlockPool*)>& on_pool = nullptr) {
  const int32_t bs = 16;
  const int64_t vocab = model->config().vocab_size;
  std::vector<SequenceStep> seqs(num_seqs);
  int64_t blocks = 1;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t len = 1 + (i * 37) % 61;
    for (int64_t j = 0; j < len; ++j) {
      seqs[i].tokens.push_back(static_cast<int32_t>((i * 131 + j * 7 + 3) % vocab));
    }
    blocks += (len + static_cast<int64_t>(schedule.size()) + bs) / bs;
  }
  auto pool = KvBlockPool::Create(
      backend, KvBlockPoolOptions{model->CacheSpec(), static_cast<int32_t>(blocks), bs});
  if (!pool.ok()) return pool.status();
  if (on_pool) {
    if (absl::Status st = on_pool(pool->get()); !st.ok()) return st;
  }
  DecodeRun run;
  for (SequenceStep& s : seqs) {
    auto b = (*pool)->Allocate((*pool)->BlocksFor(static_cast<int64_t>(s.tokens.size()) +
                                                  static_cast<int64_t>(schedule.size())));
    if (!b.ok()) return b.status();
    s.block_table = std::move(*b);
    s.sampling = SamplingParams{};
    s.return_logits = false;
    run.prefill_tokens += static_cast<int64_t>(s.tokens.size());
  }
  for (int64_t i = 0; i < num_seqs; i += 16) {
    std::vector<SequenceStep> chunk(seqs.begin() + i,
                                    seqs.begin() + std::min<int64_t>(num_seqs, i + 16));
    auto out = model->Step(chunk, pool->get());
    if (!out.ok()) return out.status();
    for (size_t j = 0; j < chunk.size(); ++j) {
      SequenceStep& s = seqs[i + j];
      s.position_offset = static_cast<int64_t>(s.tokens.size());
      s.tokens = {out->sampled[j].token};
    }
  }
  for (size_t step = 0; step < schedule.size(); ++step) {
    const int64_t n = schedule[step];
    std::vector<SequenceStep> batch(seqs.begin(), seqs.begin() + n);
    if (sampling) {
      for (int64_t i = 0; i < n; ++i) sampling(i, step, &*batch[i].sampling);
    }
    auto out = model->Step(batch, pool->get());
    if (!out.ok()) return out.status();
    run.tokens.emplace_back();
    run.logprobs.emplace_back();
    for (int64_t i = 0; i < n; ++i) {
      run.tokens.back().push_back(out->sampled[i].token);
      run.logprobs.back().push_back(out->sampled[i].logprob);
      seqs[i].position_offset += 1;
      seqs[i].tokens = {forced != nullptr ? forced->tokens[step][i] : out->sampled[i].token};
    }
  }
  run.counts = model->TakeExpertCounts();
  return run;
}

// Verification steps (speculative decoding's, SequenceStep::row_sampling): per step, per
// sequence, its picks (1 + k rows for a verified sequence, 1 for a plain decode), their logprobs
// and its hidden rows.
struct VerifyRun {
  std::vector<std::vector<std::vector<int32_t>>> tokens;  // [step][sequence][row]
  std::vector<std::vector<std::vector<float>>> logprobs;
  std::vector<std::vector<std::vector<float>>> hidden;  // [step][sequence][rows x width]
};

// Prefills `num_seqs` prompts (lengths 1..61) in a fresh cache, then runs `steps` steps where
// every sequence wants its hidden states and sequence i, unless i % 3 == 0 (a plain decode),
// verifies its last token and k drafts (tokens that depend on i, the step and the row); row 2 of
// sequence 1 has a bias of 1000 on one token. Every row is greedy unless `sampling` sets its
// parameters (sampling(i, s, &p): a plain decode's, and each of a verified sequence's rows).
// A verified sequence then advances past its last token and the drafts its picks accepted (the
// rest is rolled back: rewritten later), a plain one by its pick.
inline absl::StatusOr<VerifyRun> RunVerifySteps(CausalLm* model, Backend* backend, int64_t num_seqs,
                                                int64_t k, int64_t steps,
                                                const StepSampling& sampling = nullptr) {
  const int32_t bs = 16;
  const int64_t vocab = model->config().vocab_size;
  std::vector<SequenceStep> seqs(num_seqs);
  int64_t blocks = 1;
  const int64_t grow = steps * (k + 1) + k;
  for (int64_t i = 0; i < num_seqs; ++i) {
    const int64_t len = 1 + (i * 37) % 61;
    for (int64_t j = 0; j < len; ++j) {
      seqs[i].tokens.push_back(static_cast<int32_t>((i * 131 + j * 7 + 3) % vocab));
    }
    blocks += (len + grow + bs) / bs;
  }
  auto pool = KvBlockPool::Create(
      backend, KvBlockPoolOptions{model->CacheSpec(), static_cast<int32_t>(blocks), bs});
  if (!pool.ok()) return pool.status();
  for (SequenceStep& s : seqs) {
    auto b = (*pool)->Allocate((*pool)->BlocksFor(static_cast<int64_t>(s.tokens.size()) + grow));
    if (!b.ok()) return b.status();
    s.block_table = std::move(*b);
    s.sampling = SamplingParams{};
    s.return_logits = false;
  }
  for (int64_t i = 0; i < num_seqs; i += 16) {
    std::vector<SequenceStep> chunk(seqs.begin() + i,
                                    seqs.begin() + std::min<int64_t>(num_seqs, i + 16));
    auto out = model->Step(chunk, pool->get());
    if (!out.ok()) return out.status();
    for (size_t j = 0; j < chunk.size(); ++j) {
      SequenceStep& s = seqs[i + j];
      s.position_offset = static_cast<int64_t>(s.tokens.size());
      s.tokens = {out->sampled[j].token};
    }
  }
  VerifyRun run;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<SequenceStep> batch = seqs;
    for (int64_t i = 0; i < num_seqs; ++i) {
      SequenceStep& s = batch[i];
      s.return_hidden = true;
      if (i % 3 == 0) {
        if (sampling) sampling(i, static_cast<size_t>(step), &*s.sampling);
        continue;
      }
      for (int64_t j = 0; j < k; ++j) {
        s.tokens.push_back(static_cast<int32_t>((i * 17 + step * 5 + j * 3) % vocab));
      }
      s.sampling.reset();
      s.all_logits = true;
      s.row_sampling.assign(k + 1, SamplingParams{});
      if (sampling) {
        for (SamplingParams& p : s.row_sampling) sampling(i, static_cast<size_t>(step), &p);
      }
      if (i == 1 && k >= 2) {
        LogitAdjustment a;
        a.token = static_cast<int32_t>((step * 11 + 5) % vocab);
        a.bias = 1000.0f;
        s.row_sampling[2].adjustments = {a};
      }
    }
    auto out = model->Step(batch, pool->get());
    if (!out.ok()) return out.status();
    run.tokens.emplace_back(num_seqs);
    run.logprobs.emplace_back(num_seqs);
    run.hidden.emplace_back(num_seqs);
    for (int64_t i = 0; i < num_seqs; ++i) {
      const SequenceStep& s = batch[i];
      std::vector<SampledToken> picks =
          s.row_sampling.empty() ? std::vector<SampledToken>{out->sampled[i]} : out->row_sampled[i];
      if (picks.size() != s.tokens.size()) {
        return absl::InternalError(absl::StrCat("sequence ", i, ": ", picks.size(), " picks for ",
                                                s.tokens.size(), " rows"));
      }
      // Accepted: the last token and each draft its row before picked.
      int64_t accepted = 1;
      while (accepted < static_cast<int64_t>(s.tokens.size()) &&
             picks[accepted - 1].token == s.tokens[accepted]) {
        ++accepted;
      }
      for (const SampledToken& p : picks) {
        run.tokens.back()[i].push_back(p.token);
        run.logprobs.back()[i].push_back(p.logprob);
      }
      run.hidden.back()[i] = out->hidden[i];
      seqs[i].position_offset += accepted;
      seqs[i].tokens = {picks[accepted - 1].token};
    }
  }
  return run;
}

inline void ExpectBitIdentical(const VerifyRun& a, const VerifyRun& b) {
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  for (size_t s = 0; s < a.tokens.size(); ++s) {
    ASSERT_EQ(a.tokens[s], b.tokens[s]) << "step " << s;
    for (size_t i = 0; i < a.tokens[s].size(); ++i) {
      ASSERT_EQ(a.logprobs[s][i].size(), b.logprobs[s][i].size());
      ASSERT_EQ(std::memcmp(a.logprobs[s][i].data(), b.logprobs[s][i].data(),
                            a.logprobs[s][i].size() * sizeof(float)),
                0)
          << "step " << s << " sequence " << i;
      ASSERT_EQ(a.hidden[s][i].size(), b.hidden[s][i].size()) << "step " << s << " sequence " << i;
      ASSERT_EQ(std::memcmp(a.hidden[s][i].data(), b.hidden[s][i].data(),
                            a.hidden[s][i].size() * sizeof(float)),
                0)
          << "step " << s << " sequence " << i;
    }
  }
}

// The sampled decode-graph tests' mix: sequence i at decode step s, by (i + s) % 6: greedy,
// temperature 0.8 with top_p 0.95 (the long-sampled job's), temperature 1 with top_k 20,
// temperature 1.3 with top_k 50 and top_p 0.9, temperature 0.6, temperature 1 with top_p 0.5;
// seeded by i, except that every sequence i % 4 == 3 shares seed 7. Over a schedule, a batch of
// one sequence is all greedy at some steps and all sampled at others.
inline void MixedSampling(int64_t seq, size_t step, SamplingParams* p) {
  p->seed = seq % 4 == 3 ? 7 : static_cast<uint64_t>(seq);
  switch ((seq + static_cast<int64_t>(step)) % 6) {
    case 0:
      break;
    case 1:
      p->temperature = 0.8f;
      p->top_p = 0.95f;
      break;
    case 2:
      p->temperature = 1.0f;
      p->top_k = 20;
      break;
    case 3:
      p->temperature = 1.3f;
      p->top_k = 50;
      p->top_p = 0.9f;
      break;
    case 4:
      p->temperature = 0.6f;
      break;
    default:
      p->temperature = 1.0f;
      p->top_p = 0.5f;
      break;
  }
}

// Whether two runs' tokens differ at some step (e.g. a sampled run and a greedy one: sampling
// took effect).
inline bool DiffersSomewhere(const DecodeRun& a, const DecodeRun& b) {
  for (size_t s = 0; s < a.tokens.size() && s < b.tokens.size(); ++s) {
    if (a.tokens[s] != b.tokens[s]) return true;
  }
  return false;
}

// The batch sizes both decode-graph tests step through: padding (3, 5, 100), buckets reused
// and revisited, the size changing every step.
inline const std::vector<int64_t>& DecodeSchedule() {
  static const std::vector<int64_t>* schedule =
      new std::vector<int64_t>{1, 3, 5, 64, 100, 100, 5, 64, 3, 1, 100, 2};
  return *schedule;
}

// The dummy-weight model of `spec` (WriteDummyModelSpec) on `backend` with decode-graph
// `options`; null (and a test failure) if it does not load.
inline std::unique_ptr<CausalLm> LoadWithDecodeGraphs(const std::string& spec, Backend* backend,
                                                      const DecodeGraphOptions& options) {
  auto model = LoadModel(spec, backend);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  (*model)->SetDecodeGraphOptions(options);
  return std::move(*model);
}

inline int64_t Total(const std::vector<int64_t>& v) {
  int64_t t = 0;
  for (int64_t x : v) t += x;
  return t;
}

// Same tokens, bit-identical logprobs at every step, same EPLB counts.
inline void ExpectBitIdentical(const DecodeRun& a, const DecodeRun& b) {
  ASSERT_EQ(a.tokens.size(), b.tokens.size());
  for (size_t s = 0; s < a.tokens.size(); ++s) {
    ASSERT_EQ(a.tokens[s], b.tokens[s]) << "step " << s;
    ASSERT_EQ(std::memcmp(a.logprobs[s].data(), b.logprobs[s].data(),
                          a.logprobs[s].size() * sizeof(float)),
              0)
        << "step " << s;
  }
  EXPECT_EQ(a.counts, b.counts);
}

// How closely run c follows run a on the same inputs: tokens equal at each step, and the largest
// |logprob difference| over those equal tokens.
struct TokenAgreement {
  int64_t same = 0, all = 0;
  double worst_logprob_diff = 0;
};
inline TokenAgreement CompareTokens(const DecodeRun& a, const DecodeRun& c) {
  TokenAgreement r;
  for (size_t s = 0; s < a.tokens.size(); ++s) {
    for (size_t i = 0; i < a.tokens[s].size(); ++i) {
      ++r.all;
      if (a.tokens[s][i] != c.tokens[s][i]) continue;
      ++r.same;
      r.worst_logprob_diff =
          std::max(r.worst_logprob_diff,
                   static_cast<double>(std::fabs(a.logprobs[s][i] - c.logprobs[s][i])));
    }
  }
  return r;
}

}  // namespace testing
}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DECODE_GRAPH_TEST_DRIVER_H_
