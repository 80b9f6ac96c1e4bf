// Engine: continuous batching for one rank over CausalLm::Step.
//
// Requests come from a RequestQueue and join between steps. Each step has a budget of
// max_batch_tokens new tokens and max_running sequences, spent in this order:
//   1. decode: every running sequence whose tokens are all in the cache gets one token;
//   2. prefill chunks of running sequences whose prompt is not fully in the cache yet;
//   3. waiting sequences (preempted ones first, then new ones in arrival order) are admitted
//      while budget and free KV blocks last; a prompt longer than what is left is chunked.
// KV blocks come from the rank's KvBlockPool as sequences grow, through a PrefixCache
// (worker/kv_cache/prefix_cache.h, docs/kv-cache.md): a sequence being admitted first takes the
// cached full blocks its tokens start with (at most all but its last token, so that at least
// one token is computed and sampled from) and starts computing after them; every block a
// sequence fills is offered to the cache, and a finished or preempted sequence's cached blocks
// stay, idle, until their memory is needed. Where the cache also keeps per-sequence state
// (DeepSeek-V4's window rings and compressor rows), a hit keeps the shared blocks' entries and
// replays the positions from CausalLm::BoundedReplayStart(hit) to rebuild the state. When a running
// sequence needs a block and none is free or idle, the most recently admitted sequence not yet
// scheduled in this step is preempted by recomputation: its blocks are freed, it keeps its
// generated tokens and goes back to the front of the waiting queue; when re-admitted, prompt +
// generated tokens are prefilled again. Where the model rebuilds its cache by a bounded replay
// (CausalLm::BoundedReplayStart > 0: DeepSeek-V4), the preempted sequence's paged entries are
// first copied to host memory, and on re-admission they are written into new blocks and only
// the positions from BoundedReplayStart are computed again (docs/model.md, "Replay after
// preemption or worker loss"). Sampling is keyed by (seed, position), so chunking, batching and
// preemption do not change a request's tokens.
//
// A request finishes on EOS (unless ignore_eos) or one of its stop_token_ids (the token is
// not returned), a stop string (the text is cut before it; finish_reason "stop"), max_tokens,
// or the context limit (finish_reason "length"). Before min_tokens tokens are generated, EOS
// and stop tokens are masked out of sampling and stop strings are not looked for. logit_bias,
// min_tokens and the penalties reach sampling as per-step LogitAdjustment entries built by the
// sequence's LogitAdjuster (worker/sampling/logit_adjuster.h). Errors that concern one request (bad
// prompt, stop strings without a tokenizer) fail that request only; an error of the step itself (a
// collective failed) is returned and leaves the engine to be dropped.
//
// With speculative_tokens > 0, a decoding sequence also feeds the model up to that many drafts
// from the model's draft head (DraftProposer) and keeps the longest prefix of them that equals
// what the model itself picks at each position, plus the model's own next token; rows after
// the first mismatch are not counted as computed (their cache entries are overwritten later and
// never offered to the prefix cache). Tokens are picked from every row exactly as a decode step
// picks them, so the output is the non-speculative output (docs/engine.md "Speculative
// decoding").
//
// Async scheduling (EngineOptions::async_scheduling, on by default): the model's steps run on a
// thread of their own (StepExecutor, step_executor.h) and Step() launches the next step before it
// handles the tokens of the step before, so the scheduling, the KV block accounting, the
// detokenisation, stop checks and results of step n happen while step n + 1 runs. A decoding
// sequence whose last token is still being sampled is scheduled with a placeholder that the
// executor fills in from the previous step's output; such a sequence is held back instead when
// its next step needs that token on the host (a grammar's mask, penalties, drafts) or when it
// ends with that token anyway (max_tokens, the context limit). A sequence that turns out to have
// finished (EOS, a stop token or string) at step n had its step n + 1 row computed for nothing:
// that row's token is dropped, and its blocks are freed once step n + 1 is processed. Preempting
// a sequence a running step computes waits for that step first. Outputs are the same with it on
// and off (the sampled token's position keys the sampler, and steps compute what they would
// without it). With speculative decoding the steps run synchronously.
//
// Not thread-safe: one rank thread drives an engine; other threads talk to it through its
// RequestQueue and read load() and progress().
#ifndef DEEPINFER_WORKER_ENGINE_ENGINE_H_
#define DEEPINFER_WORKER_ENGINE_ENGINE_H_

