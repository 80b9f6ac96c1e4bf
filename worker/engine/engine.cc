// Engine: scheduling, KV block accounting, launching and completing steps, stop conditions.
// Over 800 lines: every stage reads and writes the Sequence record defined here, private to this
// file; the stepping thread itself is StepExecutor (step_executor.h).
#include "worker/engine/engine.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "worker/sampling/logit_adjuster.h"
#include "worker/sampling/sampler.h"

namespace deepinfer {

struct Engine::Sequence {
  std::string id;
  GenerationParams params;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t prompt_len = 0;
  int64_t computed = 0;    // leading tokens whose KV entries are in the cache
  int64_t high_water = 0;  // the most tokens computed before a preemption (below: a replay)
  // A bounded rebuild (CausalLm::BoundedReplayStart): while the sequence waits, the paged
  // bytes of its first blocks in host memory; the positions its steps pass on.
  std::vector<char> kept_bytes;
  int64_t kept_end = 0;
  int64_t replay_from = 0;
  std::vector<int32_t> blocks;
  // Chain hashes of the full blocks of `tokens` (PrefixCache::ExtendHashes), how many of
  // `blocks` were offered to the prefix cache (or came from it), how many lead as a shared hit.
  std::vector<uint64_t> block_hashes;
  int32_t registered = 0;
  int32_t shared_blocks = 0;
  // Prompt tokens served from the prefix cache at the first admission; -1 before it.
  int64_t cached_prompt_tokens = -1;
  SamplingParams sampling;
  // logit_bias, min_tokens, penalties; unset when the request asks for none of them.
  std::optional<LogitAdjuster> adjuster;
  std::vector<TokenLogprob> logprobs;
  std::unique_ptr<tokenizer::IncrementalDecoder> decoder;
  std::string text;
  size_t max_stop_len = 0;
  bool done = false;
  // Speculative decoding: the model's hidden rows of positions [hidden_from, computed) not yet
  // run through the draft head ([rows, width], StepOutput::hidden), and this step's drafts.
  int64_t hidden_from = 0;
  std::vector<float> hidden;
  std::vector<int32_t> drafts;
  // When the engine took the request off its queue (StepStats' time to first token).
  absl::Time arrived = absl::InfinitePast();
  // Structured output: where the output is in its grammar; no_allowed_token once a step found
  // no token of the vocabulary that can continue it.
  std::unique_ptr<grammar::GrammarMatcher> matcher;
  bool no_allowed_token = false;
  // Async scheduling: how many launched steps sample a token of this sequence that is not
  // appended yet (at most one while a step is scheduled; their positions count in `computed`
  // once a launched step computes them), its row in the newest of them, and the newest step the
  // sequence is in (its blocks are in use until that step is processed).
  int32_t pending = 0;
  int32_t pending_row = -1;
  int64_t last_step = 0;

