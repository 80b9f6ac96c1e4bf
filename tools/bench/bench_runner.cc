// RunBenchmark implementation.
#include "tools/bench/bench_runner.h"

#include <algorithm>
#include <chrono>
#include <memory>
#include <random>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "tools/bench/parallel_dummy_weight_source.h"
#include "tools/bench/roofline.h"
#include "worker/backend/backend_factory.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/deepseek_v3_model.h"
#include "worker/model/local_expert_dispatcher.h"
#include "worker/model/model_loader.h"
#include "worker/model/model_weights.h"
#ifdef DEEPINFER_WITH_CUDA
#include "worker/backend/cuda/cuda_backend.h"
#endif

namespace deepinfer {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(q * (v.size() - 1) + 0.5));
  return v[i];
}

// Dummy weights through the multi-threaded generator (same values as LoadDeepseekV3's dummy
// format), anything else through LoadDeepseekV3.
absl::StatusOr<std::unique_ptr<DeepseekV3Model>> Load(const BenchConfig& bc, Backend* backend) {
  if (!absl::StartsWith(bc.model, "dummy:")) return LoadDeepseekV3(bc.model, backend);
  std::string spec = bc.model.substr(6);
  uint64_t seed = 0;
  const size_t at = spec.rfind('@');
  if (at != std::string::npos) {
    if (!absl::SimpleAtoi(spec.substr(at + 1), &seed)) {
      return absl::InvalidArgumentError(absl::StrCat("bad dummy seed in '", bc.model, "'"));
    }
    spec = spec.substr(0, at);
  }
  auto config = ModelConfig::FromFile(spec);
  if (!config.ok()) return config.status();
  ParallelDummyWeightSource source(seed, static_cast<int>(bc.load_threads));
  auto weights = ModelWeights::Load(*config, &source, backend, LoadOptions{});
  if (!weights.ok()) return weights.status();
  std::vector<int64_t> all(config->n_routed_experts);
  for (int64_t e = 0; e < config->n_routed_experts; ++e) all[e] = e;
  std::unique_ptr<ExpertDispatcher> dispatcher;
  if (config->n_routed_experts > 0) {
    dispatcher = std::make_unique<LocalExpertDispatcher>(backend, config->n_routed_experts,
                                                         config->hidden_size, std::move(all));
  }
  return DeepseekV3Model::Create(*config, std::move(*weights), backend, std::move(dispatcher));
}

int32_t Argmax(const std::vector<float>& l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

}  // namespace