#include <cstdint>
#include <deque>
#include <list>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/cluster.pb.h"
#include "proto/common.pb.h"
#include "tokenizer/incremental_decoder.h"
#include "tokenizer/tokenizer.h"
#include "worker/engine/draft_proposer.h"
#include "worker/engine/request_queue.h"
#include "worker/engine/step_executor.h"
#include "worker/engine/step_stats.h"
#include "worker/engine/step_window.h"
#include "worker/engine/structured_output_matchers.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/kv_cache/prefix_cache.h"
#include "worker/model/causal_lm.h"

namespace deepinfer {

struct EngineOptions {
  int32_t max_batch_tokens = 2048;
  int32_t max_running = 256;
  // Prompt + generated tokens of one request; 0: the model's max_position_embeddings. Always
  // capped by the KV pool's capacity, so one sequence alone always fits.
  int64_t context_limit = 0;
  std::vector<int32_t> eos_token_ids;
  // Written into every result.
  uint64_t group_generation = 0;
  int32_t rank = 0;
  // Run Model::Step even when nothing is scheduled (an expert-parallel rank must take part in
  // every step's all-to-alls).
  bool step_when_idle = false;
  // Prefix caching (PrefixCacheOptions: on/off and the cache key).
  PrefixCacheOptions prefix_cache;
  // Speculative decoding with the model's draft head (CausalLm::Draft): up to this many drafts
  // per sequence and step, each kept while the draft head gave its token at least
  // draft_min_confidence (draft_proposer.h). 0: off.
  int32_t speculative_tokens = 0;
  float draft_min_confidence = 0.0f;
  // Async scheduling (see the top comment); false: each Step() runs its model step to the end.
  bool async_scheduling = true;
};

// Counters for heartbeats (RankLoad), readable from any thread.
struct EngineLoad {
  int32_t running = 0;
  int32_t waiting = 0;
  int64_t tokens = 0;
  int64_t kv_blocks_used = 0;  // referenced by requests (idle cached blocks count as free)
  int64_t kv_blocks_total = 0;
  int64_t kv_blocks_cached = 0;  // holding a cached prefix (referenced or idle)
  StepWindow::Summary steps;     // the last steps' tokens and decode rows
  // Prefix caching so far: prompt tokens of first admissions, and of those, served from the
  // cache; tokens the model computed.
  int64_t prompt_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  int64_t computed_tokens = 0;
  // The cache's root hash and PrefixCache::ProbeSummary, refreshed at most every
  // kProbeSummaryInterval (for the coordinator's prefix-aware routing).
  uint64_t prefix_root = 0;
  std::vector<uint64_t> cached_probes;
};

class Engine {
 public:
  // `model`, `pool`, `queue` and `tokenizer` (may be null) must outlive the engine.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(CausalLm* model, KvBlockPool* pool,
                                                        RequestQueue* queue,
                                                        const tokenizer::Tokenizer* tokenizer,
                                                        EngineOptions options);
  ~Engine();

  // Whether a step would do anything (requests held, queued in the RequestQueue, or computed by
  // a step in flight).
  bool HasWork() const;

  // Takes new requests and cancellations from the queue, schedules, launches one Model::Step and
  // returns the requests that finished (or failed) in the steps it processed: that step, or with
  // async scheduling the one launched before it (the new one keeps running). An error means a
  // step itself failed; the engine's requests are then in an unknown state and should be dropped.
  absl::StatusOr<std::vector<RequestResult>> Step();

  // Processes the steps in flight and returns the requests that finished in them. Until the
  // next Step() nothing runs on the model, so the caller may use it (EPLB counts and placement
  // changes). Errors as Step().
  absl::StatusOr<std::vector<RequestResult>> Flush();
  // Whether steps run on their own thread (async_scheduling, and no speculative decoding).
  bool async_scheduling() const { return executor_->threaded(); }

  // Forgets every request (the group failed; the coordinator re-runs them) and frees their
  // blocks. Returns how many were dropped.
  int DropAll();