  // Tokens appended or being sampled.
  int64_t known() const { return static_cast<int64_t>(tokens.size()) + pending; }
  int64_t remaining() const { return known() - computed; }
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

namespace {

// How often, and how many, cached probe blocks go into the load (EngineLoad::cached_probes).
constexpr absl::Duration kProbeSummaryInterval = absl::Milliseconds(200);
constexpr int32_t kMaxProbeSummary = 512;

RequestResult ErrorResult(const std::string& id, const absl::Status& status, uint64_t generation) {
  RequestResult r;
  r.set_request_id(id);
  r.set_error_code(absl::StatusCodeToString(status.code()));
  r.set_error_message(std::string(status.message()));
  r.set_group_generation(generation);
  return r;
}

// FNV-1a: a seed derived from the request id that is the same in every build.
uint64_t IdSeed(const std::string& id) {
  uint64_t h = 14695981039346656037ull;
  for (unsigned char c : id) h = (h ^ c) * 1099511628211ull;
  return h;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(CausalLm* model, KvBlockPool* pool,
                                                       RequestQueue* queue,
                                                       const tokenizer::Tokenizer* tokenizer,
                                                       EngineOptions options) {
  if (model == nullptr || pool == nullptr || queue == nullptr) {
    return absl::InvalidArgumentError("Engine: model, pool and queue are required");
  }
  if (options.max_batch_tokens <= 0 || options.max_running <= 0) {
    return absl::InvalidArgumentError("Engine: max_batch_tokens and max_running must be > 0");
  }
  // More sequences than tokens per step would leave the newest decodes without budget while
  // the oldest keep going.
  options.max_running = std::min(options.max_running, options.max_batch_tokens);
  const int64_t capacity = static_cast<int64_t>(pool->num_blocks()) * pool->block_size();
  if (capacity < 2) return absl::InvalidArgumentError("Engine: the KV pool holds < 2 tokens");
  if (options.context_limit <= 0) options.context_limit = model->config().max_position_embeddings;
  if (options.context_limit <= 0) options.context_limit = capacity;
  options.context_limit = std::min(options.context_limit, capacity);
  if (options.speculative_tokens < 0) {
    return absl::InvalidArgumentError("Engine: speculative_tokens must be >= 0");
  }
  if (options.speculative_tokens > 0 && model->num_draft_layers() == 0) {
    return absl::InvalidArgumentError(
        "Engine: speculative decoding needs a model built with its draft head (MTP layers)");
  }
  if (!(options.draft_min_confidence >= 0.0f && options.draft_min_confidence <= 1.0f)) {
    return absl::InvalidArgumentError("Engine: draft_min_confidence must be in [0, 1]");
  }
  if (options.speculative_tokens > 0) {  // a draft head that cannot run yet: refused here
    absl::StatusOr<DraftOutput> probe = model->Draft({}, pool);
    if (!probe.ok()) return probe.status();
    const int64_t most = model->MaxDraftsPerStep(*pool);
    if (options.speculative_tokens > most) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Engine: speculative_tokens ", options.speculative_tokens, " but the model's KV cache (",
          pool->spec().ToString(), ") lets a step verify at most ", most,
          " drafts per sequence (ModelConfig::speculative_tokens when it was made)"));
    }
  }
  return std::unique_ptr<Engine>(new Engine(model, pool, queue, tokenizer, std::move(options)));
}

Engine::Engine(CausalLm* model, KvBlockPool* pool, RequestQueue* queue,
               const tokenizer::Tokenizer* tokenizer, EngineOptions options)
    : model_(model),
      pool_(pool),
      queue_(queue),
      tokenizer_(tokenizer),
      options_(std::move(options)),
      vocab_(model->config().vocab_size),
      cache_(pool, options_.prefix_cache) {
  if (options_.speculative_tokens > 0) {
    drafter_ = std::make_unique<DraftProposer>(model, pool, options_.draft_min_confidence);
  }
  // Drafting and verification need every step's tokens on the host before the next step forms.
  executor_ =
      std::make_unique<StepExecutor>(model, pool, options_.async_scheduling && drafter_ == nullptr);
  stats_.set_async_scheduling(executor_->threaded());
  // Steps then allocate nothing from the pool behind the scheduler's back.
  model_->PrepareCache(pool_);
  // A step being recorded as a graph on the stepping thread must not see this thread's copies
  // on its stream: block copies to and from the prefix cache's store wait for the steps first.
  if (executor_->threaded() && pool_->backend()->SupportsCapture()) {
    cache_.set_before_block_io([this] { executor_->WaitIdle(); });
  }
  if (tokenizer_ != nullptr) {
    matchers_ = std::make_unique<StructuredOutputMatchers>(tokenizer_, static_cast<int32_t>(vocab_),
                                                           options_.eos_token_ids);
  }
  UpdateLoad();
}

Engine::~Engine() { DropAll(); }

bool Engine::HasWork() const {
  // An empty step in flight (step_when_idle) is no work of its own.
  return !running_.empty() || !waiting_.empty() || queue_->num_items() > 0 ||
         std::any_of(launched_.begin(), launched_.end(),
                     [](const LaunchedStep& s) { return !s.rows.empty(); });
}

void Engine::Admit(WorkItem item, std::vector<RequestResult>* finished) {
  if (held_ids_.contains(item.request_id())) return;  // a resend of a request we run
  const GenerationParams& p = item.params();
  auto fail = [&](absl::Status s) {
    finished->push_back(ErrorResult(item.request_id(), s, options_.group_generation));
  };
  const int64_t n = item.prompt_token_ids_size();
  if (n == 0) return fail(absl::InvalidArgumentError("empty prompt"));
  for (int32_t t : item.prompt_token_ids()) {
    if (t < 0 || t >= vocab_) {
      return fail(absl::InvalidArgumentError(
          absl::StrCat("prompt token id ", t, " outside the vocabulary of ", vocab_)));
    }
  }
  if (n >= options_.context_limit) {
    return fail(absl::InvalidArgumentError(absl::StrCat("prompt of ", n,
                                                        " tokens leaves no room in the context of ",
                                                        options_.context_limit, " tokens")));
  }
  if (p.max_tokens() < 0) return fail(absl::InvalidArgumentError("max_tokens < 0"));
  if (p.temperature() < 0) return fail(absl::InvalidArgumentError("temperature < 0"));
  if (p.top_p() < 0 || p.top_p() > 1)
    return fail(absl::InvalidArgumentError("top_p not in [0, 1]"));
  if (p.top_k() < 0) return fail(absl::InvalidArgumentError("top_k < 0"));
  if (p.stop_size() > 0 && tokenizer_ == nullptr) {
    return fail(absl::InvalidArgumentError(
        "stop strings need a tokenizer, and the model directory has none"));
  }
  std::unique_ptr<grammar::GrammarMatcher> matcher;
  if (p.has_structured_output()) {
    if (matchers_ == nullptr) {
      return fail(absl::InvalidArgumentError(
          "structured output needs a tokenizer, and the model directory has none"));
    }
    if (p.ignore_eos()) {
      return fail(absl::InvalidArgumentError(
          "ignore_eos cannot be combined with structured output (the end of the output is where "
          "the grammar completes)"));
    }
    absl::StatusOr<std::unique_ptr<grammar::GrammarMatcher>> m =
        matchers_->Create(p.structured_output());
    if (!m.ok()) return fail(m.status());
    matcher = *std::move(m);
  }
  auto seq = std::make_unique<Sequence>();
  seq->matcher = std::move(matcher);
  seq->id = item.request_id();
  seq->params = p;
  seq->tokens.assign(item.prompt_token_ids().begin(), item.prompt_token_ids().end());
  seq->prompt_len = n;
  seq->sampling.temperature = p.temperature();
  seq->sampling.top_k = p.top_k();
  seq->sampling.top_p = p.top_p() > 0 ? p.top_p() : 1.0f;  // proto default 0: no top-p cut
  // The coordinator always sets a seed; without one the id keeps a request reproducible.
  seq->sampling.seed = p.has_seed() ? p.seed() : IdSeed(item.request_id());
  seq->sampling.num_logprobs = std::max(0, p.logprobs());
  LogitAdjusterParams adjust;
  adjust.logit_bias.insert(p.logit_bias().begin(), p.logit_bias().end());
  adjust.presence_penalty = p.presence_penalty();
  adjust.frequency_penalty = p.frequency_penalty();
  adjust.repetition_penalty = p.repetition_penalty() == 0.0f ? 1.0f : p.repetition_penalty();
  adjust.min_tokens = p.min_tokens();
  if (!p.ignore_eos()) adjust.stop_tokens = options_.eos_token_ids;
  adjust.stop_tokens.insert(adjust.stop_tokens.end(), p.stop_token_ids().begin(),
                            p.stop_token_ids().end());
  absl::StatusOr<LogitAdjuster> adjuster =
      LogitAdjuster::Create(std::move(adjust), vocab_, seq->tokens);
  if (!adjuster.ok()) return fail(adjuster.status());
  if (adjuster->active()) seq->adjuster = std::move(*adjuster);
  if (tokenizer_ != nullptr) {
    seq->decoder =
        std::make_unique<tokenizer::IncrementalDecoder>(tokenizer_, /*skip_special_tokens=*/true);
  }
  for (const std::string& s : p.stop()) seq->max_stop_len = std::max(seq->max_stop_len, s.size());
  seq->arrived = absl::Now();
  held_ids_.insert(seq->id);
  waiting_.push_back(std::move(seq));
}

void Engine::CancelRequests(const std::vector<std::string>& ids) {
  for (const std::string& id : ids) {
    if (!held_ids_.contains(id)) continue;
    held_ids_.erase(id);
    for (auto it = running_.begin(); it != running_.end(); ++it) {
      if ((*it)->id == id) {
        Retire(std::move(*it));
        running_.erase(it);
        break;
      }
    }
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if ((*it)->id == id) {
        Retire(std::move(*it));
        waiting_.erase(it);
        break;
      }
    }
  }
}

