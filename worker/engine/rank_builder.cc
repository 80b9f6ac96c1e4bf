// BuildRank: group, backend, data plane, memory plan, model, KV pool.
#include "worker/engine/rank_builder.h"

#include <algorithm>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "worker/backend/fp8_latent_entry.h"
#include "worker/engine/dequant_scratch.h"
#include "worker/model/ep_expert_dispatcher.h"
#if DEEPINFER_WITH_DEVICE_EXCHANGE
#include "worker/model/ep_device_dispatcher.h"
#endif
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

// Registers `c` with the caller; CANCELLED (and `c` aborted) when the group stopped.
absl::Status Register(const RankHooks& hooks, comm::Communicator* c) {
  if (!hooks.on_communicator || hooks.on_communicator(c)) return absl::OkStatus();
  c->Abort(absl::CancelledError("group stopped while forming"));
  return absl::CancelledError("group stopped while forming");
}

}  // namespace

ExpertRange ExpertsOfRank(int64_t num_experts, int world_size, int rank) {
  const int64_t per = num_experts / world_size;
  return {rank * per, per};
}

LoadOptions ExpertsToLoad(const ModelConfig& config, int world_size, int rank, bool partitioned,
                          const std::shared_ptr<const ExpertPlacement>& placement) {
  LoadOptions load;
  if (placement != nullptr) {
    // Per model layer, the experts of this rank's slots (dense layers have none).
    auto placed = std::make_shared<std::vector<std::vector<int64_t>>>(
        EpExpertDispatcher::ExpertsOfRank(*placement, world_size, rank));
    std::vector<int64_t> moe_index;
    for (int64_t l = 0, m = 0; l < config.num_hidden_layers; ++l) {
      moe_index.push_back(config.IsMoeLayer(l) ? m++ : -1);
    }
    load.hosts_expert = [placed, moe_index](int64_t layer, int64_t e) {
      const int64_t m = moe_index[layer];
      if (m < 0) return false;
      const std::vector<int64_t>& mine = (*placed)[m];
      return std::find(mine.begin(), mine.end(), e) != mine.end();
    };
  } else if (partitioned) {
    const ExpertRange range = ExpertsOfRank(config.n_routed_experts, world_size, rank);
    load.hosts_expert = [range](int64_t, int64_t e) {
      return e >= range.first && e < range.first + range.count;
    };
  }
  return load;
}

DispatcherFactory LocalDispatcherFactory() {
  DispatcherFactory f;
  f.partitioned = false;
  f.make = [](comm::Communicator*, ExpertRange, std::shared_ptr<const ExpertPlacement>,
              const ModelConfig& config, const ModelWeights& weights,
              Backend* backend) { return MakeLocalExpertDispatcher(config, weights, backend); };
  return f;
}

absl::StatusOr<EpExchangeKind> ParseEpExchangeKind(const std::string& name) {
  if (name == "auto") return EpExchangeKind::kAuto;
  if (name == "device") return EpExchangeKind::kDevice;
  if (name == "collective") return EpExchangeKind::kCollective;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown expert exchange '", name, "' (auto, device or collective)"));
}