  EngineLoad load() const;
  // Tokens generated so far by each request the engine holds (running, or preempted and
  // waiting) that has at least one, as of the end of the last step; for heartbeats.
  std::vector<RequestProgress> progress() const;
  int64_t context_limit() const { return options_.context_limit; }
  // Sequences preempted so far (for tests and logs).
  int64_t preemptions() const { return preemptions_; }
  // Tokens the model computed (prefill, re-prefill after preemption, decode and drafts being
  // verified) so far.
  int64_t computed_tokens() const { return computed_tokens_; }
  // Of those, positions computed again below entries kept for them: after a preemption
  // (re-prefill, or a bounded rebuild's replay) and a prefix-cache hit's bounded replay.
  int64_t replayed_tokens() const { return replayed_tokens_; }
  // Speculative decoding: drafts verified so far, and how many of them were accepted.
  int64_t drafts_verified() const { return drafts_verified_; }
  int64_t drafts_accepted() const { return drafts_accepted_; }
  const PrefixCache& prefix_cache() const { return cache_; }
  // What the steps so far did with their time (step_stats.h); read on the stepping thread.
  const StepStats& stats() const { return stats_; }

 private:
  struct Sequence;
  // A sequence's share of a step being scheduled: `n` positions from its computed ones.
  struct Planned {
    Sequence* seq;
    int64_t n;
  };
  // A launched row: the positions [from, from + n) it computes, whether it samples the
  // sequence's next token, whether it verifies drafts.
  struct LaunchedRow {
    Sequence* seq;
    int64_t n;
    int64_t from;
    bool samples;
    bool drafts;
  };
  struct LaunchedStep {
    int64_t id = 0;
    std::vector<LaunchedRow> rows;  // the batch's rows, in order
    int64_t decodes = 0;            // for StepStats
    int64_t prefill_tokens = 0;
  };
  Engine(CausalLm* model, KvBlockPool* pool, RequestQueue* queue,
         const tokenizer::Tokenizer* tokenizer, EngineOptions options);