void Engine::Retire(std::unique_ptr<Sequence> seq) {
  seq->done = true;  // what launched steps compute for it is dropped
  if (InFlight(*seq)) {
    retired_.push_back(std::move(seq));
  } else {
    FreeBlocks(seq.get());
  }
}

void Engine::FreeBlocks(Sequence* seq) {
  // Its state slot, keyed by its first block of its own, which the cache may keep.
  if (static_cast<size_t>(seq->shared_blocks) < seq->blocks.size()) {
    pool_->ReleaseSequenceSlot(seq->blocks[seq->shared_blocks]);
  }
  cache_.Release(seq->blocks);
  seq->blocks.clear();
  seq->registered = 0;
  seq->shared_blocks = 0;
  seq->computed = 0;
  seq->hidden.clear();
  seq->hidden_from = 0;
  seq->drafts.clear();
}

void Engine::AcquireCachedPrefix(Sequence* seq) {
  CHECK(seq->blocks.empty() && seq->computed == 0) << seq->id;
  seq->kept_end = seq->replay_from = 0;  // no kept entries: computed from the hit or from 0
  if (!cache_.enabled()) return;
  const int64_t n = static_cast<int64_t>(seq->tokens.size());
  cache_.ExtendHashes(seq->tokens, n, &seq->block_hashes);
  // At least the last token is computed: its logits give the next token.
  std::vector<int32_t> hit = cache_.Acquire(seq->tokens, seq->block_hashes, n - 1);
  if (hit.empty()) return;
  const int64_t hit_end = static_cast<int64_t>(hit.size()) * pool_->block_size();
  int64_t start = hit_end;
  if (!pool_->spec().SharesPrefixBlocks()) {
    // Blocks hold no per-sequence state (window rings, compressor rows): a bounded replay
    // rebuilds it, in a slot keyed by a block of the sequence's own. Without either, no hit.
    start = model_->BoundedReplayStart(hit_end);
    if (start <= 0 || cache_.num_available_blocks() < 1) {
      cache_.Release(hit);
      return;
    }
    absl::StatusOr<std::vector<int32_t>> own = cache_.Allocate(1);
    CHECK(own.ok()) << own.status();  // a block is available
    seq->kept_end = hit_end;
    seq->replay_from = start;
    seq->high_water = std::max(seq->high_water, hit_end);  // the replay counts as replayed
    hit.push_back(own->front());
  }
  seq->shared_blocks = seq->registered = static_cast<int32_t>(hit_end / pool_->block_size());
  seq->blocks = std::move(hit);
  seq->computed = start;
}

void Engine::RegisterFullBlocks(Sequence* seq) {
  // A position whose token is still being sampled counts in `computed`, not in `tokens`: its
  // block is offered once the token is known (RegisterComputed stops at the tokens).
  seq->registered = cache_.RegisterComputed(seq->blocks, seq->tokens, seq->computed,
                                            seq->registered, &seq->block_hashes);
}

