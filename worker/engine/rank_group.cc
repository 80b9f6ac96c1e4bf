// RankGroup: forming, the lock-step loop, failure handling.
#include "worker/engine/rank_group.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <future>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/eplb/expert_parallel_group.h"
#include "glog/logging.h"
#include "worker/kv_cache/prefix_cache.h"
#include "worker/model/ep_expert_dispatcher.h"
#include "worker/model/model_loader.h"

namespace deepinfer {

// One rank's state. Members are declared so that they are destroyed in dependency order
// (engine, then the rank's parts: RankParts).
struct RankGroup::Rank {
  int global = 0;
  RequestQueue queue;
  RankParts parts;  // parts.group carries the lock-step agreement
  std::unique_ptr<Engine> engine;
  bool engine_published = false;  // guarded by RankGroup::mu_
  // EPLB. The placement epoch this rank runs (written by the rank thread under mu_).
  uint64_t epoch = 0;
  // A placement whose missing expert weights a helper thread is reading from the checkpoint
  // (rank thread only; at most one at a time).
  std::shared_ptr<const ExpertPlacement> loading;
  uint64_t loading_epoch = 0;
  std::vector<std::vector<int64_t>> loading_needed;
  std::future<absl::StatusOr<ModelWeights::HostExperts>> loading_host;
  // A placement whose weights are loaded but not switched to yet (rank thread only).
  std::shared_ptr<const ExpertPlacement> staged;
  uint64_t staged_epoch = 0;
  std::vector<std::vector<int64_t>> staged_needed;
  std::vector<std::map<int64_t, MlpWeights>> staged_loaded;
  // Expert counts: steps since they were last read back (rank thread), and what was read
  // back since the last TakeExpertLoads (guarded by RankGroup::mu_).
  int64_t steps_uncollected = 0;
  // Engine steps whose StepStats were written (rank thread).
  int64_t stats_written_steps = 0;
  absl::Time last_collect = absl::InfinitePast();
  ExpertLoadReport report;
};

absl::StatusOr<std::unique_ptr<RankGroup>> RankGroup::Create(
    const RankGroupOptions& options, const GroupLayout& layout,
    std::unique_ptr<comm::TcpCommunicator::RootListener> root, ResultSink sink) {
  if (options.model == nullptr) return absl::InvalidArgumentError("RankGroup: no model");
  if (!options.dispatcher.make) return absl::InvalidArgumentError("RankGroup: no dispatcher");
  if (options.block_size <= 0 || options.kv_cache_tokens < 0 ||
      (options.kv_cache_tokens > 0 && options.kv_cache_tokens < 2 * options.block_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV cache of ", options.kv_cache_tokens, " tokens is too small"));
  }
  if (absl::StatusOr<WeightDType> d =
          ResolveKvCacheDType(options.kv_cache_dtype, WeightDType::kFloat32);
      !d.ok()) {
    return d.status();
  }
  if (!(options.gpu_memory_utilization > 0 && options.gpu_memory_utilization <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU memory utilization ", options.gpu_memory_utilization, " is not in (0, 1]"));
  }
  const GroupLayout& l = layout;
  if (l.world_size < 1 || l.num_ranks < 1 || l.first_rank < 0 ||
      l.first_rank + l.num_ranks > l.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("ranks ", l.first_rank, "..",
                                                   l.first_rank + l.num_ranks - 1,
                                                   " are not in a world of size ", l.world_size));
  }
  const int64_t experts = options.model->config.n_routed_experts;
  if (absl::Status st = CheckRoutedExpertsSplit(experts, l.world_size); !st.ok()) return st;
  GroupLayout checked = layout;
  if (checked.placement != nullptr &&
      !(options.dispatcher.partitioned && l.world_size > 1 && experts > 0)) {
    LOG(INFO) << "expert placement ignored: experts are not split over ranks in this group";
    checked.placement = nullptr;
    checked.placement_epoch = 0;
  }
  if (l.world_size > 1) {
    if (l.group_incarnation == 0) {
      return absl::InvalidArgumentError("group_incarnation must be non-zero");
    }
    if (l.root_address.empty() && !(l.first_rank == 0 && root != nullptr)) {
      return absl::InvalidArgumentError("no root_address for a group of several ranks");
    }
  }
  // Every local rank reads the address; only rank 0 takes the listener.
  GroupLayout resolved = checked;
  if (resolved.root_address.empty() && root != nullptr) resolved.root_address = root->address;
  std::unique_ptr<RankGroup> group(new RankGroup(options, resolved, std::move(sink)));
  if (resolved.placement != nullptr) {
    if (absl::Status st = group->CheckPlacement(*resolved.placement); !st.ok()) return st;
  }
  if (l.first_rank == 0) group->root_ = std::move(root);
  return group;
}

RankGroup::RankGroup(const RankGroupOptions& options, const GroupLayout& layout, ResultSink sink)
    : options_(options), layout_(layout), sink_(std::move(sink)) {
  for (int i = 0; i < layout_.num_ranks; ++i) {
    ranks_.push_back(std::make_unique<Rank>());
    ranks_.back()->global = layout_.first_rank + i;
    ranks_.back()->epoch = layout_.placement != nullptr ? layout_.placement_epoch : 0;
  }
}

bool RankGroup::placements_apply() const {
  return options_.dispatcher.partitioned && layout_.world_size > 1 &&
         options_.model->config.n_routed_experts > 0;
}

absl::Status RankGroup::CheckPlacement(const ExpertPlacement& placement) const {
  const ModelConfig& c = options_.model->config;
  int64_t moe_layers = 0;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.IsMoeLayer(l) ? 1 : 0;
  if (placement.num_logical() != c.n_routed_experts || placement.num_layers() != moe_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert placement has ", placement.num_layers(), " layers of ", placement.num_logical(),
        " logical experts; the model has ", moe_layers, " MoE layers of ", c.n_routed_experts));
  }
  if (absl::Status st = placement.CheckGpuCount(layout_.world_size); !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("expert placement does not fit a group of ",
                                                   layout_.world_size, " ranks: ", st.message()));
  }
  return absl::OkStatus();
}