absl::StatusOr<BenchResult> RunBenchmark(const BenchConfig& bc) {
  if (bc.decode_num_requests <= 0 || bc.context_length <= 0 || bc.output_len <= bc.warmup ||
      bc.prefill_batch_tokens <= 0 || bc.prefill_repeats <= 0) {
    return absl::InvalidArgumentError(
        "bench: need positive requests, context length, prefill tokens and repeats, and "
        "output_len > warmup");
  }
  BackendOptions bo;
  bo.kind = bc.backend;
  bo.cuda_device = static_cast<int>(bc.cuda_device);
  auto backend = MakeBackend(bo);
  if (!backend.ok()) return backend.status();
  BenchResult r;
  r.backend = (*backend)->name();

  const Clock::time_point load_start = Clock::now();
  auto model_or = Load(bc, backend->get());
  if (!model_or.ok()) return model_or.status();
  std::unique_ptr<DeepseekV3Model> model = std::move(*model_or);
  (*backend)->Synchronize();
  r.load_seconds = Seconds(load_start, Clock::now());
  const ModelConfig& mc = model->config();
  r.param_count = CountParams(mc).total;

  const int64_t ctx = bc.context_length, n = bc.decode_num_requests;
  const int64_t prefill_seqs = std::max<int64_t>(1, bc.prefill_batch_tokens / ctx);
  const int64_t per_seq_blocks =
      (ctx + bc.output_len + bc.op_timing_steps + bc.block_size) / bc.block_size;
#ifdef DEEPINFER_WITH_CUDA
  auto* cuda = dynamic_cast<CudaBackend*>(backend->get());
#endif
  // Runs `fn` with per-op timing on (CUDA only) and returns the op table.
  auto with_op_timing = [&](auto fn) -> std::string {
#ifdef DEEPINFER_WITH_CUDA
    if (cuda != nullptr && bc.op_timing_steps > 0) {
      cuda->SetOpTiming(true);
      fn();
      cuda->SetOpTiming(false);
      return cuda->TakeOpTimingReport();
    }
#endif
    return "";
  };
  const int64_t blocks = per_seq_blocks * std::max(n, prefill_seqs);
  auto pool_or = KvBlockPool::Create(
      backend->get(),
      model->CacheOptions(static_cast<int32_t>(blocks), static_cast<int32_t>(bc.block_size)));
  if (!pool_or.ok()) return pool_or.status();
  std::unique_ptr<KvBlockPool> pool = std::move(*pool_or);

  // Random prompt tokens, never all the same (timing on degenerate data is misleading).
  std::mt19937 gen(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(mc.vocab_size - 1));
  auto new_seq = [&]() -> absl::StatusOr<SequenceStep> {
    SequenceStep s;
    s.tokens.resize(ctx);
    for (int32_t& t : s.tokens) t = tok(gen);
    auto b = pool->Allocate(static_cast<int32_t>(per_seq_blocks));
    if (!b.ok()) return b.status();
    s.block_table = std::move(*b);
    return s;
  };

  // ---- Prefill ----
  std::vector<double> prefill_times;
  const int64_t prefill_runs = bc.prefill_repeats + 1 + (bc.op_timing_steps > 0 ? 1 : 0);
  for (int64_t rep = 0; rep < prefill_runs; ++rep) {  // the first is warm-up, then timed
    const bool op_timed = rep == bc.prefill_repeats + 1;
    std::vector<SequenceStep> batch;
    for (int64_t i = 0; i < prefill_seqs; ++i) {
      auto s = new_seq();
      if (!s.ok()) return s.status();
      batch.push_back(std::move(*s));
    }
    absl::StatusOr<StepOutput> out;
    const Clock::time_point t0 = Clock::now();
    if (op_timed) {
      r.prefill_op_report = with_op_timing([&] { out = model->Step(batch, pool.get()); });
    } else {
      out = model->Step(batch, pool.get());
    }
    const Clock::time_point t1 = Clock::now();
    if (!out.ok()) return out.status();
    if (rep > 0 && !op_timed) prefill_times.push_back(Seconds(t0, t1));
    for (const SequenceStep& s : batch) {
      absl::Status st = pool->Free(s.block_table);
      if (!st.ok()) return st;
    }
  }
  r.prefill_tokens_per_step = prefill_seqs * ctx;
  r.prefill_step_seconds = Percentile(prefill_times, 0.5);
  r.prefill_tokens_per_s = r.prefill_tokens_per_step / r.prefill_step_seconds;
  r.prefill_roofline_fraction = PrefillStepCost(mc, prefill_seqs, ctx, bc.bytes_per_param)
                                    .RooflineSeconds(bc.peak_bytes_per_s, bc.peak_flops_per_s) /
                                r.prefill_step_seconds;

  // ---- Decode: fill N sequences to ctx (untimed), then N-way decode steps ----
  std::vector<SequenceStep> seqs;
  std::vector<int32_t> next(n);
  for (int64_t i = 0; i < n; i += prefill_seqs) {
    std::vector<SequenceStep> chunk;
    for (int64_t j = i; j < std::min(n, i + prefill_seqs); ++j) {
      auto s = new_seq();
      if (!s.ok()) return s.status();
      chunk.push_back(std::move(*s));
    }
    auto out = model->Step(chunk, pool.get());
    if (!out.ok()) return out.status();
    for (size_t j = 0; j < chunk.size(); ++j) {
      next[i + j] = Argmax(out->logits[j]);
      seqs.push_back(std::move(chunk[j]));
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    seqs[i].position_offset = ctx;
    seqs[i].tokens = {next[i]};
  }
  std::vector<double> step_times;
  for (int64_t step = 0; step < bc.output_len; ++step) {
    const Clock::time_point t0 = Clock::now();
    auto out = model->Step(seqs, pool.get());
    const Clock::time_point t1 = Clock::now();
    if (!out.ok()) return out.status();
    if (step >= bc.warmup) step_times.push_back(Seconds(t0, t1));
    for (int64_t i = 0; i < n; ++i) {
      const int32_t t = Argmax(out->logits[i]);
      if (i == 0) r.first_decode_tokens.push_back(t);
      seqs[i].position_offset += 1;
      seqs[i].tokens = {t};
    }
  }
  absl::Status timed_status;
  r.decode_op_report = with_op_timing([&] {
    for (int64_t step = 0; step < bc.op_timing_steps && timed_status.ok(); ++step) {
      auto out = model->Step(seqs, pool.get());
      if (!out.ok()) {
        timed_status = out.status();
        return;
      }
      for (int64_t i = 0; i < n; ++i) {
        seqs[i].position_offset += 1;
        seqs[i].tokens = {Argmax(out->logits[i])};
      }
    }
  });
  if (!timed_status.ok()) return timed_status;
  r.decode_batch = n;
  r.decode_steps = static_cast<int64_t>(step_times.size());
  r.decode_p50_seconds = Percentile(step_times, 0.5);
  r.decode_p99_seconds = Percentile(step_times, 0.99);
  r.decode_tokens_per_s = n / r.decode_p50_seconds;
  // Mid-run context: the cost model at ctx + output_len / 2 cached tokens.
  const StepCost dc = DecodeStepCost(mc, n, ctx + bc.output_len / 2, bc.bytes_per_param);
  r.decode_bytes_per_step = dc.bytes;
  r.decode_flops_per_step = dc.flops;
  r.decode_roofline_fraction =
      dc.RooflineSeconds(bc.peak_bytes_per_s, bc.peak_flops_per_s) / r.decode_p50_seconds;
#ifdef DEEPINFER_WITH_CUDA
  if (cuda != nullptr) {
    auto peak = cuda->ReservedBytes(/*high_water_mark=*/true);
    if (peak.ok()) r.device_bytes_reserved_peak = static_cast<int64_t>(*peak);
  }
#endif
  absl::Status st = (*backend)->status();
  if (!st.ok()) return st;
  return r;
}

std::string FormatBenchReport(const BenchConfig& c, const BenchResult& r) {
  std::string out;
  absl::StrAppendFormat(&out, "model: %s (%.3fB parameters, %.0f bytes each)\n", c.model,
                        r.param_count / 1e9, c.bytes_per_param);
  absl::StrAppendFormat(&out, "backend: %s\nload_s: %.2f\n", r.backend, r.load_seconds);
  absl::StrAppendFormat(&out,
                        "prefill: %d tokens/step (%d x %d), median step %.4f s, %.1f tok/s, "
                        "roofline fraction %.4f\n",
                        r.prefill_tokens_per_step, r.prefill_tokens_per_step / c.context_length,
                        c.context_length, r.prefill_step_seconds, r.prefill_tokens_per_s,
                        r.prefill_roofline_fraction);
  absl::StrAppendFormat(&out,
                        "decode: batch %d, context %d, %d timed steps, p50 %.4f s, p99 %.4f s, "
                        "%.1f tok/s, roofline fraction %.4f (%.3g bytes, %.3g FLOPs per step; "
                        "%.0f GB/s, %.0f TFLOP/s peaks)\n",
                        r.decode_batch, c.context_length, r.decode_steps, r.decode_p50_seconds,
                        r.decode_p99_seconds, r.decode_tokens_per_s, r.decode_roofline_fraction,
                        r.decode_bytes_per_step, r.decode_flops_per_step, c.peak_bytes_per_s / 1e9,
                        c.peak_flops_per_s / 1e12);
  if (r.device_bytes_reserved_peak >= 0) {
    absl::StrAppendFormat(&out, "device_memory_reserved_peak: %.3f GiB\n",
                          r.device_bytes_reserved_peak / 1073741824.0);
  }
  if (!r.prefill_op_report.empty()) {
    absl::StrAppend(&out, "prefill ops (one step, synchronised per op):\n", r.prefill_op_report);
  }
  if (!r.decode_op_report.empty()) {
    absl::StrAppend(&out, "decode ops (", c.op_timing_steps, " steps, synchronised per op):\n",
                    r.decode_op_report);
  }
  absl::StrAppend(&out, "seq0_decode_tokens:");
  for (int32_t t : r.first_decode_tokens) absl::StrAppend(&out, " ", t);
  absl::StrAppend(&out, "\n");
  return out;
}

std::string BenchCsvHeader() {
  return "model,backend,requests,context,prefill_tokens,prefill_tok_s,prefill_roofline,"
         "decode_tok_s,decode_p50_s,decode_p99_s,decode_roofline,mem_peak_bytes,load_s";
}

std::string BenchCsvRow(const BenchConfig& c, const BenchResult& r) {
  return absl::StrFormat("%s,%s,%d,%d,%d,%.2f,%.5f,%.2f,%.6f,%.6f,%.5f,%d,%.2f", c.model, r.backend,
                         r.decode_batch, c.context_length, r.prefill_tokens_per_step,
                         r.prefill_tokens_per_s, r.prefill_roofline_fraction, r.decode_tokens_per_s,
                         r.decode_p50_seconds, r.decode_p99_seconds, r.decode_roofline_fraction,
                         r.device_bytes_reserved_peak, r.load_seconds);
}

}  // namespace deepinfer