void Engine::Preempt(std::list<std::unique_ptr<Sequence>>::iterator it) {
  VLOG(1) << "rank " << options_.rank << ": preempting " << (*it)->id << " ("
          << (*it)->tokens.size() << " tokens)";
  // A launched step may still write its blocks, and the rebuild's copy reads them: the device
  // finishes first. Its token still comes (Complete appends it to the waiting sequence).
  if (InFlight(**it)) executor_->WaitIdle();
  (*it)->high_water = std::max((*it)->high_water, (*it)->computed);
  KeepForRebuild(it->get());
  FreeBlocks(it->get());
  waiting_.push_front(std::move(*it));
  running_.erase(it);
  ++preemptions_;
}

void Engine::KeepForRebuild(Sequence* s) {
  // Entries of positions below kept_end are valid in its blocks (restored, or computed).
  const int64_t kept_end = std::max(s->computed, s->kept_end);
  const int64_t start = model_->BoundedReplayStart(kept_end);
  s->kept_end = s->replay_from = 0;
  if (start <= 0) return;  // replayed from position 0
  const std::vector<int32_t> kept(s->blocks.begin(),
                                  s->blocks.begin() + pool_->BlocksFor(kept_end));
  absl::StatusOr<std::vector<char>> bytes = pool_->ReadBlocks(kept);
  CHECK(bytes.ok()) << bytes.status();  // the sequence's own blocks
  s->kept_bytes = std::move(*bytes);
  s->kept_end = kept_end;
  s->replay_from = start;
  VLOG(1) << "rank " << options_.rank << ": " << s->id << " keeps the paged entries of its first "
          << kept_end << " positions (" << s->kept_bytes.size()
          << " bytes); its rebuild replays from position " << start;
}

bool Engine::RestoreKept(Sequence* s) {
  CHECK(s->blocks.empty() && s->computed == 0) << s->id;
  const int32_t n = pool_->BlocksFor(s->kept_end);
  if (cache_.num_available_blocks() < n) return false;
  absl::StatusOr<std::vector<int32_t>> blocks = cache_.Allocate(n);
  CHECK(blocks.ok()) << blocks.status();
  const absl::Status restored = pool_->WriteBlocks(*blocks, s->kept_bytes);
  CHECK(restored.ok()) << restored;  // as many blocks as were read
  s->blocks = std::move(*blocks);
  s->kept_bytes = std::vector<char>();
  s->computed = s->replay_from;
  return true;
}

bool Engine::Reserve(Sequence* seq, int64_t tokens,
                     const absl::flat_hash_set<Sequence*>& scheduled) {
  const int32_t needed =
      pool_->BlocksFor(seq->computed + tokens) - static_cast<int32_t>(seq->blocks.size());
  if (needed <= 0) return true;
  while (cache_.num_available_blocks() < needed) {
    // Victim: the most recently admitted running sequence not already in this step.
    auto victim = running_.end();
    for (auto it = running_.end(); it != running_.begin();) {
      --it;
      if (it->get() != seq && !scheduled.contains(it->get())) {
        victim = it;
        break;
      }
    }
    if (victim == running_.end()) return false;
    Preempt(victim);
  }
  auto blocks = cache_.Allocate(needed);
  CHECK(blocks.ok()) << blocks.status();
  seq->blocks.insert(seq->blocks.end(), blocks->begin(), blocks->end());
  return true;
}

absl::StatusOr<std::vector<RequestResult>> Engine::Step() {
  std::vector<RequestResult> finished;
  RequestQueue::Drained drained = queue_->Drain();
  for (WorkItem& item : drained.items) Admit(std::move(item), &finished);
  CancelRequests(drained.cancelled);

  std::vector<Planned> plan;
  absl::flat_hash_set<Sequence*> scheduled;
  int64_t budget = options_.max_batch_tokens;
  const int64_t bs = pool_->block_size();
  auto plan_one = [&](Sequence* s, int64_t n) {
    plan.push_back({s, n});
    scheduled.insert(s);
    budget -= n;
  };
  // 1. Decodes: one token each, oldest first.
  for (auto it = running_.begin(); it != running_.end() && budget > 0;) {
    Sequence* s = it->get();
    if (s->remaining() != 1 || scheduled.contains(s) || (s->pending > 0 && !CanDecodeAhead(*s))) {
      ++it;
      continue;
    }
    if (!Reserve(s, 1, scheduled)) {
      auto next = std::next(it);
      Preempt(it);
      it = next;
      continue;
    }
    plan_one(s, 1 + ReserveDraftRoom(s, budget - 1, scheduled));
    ++it;
  }
  // 2. Prefill chunks of running sequences (a chunk shrinks to the free blocks before anyone
  // is preempted for it).
  for (auto it = running_.begin(); it != running_.end() && budget > 0;) {
    Sequence* s = it->get();
    if (s->remaining() <= 1 || scheduled.contains(s)) {
      ++it;
      continue;
    }
    const int64_t slack = static_cast<int64_t>(s->blocks.size()) * bs - s->computed;
    const int64_t room = slack + static_cast<int64_t>(cache_.num_available_blocks()) * bs;
    int64_t n = std::min(s->remaining(), budget);
    if (room >= 1) n = std::min(n, room);
    if (!Reserve(s, room >= 1 ? n : 1, scheduled)) {
      auto next = std::next(it);
      Preempt(it);
      it = next;
      continue;
    }
    if (room < 1) n = 1;
    plan_one(s, n);
    ++it;
  }
  // 3. Admission, preempted sequences first.
  while (!waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < options_.max_running) {
    Sequence* s = waiting_.front().get();
    if (s->pending > 0) break;  // preempted while its token was sampled: taken back once known
    if (!s->kept_bytes.empty()) {
      if (!RestoreKept(s)) break;  // its kept entries do not fit yet
    } else {
      AcquireCachedPrefix(s);
    }
    // Free positions in its blocks (a restored sequence's) and in free blocks.
    const int64_t room = static_cast<int64_t>(s->blocks.size()) * bs - s->computed +
                         static_cast<int64_t>(cache_.num_available_blocks()) * bs;
    if (room < 1) {
      FreeBlocks(s);  // its cached blocks stay cached, idle; taken again when it fits
      break;
    }
    if (s->cached_prompt_tokens < 0) {
      s->cached_prompt_tokens = std::min(s->computed, s->prompt_len);
      prompt_tokens_ += s->prompt_len;
      cached_prompt_tokens_ += s->cached_prompt_tokens;
    }
    const int64_t n = std::min({s->remaining(), budget, room});
    running_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
    CHECK(Reserve(s, n, scheduled));  // fits in free blocks: nobody is preempted
    plan_one(s, n);
  }

  if (drafter_ != nullptr && !plan.empty()) {
    std::vector<std::pair<Sequence*, int64_t>> planned;
    for (const Planned& p : plan) planned.emplace_back(p.seq, p.n);
    if (absl::Status st = ProposeDrafts(planned); !st.ok()) return st;
    // A decode's tokens are its last one and its drafts (fewer than it had room for, maybe).
    for (Planned& p : plan) {
      if (p.seq->remaining() == 1) p.n = 1 + static_cast<int64_t>(p.seq->drafts.size());
    }
  }
  const bool launched = !plan.empty() || options_.step_when_idle;
  if (launched) Launch(plan);
  // Every launched step is processed here, except, with async scheduling, the one just launched:
  // it runs while the caller goes on and the next Step() forms the step after it.
  const size_t keep = launched && executor_->threaded() ? 1 : 0;
  while (launched_.size() > keep) {
    if (absl::Status st = Complete(&finished); !st.ok()) return st;
  }
  UpdateLoad();
  return finished;
}