absl::Status RankGroup::SetPlacement(std::shared_ptr<const ExpertPlacement> placement,
                                     uint64_t epoch) {
  if (!placements_apply()) {
    return absl::FailedPreconditionError(
        "expert placements need a group of several ranks with experts split over them");
  }
  if (placement == nullptr) return absl::InvalidArgumentError("no expert placement");
  if (absl::Status st = CheckPlacement(*placement); !st.ok()) return st;
  absl::MutexLock lock(&mu_);
  uint64_t newest = pending_epoch_;
  for (const auto& r : ranks_) newest = std::max(newest, r->epoch);
  if (epoch <= newest) return absl::OkStatus();  // a retry, or older than what runs
  pending_placement_ = std::move(placement);
  pending_epoch_ = epoch;
  LOG(INFO) << "group generation " << layout_.generation << ": expert placement epoch " << epoch
            << " pending";
  return absl::OkStatus();
}

uint64_t RankGroup::placement_epoch() const {
  absl::MutexLock lock(&mu_);
  uint64_t epoch = UINT64_MAX;
  for (const auto& r : ranks_) epoch = std::min(epoch, r->epoch);
  return ranks_.empty() ? 0 : epoch;
}

std::vector<ExpertLoadReport> RankGroup::TakeExpertLoads() {
  std::vector<ExpertLoadReport> out;
  absl::MutexLock lock(&mu_);
  for (auto& r : ranks_) {
    if (r->report.num_steps() == 0) continue;
    out.push_back(std::move(r->report));
    r->report = ExpertLoadReport();
  }
  return out;
}

void RankGroup::CollectExpertCounts(int local) {
  Rank& r = *ranks_[local];
  r.last_collect = absl::Now();
  if (r.steps_uncollected == 0 || r.parts.model == nullptr || r.parts.model->num_moe_layers() == 0)
    return;
  std::vector<int64_t> counts = r.parts.model->TakeExpertCounts();
  const int64_t steps = r.steps_uncollected;
  r.steps_uncollected = 0;
  absl::MutexLock lock(&mu_);
  ExpertLoadReport& rep = r.report;
  if (rep.num_steps() == 0) {
    rep.set_rank(r.global);
    rep.set_group_generation(layout_.generation);
    rep.set_num_layers(static_cast<int32_t>(r.parts.model->num_moe_layers()));
    rep.set_num_experts(static_cast<int32_t>(r.parts.model->config().n_routed_experts));
    rep.mutable_counts()->Resize(static_cast<int>(counts.size()), 0);
  }
  rep.set_num_steps(rep.num_steps() + steps);
  for (size_t i = 0; i < counts.size(); ++i) {
    rep.set_counts(static_cast<int>(i), rep.counts(static_cast<int>(i)) + counts[i]);
  }
}