DispatcherFactory EpDispatcherFactory(const EpExchangeOptions& exchange) {
  DispatcherFactory f;
  f.partitioned = true;
  f.make = [exchange](comm::Communicator* comm, ExpertRange range,
                      std::shared_ptr<const ExpertPlacement> placement, const ModelConfig& config,
                      const ModelWeights& weights,
                      Backend* backend) -> absl::StatusOr<std::unique_ptr<ExpertDispatcher>> {
    if (comm->world_size() == 1) return MakeLocalExpertDispatcher(config, weights, backend);
    const bool device_plane = comm->memory_kind() == comm::MemoryKind::kDevice;
    if (exchange.kind == EpExchangeKind::kDevice && !device_plane) {
      return absl::FailedPreconditionError(
          "--ep-exchange=device needs the NCCL data plane (--backend cuda, --communicator nccl "
          "or auto)");
    }
#if DEEPINFER_WITH_DEVICE_EXCHANGE
    if (device_plane && exchange.kind != EpExchangeKind::kCollective) {
      EpDeviceOptions options;
      options.max_tokens = exchange.max_tokens;
      options.top_k = static_cast<int32_t>(config.num_experts_per_tok);
      auto d = EpDeviceDispatcher::Create(comm, backend, config.n_routed_experts,
                                          config.hidden_size, options, placement);
      if (d.ok()) {
        LOG(INFO) << "rank " << comm->rank() << " of " << comm->world_size()
                  << ": expert exchange: " << (*d)->Describe();
        return std::unique_ptr<ExpertDispatcher>(std::move(*d));
      }
      // Limits every rank shares (no window, sizes) fall back together; anything else (the
      // registration itself failed) is an error.
      const bool shared_limit =
          absl::IsUnimplemented(d.status()) || absl::IsInvalidArgument(d.status());
      if (exchange.kind == EpExchangeKind::kDevice || !shared_limit) return d.status();
      LOG(WARNING) << "rank " << comm->rank() << ": --ep-exchange auto: no device expert exchange ("
                   << d.status().message() << "); using NCCL all-to-all";
    }
#else
    if (exchange.kind == EpExchangeKind::kDevice) {
      return absl::FailedPreconditionError("--ep-exchange=device needs a CUDA build");
    }
#endif
    const bool placed = placement != nullptr;
    auto d = EpExpertDispatcher::Create(comm, backend, config.n_routed_experts, config.hidden_size,
                                        std::move(placement));
    if (!d.ok()) return d.status();
    if (placed) {
      LOG(INFO) << "rank " << comm->rank() << " of " << comm->world_size()
                << ": expert parallel with an EPLB placement, " << (*d)->local_experts(0).size()
                << " expert slots per layer";
      return std::unique_ptr<ExpertDispatcher>(std::move(*d));
    }
    const std::vector<int64_t>& local = (*d)->local_experts(0);
    // The weights were loaded for `range`; the dispatcher must serve exactly those experts.
    if (local.empty() || local.front() != range.first ||
        static_cast<int64_t>(local.size()) != range.count) {
      return absl::InternalError(absl::StrCat("rank ", comm->rank(), " loaded experts ",
                                              range.first, "..", range.first + range.count - 1,
                                              " but its dispatcher serves ", local.size(),
                                              " experts from ", local.empty() ? -1 : local[0]));
    }
    LOG(INFO) << "rank " << comm->rank() << " of " << comm->world_size()
              << ": expert parallel, hosts routed experts " << local.front() << ".." << local.back()
              << " of " << config.n_routed_experts;
    return std::unique_ptr<ExpertDispatcher>(std::move(*d));
  };
  return f;
}

absl::StatusOr<WarmUpResult> WarmUpSteps(CausalLm* model, KvBlockPool* pool,
                                         int64_t max_batch_tokens) {
  WarmUpResult result;
  const int64_t bs = pool->block_size();
  auto blocks_for = [bs](int64_t positions) {
    return static_cast<int32_t>((positions + bs - 1) / bs);
  };
  // Scratch sequence A: a prompt of max_batch_tokens, with room for its next token, within the
  // model's positions and the free blocks.
  int64_t max_positions = model->config().max_position_embeddings;
  if (max_positions <= 0) max_positions = std::numeric_limits<int32_t>::max();
  const int64_t prompt = std::min({max_batch_tokens, max_positions - 1,
                                   static_cast<int64_t>(pool->num_free_blocks()) * bs - 1});
  if (prompt < 1) return result;
  absl::StatusOr<std::vector<int32_t>> a = pool->Allocate(blocks_for(prompt + 1));
  if (!a.ok()) return result;
  // Scratch sequence B: the mixed step's prompt chunk, the rest of that step's tokens.
  const int64_t chunk = std::min({max_batch_tokens - 1, max_positions - 1,
                                  static_cast<int64_t>(pool->num_free_blocks()) * bs});
  std::vector<int32_t> b;
  // A pool with per-sequence state (DeepSeek-V4's) binds a slot per sequence, and a rank may
  // have one (--max-running 1): the mixed step's second sequence then has none, and only the
  // prefill step runs.
  const bool second_slot = pool->num_state_slots() == 0 || pool->num_state_slots() >= 2;
  if (chunk >= 1 && second_slot) {
    absl::StatusOr<std::vector<int32_t>> got = pool->Allocate(blocks_for(chunk));
    if (got.ok()) b = *std::move(got);
  }
  auto run = [&]() -> absl::Status {
    SequenceStep first;
    first.tokens.assign(prompt, 0);
    first.block_table = *a;
    first.return_logits = false;
    first.sampling = SamplingParams{};  // greedy
    absl::StatusOr<StepOutput> out = model->Step({first}, pool);
    if (!out.ok()) return out.status();
    ++result.steps;
    result.tokens += prompt;
    if (b.empty()) return absl::OkStatus();
    SequenceStep next = first;
    next.tokens.assign(1, 0);
    next.position_offset = prompt;
    SequenceStep other;
    other.tokens.assign(chunk, 0);
    other.block_table = b;
    other.return_logits = false;
    other.sampling = SamplingParams{};
    other.sampling->temperature = 1.0f;  // the sampled path too
    out = model->Step({next, other}, pool);
    if (!out.ok()) return out.status();
    ++result.steps;
    result.tokens += 1 + chunk;
    return absl::OkStatus();
  };
  absl::Status st = run();
  // The blocks go back whatever happened (their state slots with them); the expert counts the
  // steps made are not serving's.
  absl::Status freed = pool->Free(*a);
  if (freed.ok() && !b.empty()) freed = pool->Free(b);
  model->TakeExpertCounts();
  if (!st.ok()) return st;
  if (!freed.ok()) return freed;
  return result;
}