absl::StatusOr<std::vector<RequestResult>> Engine::Flush() {
  std::vector<RequestResult> finished;
  while (!launched_.empty()) {
    if (absl::Status st = Complete(&finished); !st.ok()) return st;
  }
  UpdateLoad();
  return finished;
}

bool Engine::InFlight(const Sequence& s) const { return s.last_step > steps_completed_; }

bool Engine::CanDecodeAhead(const Sequence& s) const {
  // Where the next step's inputs depend on the token itself: a grammar's mask, penalties, drafts.
  if (s.matcher != nullptr || drafter_ != nullptr ||
      (s.adjuster.has_value() && s.adjuster->counts_tokens())) {
    return false;
  }
  // A sequence that ends with the pending token, whatever it is, needs no more steps.
  const int64_t max_tokens = s.params.max_tokens();
  if (max_tokens > 0 && s.known() - s.prompt_len >= max_tokens) return false;
  return s.known() < options_.context_limit;
}

void Engine::Launch(const std::vector<Planned>& plan) {
  LaunchedStep launched;
  launched.id = ++steps_launched_;
  StepJob job;
  job.batch.reserve(plan.size());
  for (size_t i = 0; i < plan.size(); ++i) {
    Sequence* s = plan[i].seq;
    const int64_t n = plan[i].n;
    SequenceStep step;
    const int64_t own = std::min(n, s->remaining());
    const int64_t appended = std::min<int64_t>(s->computed + own, s->tokens.size());
    step.tokens.assign(s->tokens.begin() + s->computed, s->tokens.begin() + appended);
    if (s->computed + own > appended) {
      // Its one new token is the one the step in flight samples: filled in when that step ends.
      step.tokens.push_back(0);
      job.from_previous.emplace_back(static_cast<int32_t>(i), s->pending_row);
    }
    step.tokens.insert(step.tokens.end(), s->drafts.begin(), s->drafts.end());
    step.position_offset = s->computed;
    step.block_table = s->blocks;
    step.replay_from = s->replay_from;
    step.kept_end = s->kept_end;
    step.shared_blocks = s->shared_blocks;
    // A constrained sequence is not drafted: verification rows carry no grammar mask.
    step.return_hidden = drafter_ != nullptr && s->matcher == nullptr;
    const bool samples = s->drafts.empty() && s->computed + n == s->known();
    if (!s->drafts.empty()) {
      // Verified row by row: every row's token is picked where the logits are (on the device),
      // only the picks come back.
      step.all_logits = true;
      step.return_logits = false;
      step.row_sampling = VerifySampling(*s);
    } else {
      step.return_logits = false;  // only the sampled token is needed
      if (samples) {
        step.sampling = s->sampling;
        if (s->adjuster.has_value())
          step.sampling->adjustments = s->adjuster->EntriesAfter(s->pending);
        if (s->matcher != nullptr) {
          Sequence* seq = s;
          const std::vector<int32_t>* eos = &options_.eos_token_ids;
          // Runs on the stepping thread; the sequence samples nothing else meanwhile, so its
          // matcher and tokens stay as they are until this step is processed.
          step.fill_allowed_tokens = [seq, eos](uint32_t* words) {
            seq->matcher->FillNextTokenBitmask(words);
            const int32_t n = seq->matcher->vocabulary().mask_words();
            if (seq->generated() < seq->params.min_tokens()) {
              // The min_tokens mask (LogitAdjuster) takes these too; clearing them here makes
              // a grammar that can only end now fail its request instead of sampling from a
              // row with every logit at -inf.
              auto clear = [&](int32_t t) {
                if (t >= 0 && t / 32 < n) words[t / 32] &= ~(1u << (t % 32));
              };
              for (int32_t t : *eos) clear(t);
              for (int32_t t : seq->params.stop_token_ids()) clear(t);
            }
            for (int32_t w = 0; w < n; ++w) {
              if (words[w] != 0) return true;
            }
            seq->no_allowed_token = true;
            return false;
          };
        }
      }
    }
    job.batch.push_back(std::move(step));

    const bool decode = n == 1 && s->computed >= s->prompt_len;
    launched.decodes += decode ? 1 : 0;
    launched.prefill_tokens += decode ? 0 : n;
    replayed_tokens_ += std::clamp<int64_t>(s->high_water - s->computed, 0, n);
    computed_tokens_ += n;
    launched.rows.push_back({s, n, s->computed, samples, !s->drafts.empty()});
    s->last_step = launched.id;
    // The positions this step computes count as computed from now on (the next step, formed
    // while this one runs, continues after them); verified drafts count once they are checked.
    if (s->drafts.empty()) s->computed += n;
    if (samples) {
      ++s->pending;
      s->pending_row = static_cast<int32_t>(i);
    }
    // The blocks it fills are offered now: whoever reads them runs after this step.
    RegisterFullBlocks(s);
  }
  executor_->Submit(std::move(job));
  launched_.push_back(std::move(launched));
}