absl::StatusOr<uint64_t> RankGroup::StagePlacement(int local) {
  Rank& r = *ranks_[local];
  std::shared_ptr<const ExpertPlacement> placement;
  uint64_t epoch = 0;
  {
    absl::MutexLock lock(&mu_);
    placement = pending_placement_;
    epoch = pending_epoch_;
  }
  // Start reading a newer placement's missing experts on a helper thread (one at a time: a
  // newer placement waits for the read in flight), so that the rank keeps stepping meanwhile.
  if (placement != nullptr && epoch > r.epoch && epoch > r.staged_epoch &&
      epoch > r.loading_epoch && !r.loading_host.valid()) {
    std::vector<std::vector<int64_t>> needed =
        EpExpertDispatcher::ExpertsOfRank(*placement, layout_.world_size, r.global);
    std::vector<std::vector<int64_t>> missing = r.parts.model->MissingExperts(needed);
    const std::string spec = options_.model->spec;
    r.loading_host = std::async(std::launch::async, [spec, missing]() {
      ModelConfig config;
      auto source = OpenWeightSource(spec, &config);
      if (!source.ok()) return absl::StatusOr<ModelWeights::HostExperts>(source.status());
      return ModelWeights::ReadRoutedExperts(config, source->get(), missing);
    });
    r.loading = std::move(placement);
    r.loading_epoch = epoch;
    r.loading_needed = std::move(needed);
  }
  // A finished read: upload (on this thread, which owns the backend, once no step runs) and mark
  // it ready.
  if (r.loading_host.valid() &&
      r.loading_host.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
    absl::StatusOr<ModelWeights::HostExperts> host = r.loading_host.get();
    if (!host.ok()) return host.status();
    if (r.loading_epoch > r.epoch && r.loading_epoch > r.staged_epoch) {
      if (absl::Status st = FlushEngine(local); !st.ok()) return st;
      int64_t count = 0;
      for (const auto& layer : *host) count += static_cast<int64_t>(layer.size());
      r.staged_loaded = ModelWeights::UploadRoutedExperts(*host, r.parts.backend.get());
      r.staged = std::move(r.loading);
      r.staged_epoch = r.loading_epoch;
      r.staged_needed = std::move(r.loading_needed);
      LOG(INFO) << "rank " << r.global << ": expert placement epoch " << r.staged_epoch
                << " staged (" << count << " expert weights loaded)";
    }
    r.loading = nullptr;
    r.loading_needed.clear();
  }
  return r.staged != nullptr ? r.staged_epoch : r.epoch;
}

absl::Status RankGroup::SwitchPlacement(int local) {
  Rank& r = *ranks_[local];
  if (r.staged == nullptr) {
    return absl::InternalError("the group agreed on a placement this rank has not staged");
  }
  // Experts the staged weights lack because the rank switched to another placement after they
  // were read (rare: placements in quick succession) are read now.
  std::vector<std::vector<int64_t>> missing = r.parts.model->MissingExperts(r.staged_needed);
  bool more = false;
  for (size_t m = 0; m < missing.size(); ++m) {
    auto& list = missing[m];
    list.erase(std::remove_if(list.begin(), list.end(),
                              [&](int64_t e) { return r.staged_loaded[m].count(e) > 0; }),
               list.end());
    more = more || !list.empty();
  }
  if (more) {
    ModelConfig config;
    auto source = OpenWeightSource(options_.model->spec, &config);
    if (!source.ok()) return source.status();
    auto extra =
        ModelWeights::LoadRoutedExperts(config, source->get(), r.parts.backend.get(), missing);
    if (!extra.ok()) return extra.status();
    for (size_t m = 0; m < extra->size(); ++m) {
      for (auto& [e, w] : (*extra)[m]) r.staged_loaded[m][e] = std::move(w);
    }
  }
  absl::Status st =
      r.parts.model->SwitchPlacement(r.staged, r.staged_needed, std::move(r.staged_loaded));
  if (!st.ok()) return st;
  r.staged = nullptr;
  r.staged_needed.clear();
  r.staged_loaded.clear();
  absl::MutexLock lock(&mu_);
  r.epoch = r.staged_epoch;
  LOG(INFO) << "rank " << r.global << ": switched to expert placement epoch " << r.epoch;
  return absl::OkStatus();
}