absl::Status BuildRank(const RankSpec& spec, const RankHooks& hooks,
                       std::unique_ptr<comm::TcpCommunicator::RootListener> root,
                       RankParts* parts) {
  if (!spec.dispatcher.make) return absl::InvalidArgumentError("BuildRank: no dispatcher");
  // Start-up phases, logged as one line at the end (tools/bench/e2e_job.py reads it).
  std::string phases;
  absl::Time phase_start = absl::Now();
  auto phase_done = [&](const char* name) {
    const absl::Time now = absl::Now();
    absl::StrAppendFormat(&phases, "%s%s %.3f s", phases.empty() ? "" : ", ", name,
                          absl::ToDoubleSeconds(now - phase_start));
    phase_start = now;
  };
  if (spec.block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("block size ", spec.block_size));
  }
  // The group: the control plane, and the exchange's transport unless NCCL carries it.
  if (spec.world_size > 1 || spec.always_form_group) {
    comm::TcpCommunicatorSpec group;
    group.rank = spec.rank;
    group.world_size = spec.world_size;
    group.root_address = spec.root_address;
    group.group_incarnation = spec.group_incarnation;
    group.listen_host = spec.listen_host;
    group.timeout = spec.group_timeout;
    auto c = comm::TcpCommunicator::Create(group, spec.rank == 0 ? std::move(root) : nullptr);
    if (!c.ok()) return c.status();
    parts->group = std::move(*c);
    if (absl::Status st = Register(hooks, parts->group.get()); !st.ok()) return st;
  }
  phase_done("group");
  auto backend = MakeBackend(spec.backend);
  if (!backend.ok()) return backend.status();
  parts->backend = std::move(*backend);
  Backend* be = parts->backend.get();
  phase_done("backend");

  // Only an expert-parallel dispatcher exchanges tokens; the others need no data plane.
  comm::Communicator* exchange = parts->group.get();
  if (spec.dispatcher.partitioned) {
    absl::StatusOr<comm::DataPlane> plane =
        comm::ResolveDataPlane(spec.communicator, spec.backend.kind, spec.world_size);
    if (!plane.ok()) return plane.status();
    parts->data_plane = *plane;
  }
  if (parts->data_plane == comm::DataPlane::kNccl) {
    auto nccl = comm::FormNcclCommunicator(parts->group.get(), spec.backend.cuda_device,
                                           be->native_stream(), spec.data_plane_timeout);
    if (!nccl.ok()) return nccl.status();
    parts->data_comm = std::move(*nccl);
    if (absl::Status st = Register(hooks, parts->data_comm.get()); !st.ok()) return st;
    exchange = parts->data_comm.get();
  }
  if (exchange != nullptr && hooks.wrap_exchange) {
    parts->exchange = hooks.wrap_exchange(exchange, be);
    exchange = parts->exchange.get();
  }

  phase_done("data plane");
  // The model's config, its architecture's sizes and the rank's share of the experts.
  ModelConfig config;
  absl::StatusOr<std::unique_ptr<WeightSource>> source =
      spec.open_weights ? spec.open_weights(spec.model, &config)
                        : OpenWeightSource(spec.model, &config);
  if (!source.ok()) return source.status();
  absl::StatusOr<const Architecture*> arch = FindArchitecture(config);
  if (!arch.ok()) return arch.status();
  if (spec.draft_layers > 0) {
    if (config.num_nextn_predict_layers < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(spec.model, " has no MTP layers (num_nextn_predict_layers) to draft with"));
    }
    config.num_draft_layers = std::min<int64_t>(spec.draft_layers, config.num_nextn_predict_layers);
    config.speculative_tokens = spec.draft_layers;
  }
  const ExpertRange range = ExpertsOfRank(config.n_routed_experts, spec.world_size, spec.rank);
  LoadOptions load = ExpertsToLoad(config, spec.world_size, spec.rank, spec.dispatcher.partitioned,
                                   spec.placement);
  load.load_threads = spec.load_threads;
  if (KeepsCheckpointFp8(spec.backend) && (*arch)->keeps_fp8) {
    // The source outlives the load (BuildModel below); the weight bytes count FP8 too.
    load.keep_fp8 = [src = source->get()](const std::string& name) { return src->StoresFp8(name); };
  }
  if (KeepsExpertsMxfp4(spec.backend)) {
    if (!(*arch)->keeps_mxfp4_experts) {
      return absl::InvalidArgumentError(absl::StrCat("--dtype mxfp4: ", (*arch)->name,
                                                     " does not keep its routed experts in MXFP4"));
    }
    if (spec.world_size > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("--dtype mxfp4 runs the routed experts on one rank hosting every expert; "
                       "this group has ",
                       spec.world_size, " ranks"));
    }
    load.mxfp4_experts = true;
  }
  const int64_t weight_bytes = (*arch)->weight_bytes(config, be->weight_dtype(), load);
  LOG(INFO) << "rank " << spec.rank << ": " << be->name() << " backend, "
            << WeightDTypeName(be->weight_dtype()) << " weights"
            << (load.mxfp4_experts ? ", routed experts MXFP4" : "") << " ("
            << absl::StrFormat("%.1f MiB", weight_bytes / double{1 << 20}) << ")";

  // On a GPU, memory is planned up front: the weights must fit before anything is loaded.
  MemoryPlanOptions plan_options;
  plan_options.utilization = spec.gpu_memory_utilization;
  plan_options.block_size = spec.block_size;
  plan_options.max_batch_tokens = spec.max_batch_tokens;
  const int64_t floats_per_token = (*arch)->activation_floats_per_token(config);
  // FP8 matrices and MXFP4 experts widened to bf16 at prefill sizes (dequant_scratch.h).
  int64_t reserve = ActivationReserveBytes(floats_per_token, spec.max_batch_tokens) +
                    DequantScratchOf(config, **arch, KeepsCheckpointFp8(spec.backend),
                                     KeepsExpertsMxfp4(spec.backend))
                        .total();
  // Graphs recorded at start-up: the buckets a rank can decode (it runs at most max_running
  // sequences), exactly those the reserve counts.
  const bool capture = spec.capture_decode_graphs && spec.decode_graphs.enabled &&
                       (!spec.dispatcher.partitioned || spec.world_size == 1);
  DecodeGraphOptions graphs = spec.decode_graphs;
  if (capture) {
    graphs.max_batch = std::max<int64_t>(1, std::min<int64_t>(graphs.max_batch, spec.max_running));
  }
  if (spec.backend.kind == "cuda" && graphs.enabled) {
    reserve += DecodeGraphReserveBytes(floats_per_token, DecodeGraphBuckets(graphs.max_batch));
  }
  const absl::StatusOr<DeviceMemoryInfo> before_load = be->MemoryInfo();
  const bool planned = spec.kv_cache_blocks <= 0 && spec.kv_cache_tokens <= 0 && before_load.ok();
  if (before_load.ok()) {
    if (absl::Status st = CheckWeightsFit(*before_load, weight_bytes, reserve, plan_options);
        !st.ok()) {
      return st;
    }
  }

  ExpertDispatcherFactory make =
      [&spec, exchange, range, parts](
          const ModelConfig& c, const ModelWeights& w,
          Backend* b) -> absl::StatusOr<std::unique_ptr<ExpertDispatcher>> {
    auto d = spec.dispatcher.make(exchange, range, spec.placement, c, w, b);
    if (d.ok()) parts->expert_exchange = (*d)->exchange_name();
    return d;
  };
  phase_done("memory check");
  const absl::Time load_start = absl::Now();
  auto model = BuildModel(config, source->get(), be, load, make);
  if (!model.ok()) return model.status();
  be->Synchronize();  // the uploads are done
  const double load_s = absl::ToDoubleSeconds(absl::Now() - load_start);
  LOG(INFO) << "rank " << spec.rank << ": start-up: weights loaded in "
            << absl::StrFormat("%.3f s, %.3f GB, %.2f GB/s", load_s, weight_bytes / 1e9,
                               load_s > 0 ? weight_bytes / 1e9 / load_s : 0.0)
            << " (" << (*source)->description() << ")";
  phase_done("weights");
  parts->model = std::move(*model);
  parts->model->SetDecodeGraphOptions(graphs);
  parts->model->SetFusedOps(spec.fused_ops);
  parts->model->SetPrefillAttention(spec.prefill_attention);
  if (absl::Status st = parts->model->SetMicroBatches(spec.micro_batches); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("--micro-batches ", spec.micro_batches, ": ", st.message()));
  }

  absl::StatusOr<WeightDType> cache_dtype =
      ResolveKvCacheDType(spec.kv_cache_dtype, be->weight_dtype());
  if (!cache_dtype.ok()) return cache_dtype.status();
  absl::StatusOr<KvCacheSpec> typed_spec = parts->model->CacheSpec().WithDType(*cache_dtype);
  if (!typed_spec.ok()) return typed_spec.status();
  const KvCacheSpec cache_spec = *std::move(typed_spec);
  // The CUDA attention's bf16 copy of FP8 cache entries, in the decode graphs' pool and in eager
  // scratch (fp8_latent_entry.h).
  if (spec.backend.kind == "cuda" && *cache_dtype == WeightDType::kFp8E4M3) {
    reserve += 2 * kFp8CacheCopyMaxBytes;
  }
  const int32_t bs = spec.block_size;
  // Per-sequence state (V4's window rings, compressor rows): one slot per running sequence,
  // taken from the KV cache's share of the memory.
  const int64_t state_bytes = cache_spec.StateBytesPerSequence() * spec.max_running;
  if (state_bytes > 0) {
    LOG(INFO) << "rank " << spec.rank << ": per-sequence cache state "
              << absl::StrFormat("%.1f MiB", state_bytes / double{1 << 20}) << " ("
              << spec.max_running << " sequences)";
  }
  int64_t blocks = 0;
  if (spec.kv_cache_blocks > 0) {
    blocks = spec.kv_cache_blocks;
  } else if (spec.kv_cache_tokens > 0) {
    blocks = (spec.kv_cache_tokens + bs - 1) / bs;
    LOG(INFO) << "rank " << spec.rank << ": KV cache " << blocks << " blocks x " << bs
              << " tokens (--kv-cache-tokens)";
  } else if (planned) {
    absl::StatusOr<DeviceMemoryInfo> after_load = be->MemoryInfo();
    if (!after_load.ok()) return after_load.status();
    absl::StatusOr<KvCachePlan> plan = PlanKvCache(*after_load, weight_bytes, reserve + state_bytes,
                                                   cache_spec.BytesPerToken(), plan_options);
    if (!plan.ok()) return plan.status();
    blocks = plan->num_blocks;
    LOG(INFO) << "rank " << spec.rank
              << ": memory plan: " << plan->ToString(spec.gpu_memory_utilization);
  } else {
    blocks = (kDefaultCpuKvCacheTokens + bs - 1) / bs;
    LOG(INFO) << "rank " << spec.rank << ": KV cache " << blocks << " blocks x " << bs
              << " tokens (CPU default)";
  }
  if (blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache of ", blocks, " blocks is too large"));
  }
  KvBlockPoolOptions pool_options{cache_spec, static_cast<int32_t>(blocks), bs};
  pool_options.max_sequences = spec.max_running;
  auto pool = KvBlockPool::Create(be, pool_options);
  if (!pool.ok()) return pool.status();
  parts->pool = std::move(*pool);
  phase_done("memory plan and KV cache");
  if (capture) {
    const absl::Time capture_start = absl::Now();
    absl::StatusOr<int> recorded = parts->model->CaptureDecodeGraphs(parts->pool.get());
    if (!recorded.ok()) return recorded.status();
    if (*recorded > 0) {
      LOG(INFO) << "rank " << spec.rank << ": start-up: decode graphs recorded in "
                << absl::StrFormat("%.3f s", absl::ToDoubleSeconds(absl::Now() - capture_start))
                << ", " << *recorded << " graphs, buckets "
                << absl::StrJoin(DecodeGraphBuckets(graphs.max_batch), " ");
    }
    phase_done("graph capture");
  }
  if (spec.warm_up && (!spec.dispatcher.partitioned || spec.world_size == 1)) {
    const absl::Time warm_start = absl::Now();
    absl::StatusOr<WarmUpResult> warm =
        WarmUpSteps(parts->model.get(), parts->pool.get(), spec.max_batch_tokens);
    if (!warm.ok()) return warm.status();
    be->Synchronize();
    LOG(INFO) << absl::StrFormat("rank %d: start-up: warm-up ran in %.3f s, %d steps, %d tokens",
                                 spec.rank, absl::ToDoubleSeconds(absl::Now() - warm_start),
                                 warm->steps, warm->tokens);
    phase_done("warm-up");
  }
  LOG(INFO) << "rank " << spec.rank << ": start-up: " << phases;
  return absl::OkStatus();
}

}  // namespace deepinfer