absl::Status Engine::Complete(std::vector<RequestResult>* finished) {
  LaunchedStep step = std::move(launched_.front());
  launched_.pop_front();
  StepDone done = executor_->Take();
  steps_completed_ = step.id;
  if (!done.output.ok()) return done.output.status();
  StepOutput& out = *done.output;
  step_window_.Record(step.decodes + step.prefill_tokens, step.decodes);
  stats_.AddStep(done.start, done.end - done.start, step.decodes, step.prefill_tokens,
                 done.recorded_graph, done.graph_replayed);
  for (size_t i = 0; i < step.rows.size(); ++i) {
    const LaunchedRow& row = step.rows[i];
    Sequence* s = row.seq;
    if (s->done) {  // finished at an earlier step or cancelled: this row is dropped
      stats_.AddDropped(row.n);
      continue;
    }
    RequestResult result;
    if (row.drafts) {
      bool finished_now = false;
      const std::vector<SampledToken> no_picks;
      const int64_t rows = AdvanceVerified(
          s, i < out.row_sampled.size() ? out.row_sampled[i] : no_picks, &finished_now, &result);
      s->computed += rows;  // the rejected drafts' rows are not
      RegisterFullBlocks(s);
      if (finished_now) {
        s->done = true;
        stats_.AddFinished(result.token_ids_size());
        finished->push_back(std::move(result));
      } else {
        KeepHidden(s, row.from, std::move(out.hidden[i]), rows, row.n);
      }
      continue;
    }
    if (drafter_ != nullptr && s->matcher == nullptr) {
      KeepHidden(s, row.from, std::move(out.hidden[i]), row.n, row.n);
    }
    if (!row.samples) continue;  // an intermediate prefill chunk
    --s->pending;
    if (s->generated() == 0) stats_.AddFirstToken(done.end - s->arrived);
    if (Advance(s, out.sampled[i], &result)) {
      s->done = true;
      stats_.AddFinished(result.token_ids_size());
      finished->push_back(std::move(result));
    } else {
      RegisterFullBlocks(s);  // a launched step may have filled a block up to this token
    }
  }
  // A sequence preempted while its token was sampled waits with it, and may have finished.
  for (auto it = running_.begin(); it != running_.end();) {
    if (!(*it)->done) {
      ++it;
      continue;
    }
    held_ids_.erase((*it)->id);
    Retire(std::move(*it));
    it = running_.erase(it);
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (!(*it)->done) {
      ++it;
      continue;
    }
    held_ids_.erase((*it)->id);
    Retire(std::move(*it));
    it = waiting_.erase(it);
  }
  // Retired sequences whose last step is processed give their blocks back.
  for (auto it = retired_.begin(); it != retired_.end();) {
    if (InFlight(**it)) {
      ++it;
      continue;
    }
    FreeBlocks(it->get());
    it = retired_.erase(it);
  }
  return absl::OkStatus();
}