RankGroup::~RankGroup() { Stop(); }

void RankGroup::Start() {
  {
    absl::MutexLock lock(&mu_);
    if (started_ || stopping_) return;
    started_ = true;
  }
  if (options_.backend == "cpu") host_memory_check_ = CheckHostMemory();
  for (int i = 0; i < layout_.num_ranks; ++i) threads_.emplace_back([this, i] { RunRank(i); });
}

int64_t RankGroup::FixedKvCacheBlocks() const {
  const int64_t tokens =
      options_.kv_cache_tokens > 0 ? options_.kv_cache_tokens : kDefaultCpuKvCacheTokens;
  return (tokens + options_.block_size - 1) / options_.block_size;
}

absl::Status RankGroup::CheckHostMemory() const {
  // As MakeBackend will resolve them; a bad name fails there, before this verdict is read.
  BackendOptions backend;
  backend.kind = options_.backend;
  backend.dtype = options_.dtype;
  absl::StatusOr<WeightDType> weights = ResolveWeightDType(backend);
  if (!weights.ok()) return weights.status();
  absl::StatusOr<WeightDType> cache = ResolveKvCacheDType(options_.kv_cache_dtype, *weights);
  if (!cache.ok()) return cache.status();
  const ModelConfig& config = options_.model->config;
  absl::StatusOr<const Architecture*> arch = FindArchitecture(config);
  if (!arch.ok()) return arch.status();
  int64_t weight_bytes = 0;
  for (int i = 0; i < layout_.num_ranks; ++i) {
    weight_bytes +=
        (*arch)->weight_bytes(config, *weights,
                              ExpertsToLoad(config, layout_.world_size, layout_.first_rank + i,
                                            options_.dispatcher.partitioned, layout_.placement));
  }
  const KvCacheSpec cache_spec = (*arch)->cache_spec(config, *cache);
  HostMemoryPlan plan =
      PlanHostMemory(layout_.num_ranks, *weights, weight_bytes, *cache, cache_spec.BytesPerToken(),
                     FixedKvCacheBlocks() * options_.block_size);
  // The per-sequence cache state (DeepSeek-V4's window rings and compressor rows) counts with the
  // KV cache: one slot per running sequence on every rank.
  plan.kv_cache_bytes +=
      int64_t{layout_.num_ranks} * cache_spec.StateBytesPerSequence() * options_.max_running;
  const ProcMeminfo proc_meminfo;
  const HostMemory& memory = options_.host_memory != nullptr ? *options_.host_memory : proc_meminfo;
  absl::StatusOr<int64_t> available = memory.AvailableBytes();
  if (!available.ok()) {
    // Nothing to plan against (not Linux?): load as before rather than refuse.
    LOG(WARNING) << "group generation " << layout_.generation
                 << ": host memory not planned: " << available.status();
    return absl::OkStatus();
  }
  plan.available_bytes = *available;
  LOG(INFO) << "group generation " << layout_.generation
            << ": host memory plan: " << plan.ToString();
  return CheckHostMemoryFits(plan);
}

void RankGroup::Stop() {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      stopping_ = true;
      const absl::Status reason = absl::CancelledError(
          absl::StrCat("group generation ", layout_.generation, " was shut down"));
      for (comm::Communicator* c : comms_) c->Abort(reason);
    }
  }
  for (auto& r : ranks_) r->queue.Wake();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

bool RankGroup::stopping() const {
  absl::MutexLock lock(&mu_);
  return stopping_ || status_ == GROUP_FAILED;
}

void RankGroup::Fail(int global_rank, const absl::Status& status) {
  absl::MutexLock lock(&mu_);
  if (stopping_ || status_ == GROUP_FAILED) return;
  status_ = GROUP_FAILED;
  error_ = absl::StrCat("rank ", global_rank, ": ", status.ToString());
  LOG(WARNING) << "group generation " << layout_.generation << " failed: " << error_;
  for (comm::Communicator* c : comms_) c->Abort(status);
}