  // Validates a new item; on success queues it, else adds an error result to `finished`.
  void Admit(WorkItem item, std::vector<RequestResult>* finished);
  void CancelRequests(const std::vector<std::string>& ids);
  // Builds the step of `plan` and hands it to the executor; its positions count as computed.
  void Launch(const std::vector<Planned>& plan);
  // Waits for the oldest launched step and handles its rows (tokens, stop conditions, results
  // into `finished`, retired sequences' blocks); an error is the step's.
  absl::Status Complete(std::vector<RequestResult>* finished);
  // Whether a launched step that is not processed yet computes `seq`.
  bool InFlight(const Sequence& seq) const;
  // Whether `seq`, whose token a step in flight samples, may decode that token in the next step
  // before it is known.
  bool CanDecodeAhead(const Sequence& seq) const;
  // Ends a finished or cancelled sequence: its blocks are freed now, or once the launched steps
  // that compute it are processed.
  void Retire(std::unique_ptr<Sequence> seq);
  // Frees the sequence's blocks and moves it to the front of waiting_.
  void Preempt(std::list<std::unique_ptr<Sequence>>::iterator it);
  // Makes `seq` able to hold `tokens` more positions, preempting others (never one in
  // `scheduled`) if needed. False if even that is not enough (then `seq` has no new blocks).
  bool Reserve(Sequence* seq, int64_t tokens, const absl::flat_hash_set<Sequence*>& scheduled);
  // Handles a sampled token; returns true when the sequence finished (result filled).
  bool Advance(Sequence* seq, const SampledToken& sampled, RequestResult* result);
  // Speculative decoding. How many drafts `seq`, decoding with `budget`
  // tokens left after its own, may bring this step, with blocks reserved for them (never by
  // preempting anyone).
  int64_t ReserveDraftRoom(Sequence* seq, int64_t budget,
                           const absl::flat_hash_set<Sequence*>& scheduled);
  // Runs the draft head over the planned sequences (their rows of the last step, then drafts
  // for those decoding with room for them) and sets their drafts.
  absl::Status ProposeDrafts(const std::vector<std::pair<Sequence*, int64_t>>& planned);
  // Verification of a decode step with drafts. VerifySampling: the parameters of each of its
  // 1 + drafts rows (SequenceStep::row_sampling), as a decode step at that position picks its
  // token, with the adjustments of the tokens accepted before it (the drafts before the row).
  // AdvanceVerified: advances by the step's picks (StepOutput::row_sampled) while they equal the
  // drafts. Returns the rows whose input tokens were accepted (their cache entries stay);
  // `finished` is set when the sequence finished (result filled).
  std::vector<SamplingParams> VerifySampling(const Sequence& seq) const;
  int64_t AdvanceVerified(Sequence* seq, const std::vector<SampledToken>& picks, bool* finished,
                          RequestResult* result);
  // Keeps the first `rows` of the `step_rows` hidden rows of the sequence's last step for the
  // next draft round.
  void KeepHidden(Sequence* seq, int64_t first_position, std::vector<float> hidden, int64_t rows,
                  int64_t step_rows);
  // Ends a sequence with a finish reason (flushing the decoder and checking stop strings).
  void Finish(Sequence* seq, const std::string& reason, RequestResult* result);
  // Searches the stop strings in the text added since `from`; true (and text cut) if found.
  bool CutAtStopString(Sequence* seq, size_t from);
  // Releases the sequence's blocks to the prefix cache (its cached ones stay, idle).
  void FreeBlocks(Sequence* seq);
  // Before a preemption frees its blocks: where the model rebuilds its cache by a bounded
  // replay, keeps the paged bytes that replay needs in host memory.
  void KeepForRebuild(Sequence* seq);
  // Puts kept bytes back into newly allocated blocks and sets `seq` to replay from
  // replay_from; false (nothing taken) if too few blocks are free.
  bool RestoreKept(Sequence* seq);
  // Takes the cached blocks the sequence's tokens start with (a sequence without blocks); where
  // the cache keeps per-sequence state, also a block of its own, and sets it to replay from
  // BoundedReplayStart(hit) with the hit's entries kept (no hit if that is position 0).
  void AcquireCachedPrefix(Sequence* seq);
  // Offers the sequence's blocks whose entries its computed tokens completed to the prefix
  // cache (PrefixCache::RegisterComputed).
  void RegisterFullBlocks(Sequence* seq);
  void UpdateLoad();

  CausalLm* const model_;
  KvBlockPool* const pool_;
  RequestQueue* const queue_;
  const tokenizer::Tokenizer* const tokenizer_;
  EngineOptions options_;
  int64_t vocab_ = 0;

  // Admission order; preemption victims come from the back.
  std::list<std::unique_ptr<Sequence>> running_;
  std::deque<std::unique_ptr<Sequence>> waiting_;
  absl::flat_hash_set<std::string> held_ids_;
  int64_t preemptions_ = 0;
  int64_t computed_tokens_ = 0;
  int64_t replayed_tokens_ = 0;
  int64_t prompt_tokens_ = 0;
  int64_t cached_prompt_tokens_ = 0;
  std::vector<uint64_t> cached_probes_;
  absl::Time probes_at_ = absl::InfinitePast();
  int64_t drafts_verified_ = 0;
  int64_t drafts_accepted_ = 0;
  PrefixCache cache_;
  std::unique_ptr<DraftProposer> drafter_;  // null unless speculative_tokens > 0
  StepStats stats_;
  // Steps run here (synchronously, or on the executor's thread); launched ones not processed
  // yet, oldest first, with the ids of the newest launched and processed ones.
  std::unique_ptr<StepExecutor> executor_;
  std::deque<LaunchedStep> launched_;
  int64_t steps_launched_ = 0;
  int64_t steps_completed_ = 0;
  // Finished or cancelled sequences that a launched step still computes.
  std::vector<std::unique_ptr<Sequence>> retired_;

  StepWindow step_window_;  // engine thread
  mutable absl::Mutex load_mu_;
  EngineLoad load_ ABSL_GUARDED_BY(load_mu_);
  std::vector<RequestProgress> progress_ ABSL_GUARDED_BY(load_mu_);
  // Structured output; null without a tokenizer.
  std::unique_ptr<StructuredOutputMatchers> matchers_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_ENGINE_H_