bool Engine::Advance(Sequence* s, const SampledToken& sampled, RequestResult* result) {
  const int32_t t = sampled.token;
  const GenerationParams& p = s->params;
  if (s->matcher != nullptr) {
    if (s->no_allowed_token) {
      std::string message =
          "structured output: no token of the vocabulary can continue the output within its "
          "grammar";
      if (s->generated() < p.min_tokens()) {
        absl::StrAppend(&message, " (the grammar can only end here, after ", s->generated(),
                        " generated tokens, and min_tokens is ", p.min_tokens(), ")");
      }
      *result =
          ErrorResult(s->id, absl::FailedPreconditionError(message), options_.group_generation);
      return true;
    }
    if (!s->matcher->AcceptToken(t)) {
      *result = ErrorResult(s->id,
                            absl::InternalError(absl::StrCat("structured output: sampled token ", t,
                                                             " is outside the grammar's mask")),
                            options_.group_generation);
      return true;
    }
  }
  const bool eos = !p.ignore_eos() &&
                   std::find(options_.eos_token_ids.begin(), options_.eos_token_ids.end(), t) !=
                       options_.eos_token_ids.end();
  const bool stop_token = std::find(p.stop_token_ids().begin(), p.stop_token_ids().end(), t) !=
                          p.stop_token_ids().end();
  if (eos || stop_token) {
    Finish(s, "stop", result);
    return true;
  }
  s->tokens.push_back(t);
  if (s->adjuster.has_value()) s->adjuster->AddGenerated(t);
  if (p.logprobs() >= 0) {
    TokenLogprob lp;
    lp.set_token_id(t);
    lp.set_logprob(sampled.logprob);
    for (const auto& [id, logprob] : sampled.top_logprobs) {
      lp.add_top_token_ids(id);
      lp.add_top_logprobs(logprob);
    }
    s->logprobs.push_back(std::move(lp));
  }
  if (s->decoder != nullptr) {
    // An id past the tokenizer (the model's vocabulary can be larger) adds no text.
    const size_t from = s->text.size();
    s->text += s->decoder->Add(static_cast<uint32_t>(t));
    // Stop strings count only from min_tokens on (as vLLM does).
    if (s->generated() >= p.min_tokens() && CutAtStopString(s, from)) {
      s->decoder.reset();  // the rest of the text is not returned
      Finish(s, "stop", result);
      return true;
    }
  }
  if ((p.max_tokens() > 0 && s->generated() >= p.max_tokens()) ||
      static_cast<int64_t>(s->tokens.size()) >= options_.context_limit) {
    Finish(s, "length", result);
    return true;
  }
  return false;
}

bool Engine::CutAtStopString(Sequence* s, size_t from) {
  if (s->max_stop_len == 0) return false;
  // A stop string may start in text that was already there.
  const size_t start = from >= s->max_stop_len - 1 ? from - (s->max_stop_len - 1) : 0;
  size_t best = std::string::npos;
  for (const std::string& stop : s->params.stop()) {
    if (stop.empty()) continue;
    const size_t pos = s->text.find(stop, start);
    if (pos < best) best = pos;
  }
  if (best == std::string::npos) return false;
  s->text.resize(best);
  return true;
}

void Engine::Finish(Sequence* s, const std::string& reason, RequestResult* result) {
  std::string why = reason;
  if (s->decoder != nullptr) {
    const size_t from = s->text.size();
    s->text += s->decoder->Finish();
    if (CutAtStopString(s, from)) why = "stop";
  }
  result->Clear();
  result->set_request_id(s->id);
  result->mutable_token_ids()->Add(s->tokens.begin() + s->prompt_len, s->tokens.end());
  result->set_text(s->text);
  result->set_finish_reason(why);
  result->set_prompt_tokens(static_cast<int32_t>(s->prompt_len));
  result->set_cached_prompt_tokens(
      static_cast<int32_t>(std::max<int64_t>(0, s->cached_prompt_tokens)));
  for (TokenLogprob& lp : s->logprobs) *result->add_logprobs() = std::move(lp);
  result->set_group_generation(options_.group_generation);
}

// ---- Speculative decoding ------------------------------------------------------------------

int64_t Engine::ReserveDraftRoom(Sequence* s, int64_t budget,
                                 const absl::flat_hash_set<Sequence*>& scheduled) {
  if (drafter_ == nullptr || s->hidden.empty()) return 0;
  int64_t room = std::min<int64_t>(options_.speculative_tokens, budget);
  // A step adds at most drafts + 1 tokens; none past max_tokens or the context.
  const int64_t max_tokens = s->params.max_tokens();
  if (max_tokens > 0) room = std::min(room, max_tokens - s->generated() - 1);
  room = std::min(room, options_.context_limit - static_cast<int64_t>(s->tokens.size()) - 1);
  // Drafts never preempt anyone: only what the sequence's blocks and free blocks hold.
  const int64_t bs = pool_->block_size();
  const int64_t slack = static_cast<int64_t>(s->blocks.size()) * bs - (s->computed + 1);
  room = std::min(room, slack + static_cast<int64_t>(cache_.num_available_blocks()) * bs);
  if (room <= 0) return 0;
  CHECK(Reserve(s, 1 + room, scheduled));  // fits in free blocks: nobody is preempted
  return room;
}

absl::Status Engine::ProposeDrafts(const std::vector<std::pair<Sequence*, int64_t>>& planned) {
  std::vector<DraftRequest> requests;
  std::vector<Sequence*> owners;
  for (const auto& [s, n] : planned) {
    s->drafts.clear();
    if (s->hidden.empty()) continue;
    DraftRequest r;
    r.first_position = s->hidden_from;
    // Each row's next token: the rows end at computed - 1, whose next token is the last one.
    r.next_tokens.assign(s->tokens.begin() + s->hidden_from + 1,
                         s->tokens.begin() + s->computed + 1);
    r.hidden = std::move(s->hidden);
    s->hidden.clear();
    r.block_table = &s->blocks;
    r.shared_blocks = s->shared_blocks;
    r.replay_from = s->replay_from;
    r.kept_end = s->kept_end;
    r.max_drafts = s->remaining() == 1 ? static_cast<int32_t>(n - 1) : 0;
    requests.push_back(std::move(r));
    owners.push_back(s);
  }
  if (requests.empty()) return absl::OkStatus();
  if (absl::Status st = drafter_->Propose(&requests); !st.ok()) return st;
  for (size_t i = 0; i < requests.size(); ++i) owners[i]->drafts = std::move(requests[i].drafts);
  return absl::OkStatus();
}