bool RankGroup::FormRank(int local) {
  Rank& r = *ranks_[local];
  const absl::Time began = absl::Now();
  RankSpec spec;
  spec.rank = r.global;
  spec.world_size = layout_.world_size;
  spec.always_form_group = true;  // the lock-step loop agrees over it even alone
  spec.root_address = layout_.root_address;
  spec.group_incarnation = layout_.group_incarnation;
  spec.listen_host = options_.listen_host;
  spec.group_timeout = options_.collective_timeout;
  spec.data_plane_timeout = options_.collective_timeout;
  spec.backend.kind = options_.backend;
  spec.backend.cpu_threads = options_.threads_per_rank;
  spec.backend.cuda_device = r.global - layout_.first_rank;
  spec.backend.dtype = options_.dtype;
  spec.backend.gemm_autotune = options_.gemm_autotune;
  spec.backend.batch_invariant = options_.batch_invariant;
  spec.dispatcher = options_.dispatcher;
  spec.communicator = options_.communicator;
  spec.placement = layout_.placement;
  spec.model = options_.model->spec;
  spec.decode_graphs = options_.decode_graphs;
  spec.capture_decode_graphs = true;
  spec.warm_up = true;
  spec.load_threads = options_.load_threads;
  spec.kv_cache_dtype = options_.kv_cache_dtype;
  spec.block_size = options_.block_size;
  spec.kv_cache_tokens = options_.kv_cache_tokens;
  spec.gpu_memory_utilization = options_.gpu_memory_utilization;
  spec.max_batch_tokens = options_.max_batch_tokens;
  spec.prefill_attention = options_.prefill_attention;
  spec.micro_batches = options_.micro_batches;
  spec.max_running = options_.max_running;
  spec.draft_layers = options_.speculative_tokens;
  // On the CPU, the plan of every local rank was made once, in Start().
  if (!host_memory_check_.ok()) {
    Fail(r.global, host_memory_check_);
    return false;
  }
  RankHooks hooks;
  hooks.on_communicator = [this](comm::Communicator* c) {
    absl::MutexLock lock(&mu_);
    comms_.push_back(c);
    return !(stopping_ || status_ == GROUP_FAILED);
  };
  absl::Status built = BuildRank(spec, hooks, r.global == 0 ? std::move(root_) : nullptr, &r.parts);
  if (!built.ok()) {
    if (built.code() != absl::StatusCode::kCancelled || !stopping()) Fail(r.global, built);
    return false;
  }
  if (r.global == layout_.first_rank) {
    LOG(INFO) << "group generation " << layout_.generation << ": expert exchange over "
              << comm::DataPlaneName(r.parts.data_plane);
  }
  EngineOptions eo;
  eo.max_batch_tokens = options_.max_batch_tokens;
  eo.max_running = options_.max_running;
  eo.eos_token_ids = options_.model->eos_token_ids;
  eo.group_generation = layout_.generation;
  eo.rank = r.global;
  eo.step_when_idle = options_.dispatcher.partitioned && layout_.world_size > 1;
  eo.prefix_cache.enabled = options_.prefix_caching;
  eo.prefix_cache.store = options_.kv_block_store.get();
  eo.speculative_tokens = options_.speculative_tokens;
  eo.draft_min_confidence = options_.draft_min_confidence;
  // The TCP group carries the agreement of every loop round; a step that exchanges over it too
  // cannot run beside that round on another thread.
  const bool steps_use_group = eo.step_when_idle && r.parts.data_plane == comm::DataPlane::kTcp;
  eo.async_scheduling = options_.async_scheduling && !steps_use_group;
  if (options_.async_scheduling && steps_use_group && r.global == layout_.first_rank) {
    LOG(INFO) << "group generation " << layout_.generation
              << ": steps run synchronously (the expert exchange shares the TCP group with the "
                 "step agreement)";
  }
  eo.prefix_cache.key = PrefixCacheKey(options_.model->fingerprint, r.parts.backend->weight_dtype(),
                                       r.parts.pool->spec(), r.parts.pool->block_size());
  auto engine = Engine::Create(r.parts.model.get(), r.parts.pool.get(), &r.queue,
                               options_.model->tokenizer.get(), eo);
  if (!engine.ok()) {
    Fail(r.global, engine.status());
    return false;
  }
  LOG(INFO) << "rank " << r.global << ": async scheduling "
            << ((*engine)->async_scheduling() ? "on" : "off");
  {
    absl::MutexLock lock(&mu_);
    r.engine = std::move(*engine);
    r.engine_published = true;
  }
  // Nobody serves before every rank has its weights.
  if (absl::Status s = r.parts.group->Barrier(); !s.ok()) {
    Fail(r.global, s);
    return false;
  }
  LOG(INFO) << "rank " << r.global << ": start-up: formed in "
            << absl::StrFormat("%.3f s, at unix %.3f", absl::ToDoubleSeconds(absl::Now() - began),
                               absl::ToUnixMicros(absl::Now()) / 1e6);
  return true;
}

void RankGroup::RunRank(int local) {
  Rank& r = *ranks_[local];
  if (FormRank(local)) {
    {
      absl::MutexLock lock(&mu_);
      if (++ranks_formed_ == layout_.num_ranks && status_ == GROUP_FORMING) {
        status_ = GROUP_SERVING;
        LOG(INFO) << "group generation " << layout_.generation << " serving (ranks "
                  << layout_.first_rank << ".." << layout_.first_rank + layout_.num_ranks - 1
                  << " of " << layout_.world_size << ")";
      }
    }
    const bool placements = placements_apply();
    while (!stopping()) {
      int64_t ready = static_cast<int64_t>(r.epoch);
      if (placements) {
        absl::StatusOr<uint64_t> staged = StagePlacement(local);
        if (!staged.ok()) {
          Fail(r.global, staged.status());
          break;
        }
        ready = static_cast<int64_t>(*staged);
      }
      // One round agrees on both: does anyone have work, and which placement epoch has every
      // rank ready (max of ready and of -ready: the newest and the oldest). Groups without
      // placements agree on the first only.
      int64_t agree[3] = {r.engine->HasWork() ? 1 : 0, ready, -ready};
      if (absl::Status s =
              r.parts.group->AllReduce(agree, agree, placements ? 3 : 1, comm::ReduceOp::kMax);
          !s.ok()) {
        Fail(r.global, s);
        break;
      }
      const int64_t any = agree[0];
      if (placements && agree[1] == -agree[2] && agree[1] > static_cast<int64_t>(r.epoch)) {
        absl::Status s = FlushEngine(local);
        if (s.ok()) s = SwitchPlacement(local);
        if (!s.ok()) {
          Fail(r.global, s);
          break;
        }
      }
      if (any == 0) {
        // Only empty steps can be in flight; they end before the rank sleeps.
        if (absl::Status s = FlushEngine(local); !s.ok()) {
          Fail(r.global, s);
          break;
        }
        if (r.steps_uncollected > 0) CollectExpertCounts(local);
        WriteStepStats(local);
        // Alone, only our own queue can bring work, and a push wakes us; with peers, their
        // work is only learnt at the next agreement round.
        r.queue.WaitForWork(layout_.world_size == 1 ? absl::Milliseconds(100) : options_.idle_wait);
        continue;
      }
      absl::StatusOr<std::vector<RequestResult>> finished = r.engine->Step();
      if (!finished.ok()) {
        Fail(r.global, finished.status());
        break;
      }
      ++r.steps_uncollected;
      if (!finished->empty()) sink_(std::move(*finished));
      if (absl::Now() - r.last_collect >= options_.expert_load_interval) {
        if (absl::Status s = FlushEngine(local); !s.ok()) {
          Fail(r.global, s);
          break;
        }
        CollectExpertCounts(local);
      }
    }
  }
  // Whatever this rank still holds is dropped: the coordinator re-runs it.
  if (r.engine != nullptr) {
    WriteStepStats(local);
    const int dropped = r.engine->DropAll();
    if (dropped > 0) LOG(INFO) << "rank " << r.global << ": dropped " << dropped << " request(s)";
  }
  r.queue.Drain();
}

absl::Status RankGroup::FlushEngine(int local) {
  Rank& r = *ranks_[local];
  absl::StatusOr<std::vector<RequestResult>> finished = r.engine->Flush();
  if (!finished.ok()) return finished.status();
  if (!finished->empty()) sink_(std::move(*finished));
  return absl::OkStatus();
}