std::vector<SamplingParams> Engine::VerifySampling(const Sequence& s) const {
  // Row i holds the logits after the sequence's last token (i = 0) or after draft i: its token
  // is picked as a decode step at that position would pick it (greedy, or the seeded exponential
  // race keyed by the position), with the adjustments of the tokens accepted by then; row i is
  // only used when drafts 1..i were accepted, so those are the tokens counted.
  std::vector<SamplingParams> rows(1 + s.drafts.size(), s.sampling);
  if (s.adjuster.has_value()) {
    LogitAdjuster after = *s.adjuster;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (i > 0) after.AddGenerated(s.drafts[i - 1]);
      rows[i].adjustments = after.Entries();
    }
  }
  return rows;
}

int64_t Engine::AdvanceVerified(Sequence* s, const std::vector<SampledToken>& picks, bool* finished,
                                RequestResult* result) {
  const int64_t k = static_cast<int64_t>(s->drafts.size());
  drafts_verified_ += k;
  std::vector<int32_t> drafts = std::move(s->drafts);
  s->drafts.clear();
  if (static_cast<int64_t>(picks.size()) != k + 1) {
    *result =
        ErrorResult(s->id,
                    absl::InternalError(absl::StrCat("verification: the step picked ", picks.size(),
                                                     " tokens for ", k + 1, " rows")),
                    options_.group_generation);
    *finished = true;
    return 1;
  }
  // Accepting draft i + 1 exactly when row i's pick equals it makes the output the model's own,
  // token for token, not only in distribution (docs/engine.md).
  for (int64_t i = 0; i <= k; ++i) {
    const bool match = i < k && picks[i].token == drafts[i];
    if (Advance(s, picks[i], result)) {
      *finished = true;
      return i + 1;
    }
    if (!match) return i + 1;
    ++drafts_accepted_;
  }
  return k + 1;
}

void Engine::KeepHidden(Sequence* s, int64_t first_position, std::vector<float> hidden,
                        int64_t rows, int64_t step_rows) {
  // A row is as wide as the model makes it (StepOutput::hidden).
  hidden.resize(hidden.size() / step_rows * rows);
  s->hidden_from = first_position;
  s->hidden = std::move(hidden);
}

int Engine::DropAll() {
  // Launched steps still write the sequences' blocks: they finish (their tokens dropped) first.
  executor_->WaitIdle();
  for (; !launched_.empty(); launched_.pop_front()) executor_->Take();
  steps_completed_ = steps_launched_;
  for (auto& s : retired_) FreeBlocks(s.get());
  retired_.clear();
  int dropped = 0;
  for (auto& s : running_) {
    FreeBlocks(s.get());
    ++dropped;
  }
  for (auto& s : waiting_) {
    FreeBlocks(s.get());
    ++dropped;
  }
  running_.clear();
  waiting_.clear();
  held_ids_.clear();
  UpdateLoad();
  return dropped;
}

void Engine::UpdateLoad() {
  EngineLoad load;
  load.running = static_cast<int32_t>(running_.size());
  load.waiting = static_cast<int32_t>(waiting_.size());
  for (const auto& s : running_) load.tokens += static_cast<int64_t>(s->tokens.size());
  for (const auto& s : waiting_) load.tokens += static_cast<int64_t>(s->tokens.size());
  load.kv_blocks_total = pool_->num_blocks();
  load.kv_blocks_used = cache_.num_referenced_blocks();
  load.kv_blocks_cached = cache_.num_cached_blocks();
  load.steps = step_window_.summary();
  load.prompt_tokens = prompt_tokens_;
  load.cached_prompt_tokens = cached_prompt_tokens_;
  load.computed_tokens = computed_tokens_;
  load.prefix_root = cache_.enabled() ? cache_.root_hash() : 0;  // 0: no prefix caching
  // Walking the cache is not free: the summary is refreshed a few times a second (the
  // coordinator reads it once per heartbeat).
  const absl::Time now = absl::Now();
  if (now - probes_at_ >= kProbeSummaryInterval) {
    cached_probes_ = cache_.ProbeSummary(kMaxProbeSummary);
    probes_at_ = now;
  }
  load.cached_probes = cached_probes_;
  absl::MutexLock lock(&load_mu_);
  load_ = load;
  // Refilled in place: the entries keep their string buffers from step to step.
  size_t n = 0;
  auto add = [&](const Sequence& s) {
    if (s.generated() <= 0) return;
    if (n == progress_.size()) progress_.emplace_back();
    progress_[n].set_request_id(s.id);
    progress_[n].set_generated_tokens(s.generated());
    ++n;
  };
  for (const auto& s : running_) add(*s);
  for (const auto& s : waiting_) add(*s);
  progress_.resize(n);
}

EngineLoad Engine::load() const {
  absl::MutexLock lock(&load_mu_);
  return load_;
}

std::vector<RequestProgress> Engine::progress() const {
  absl::MutexLock lock(&load_mu_);
  return progress_;
}

}  // namespace deepinfer