void RankGroup::WriteStepStats(int local) {
  Rank& r = *ranks_[local];
  if (options_.step_stats_dir.empty() || r.engine == nullptr) return;
  const StepStats& stats = r.engine->stats();
  if (stats.steps() == r.stats_written_steps) return;
  r.stats_written_steps = stats.steps();
  // Written beside, then renamed: a reader never sees half a file.
  const std::string path = absl::StrCat(options_.step_stats_dir, "/rank-", r.global, ".json");
  const std::string temporary = path + ".tmp";
  {
    std::ofstream out(temporary, std::ios::trunc);
    out << stats.ToJson() << "\n";
    if (!out) {
      LOG(WARNING) << "rank " << r.global << ": cannot write step stats to " << temporary;
      return;
    }
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    LOG(WARNING) << "rank " << r.global << ": cannot rename " << temporary << " to " << path;
  }
}

absl::Status RankGroup::Submit(std::vector<WorkItem> items) {
  std::map<int, std::vector<WorkItem>> by_rank;
  for (WorkItem& item : items) {
    const int local = item.rank() - layout_.first_rank;
    if (local < 0 || local >= layout_.num_ranks) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request ", item.request_id(), ": rank ", item.rank(), " is not on this worker (ranks ",
          layout_.first_rank, "..", layout_.first_rank + layout_.num_ranks - 1, ")"));
    }
    by_rank[local].push_back(std::move(item));
  }
  for (auto& [local, list] : by_rank) ranks_[local]->queue.Push(std::move(list));
  return absl::OkStatus();
}

void RankGroup::Cancel(const std::vector<std::string>& request_ids) {
  for (auto& r : ranks_) r->queue.Cancel(request_ids);
}

GroupStatus RankGroup::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

std::string RankGroup::error() const {
  absl::MutexLock lock(&mu_);
  return error_;
}

GroupStatus RankGroup::AwaitFormed() const {
  absl::MutexLock lock(&mu_);
  auto formed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return status_ != GROUP_FORMING; };
  mu_.Await(absl::Condition(&formed));
  return status_;
}

void RankGroup::AwaitFailed() const {
  absl::MutexLock lock(&mu_);
  auto failed = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return status_ == GROUP_FAILED; };
  mu_.Await(absl::Condition(&failed));
}

std::vector<RankLoad> RankGroup::Loads() const {
  std::vector<RankLoad> out;
  // Before a rank's engine exists its cache size is the explicit one, or not known yet (0).
  const int64_t planned_blocks =
      (options_.kv_cache_tokens + options_.block_size - 1) / options_.block_size;
  absl::MutexLock lock(&mu_);
  for (const auto& r : ranks_) {
    RankLoad load;
    load.set_rank(r->global);
    EngineLoad e;
    e.kv_blocks_total = planned_blocks;
    if (r->engine_published) e = r->engine->load();
    load.set_running_requests(e.running);
    load.set_waiting_requests(e.waiting + r->queue.num_items());
    load.set_queued_tokens(e.tokens + r->queue.num_tokens());
    load.set_kv_blocks_used(e.kv_blocks_used);
    load.set_kv_blocks_total(e.kv_blocks_total);
    // parts are written while the rank forms; published with the engine.
    if (r->engine_published) load.set_expert_exchange(r->parts.expert_exchange);
    load.set_window_steps(e.steps.steps);
    load.set_window_step_tokens_mean(e.steps.tokens_mean);
    load.set_window_step_tokens_max(e.steps.tokens_max);
    load.set_decode_batch(e.steps.last_decode_rows);
    load.set_prefix_cache_root(e.prefix_root);
    load.mutable_cached_probe_hashes()->Add(e.cached_probes.begin(), e.cached_probes.end());
    load.set_prompt_tokens(e.prompt_tokens);
    load.set_cached_prompt_tokens(e.cached_prompt_tokens);
    load.set_computed_tokens(e.computed_tokens);
    out.push_back(std::move(load));
  }
  return out;
}

std::vector<RequestProgress> RankGroup::Progress() const {
  std::vector<RequestProgress> out;
  absl::MutexLock lock(&mu_);
  for (const auto& r : ranks_) {
    if (!r->engine_published) continue;
    for (RequestProgress& p : r->engine->progress()) out.push_back(std::move(p));
  }
  return out;
}

}  // namespace deepinfer
