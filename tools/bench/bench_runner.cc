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
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "tools/bench/parallel_dummy_weight_source.h"
#include "tools/bench/roofline.h"
#include "worker/backend/backend_factory.h"
#include "worker/backend/bf16.h"
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

// Writes uniform values in [-1, 1) over every layer's cache (all blocks): decode then reads
// a cache of realistic magnitude without prefill steps having written it.
void FillCacheRandom(Backend* backend, const KvBlockPool& pool, uint32_t seed) {
  const KvBlockPoolOptions& o = pool.options();
  const size_t per_layer = static_cast<size_t>(o.num_blocks) * o.block_size *
                           (o.latent_dim + o.rope_dim);
  const bool bf16 = o.dtype == WeightDType::kBFloat16;
  // One random chunk, copied repeatedly at shifting offsets: enough variety for timing.
  std::vector<float> chunk(std::min<size_t>(per_layer, size_t{1} << 22));
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : chunk) v = u(gen);
  std::vector<uint16_t> chunk16;
  if (bf16) {
    for (float v : chunk) chunk16.push_back(FloatToBf16Bits(v));
  }
  const size_t elem = WeightDTypeSize(o.dtype);
  const char* src = bf16 ? reinterpret_cast<const char*>(chunk16.data())
                         : reinterpret_cast<const char*>(chunk.data());
  for (int32_t layer = 0; layer < o.num_layers; ++layer) {
    char* dst = static_cast<char*>(pool.LayerView(layer).cache);
    for (size_t done = 0; done < per_layer;) {
      const size_t shift = (layer * 7919 + done) % chunk.size();
      const size_t n = std::min(per_layer - done, chunk.size() - shift);
      backend->CopyToDevice(src + shift * elem, n * elem, dst + done * elem);
      done += n;
    }
  }
  backend->Synchronize();
}

std::string Join(const std::vector<int32_t>& v) {
  std::string out;
  for (int32_t t : v) absl::StrAppend(&out, out.empty() ? "" : " ", t);
  return out;
}

}  // namespace

bool ParseRequestCounts(const std::string& text, std::vector<int64_t>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n)) return false;
    out->push_back(n);
  }
  return !out->empty();
}

std::string DummyModelSpec(const std::string& model, int64_t seed) {
  if (absl::StartsWith(model, "dummy:")) return model;
  const std::string config =
      absl::EndsWith(model, ".json") ? model : absl::StrCat(model, "/config.json");
  return absl::StrCat("dummy:", config, "@", seed);
}

absl::StatusOr<double> BytesPerValue(const std::string& dtype) {
  if (dtype == "float32") return 4.0;
  if (dtype == "bfloat16") return 2.0;
  return absl::InvalidArgumentError(
      absl::StrCat("bench: --dtype must be float32 or bfloat16, not '", dtype, "'"));
}

absl::StatusOr<BenchResult> RunBenchmark(const BenchConfig& bc) {
  int64_t max_n = 0;
  for (int64_t n : bc.decode_num_requests) {
    if (n <= 0) return absl::InvalidArgumentError("bench: decode request counts must be > 0");
    max_n = std::max(max_n, n);
  }
  if (bc.decode_num_requests.empty() || bc.context_length <= 0 || bc.output_len <= bc.warmup ||
      bc.warmup < 0 || bc.prefill_batch_tokens < 0 || bc.prefill_repeats <= 0) {
    return absl::InvalidArgumentError(
        "bench: need at least one decode request count, a positive context length and "
        "iterations, prefill tokens >= 0, and output_len > warmup >= 0");
  }
  if (bc.decode_fill != "prefill" && bc.decode_fill != "random") {
    return absl::InvalidArgumentError(absl::StrCat(
        "bench: --decode-fill must be prefill or random, not '", bc.decode_fill, "'"));
  }
  auto bytes_per_value = BytesPerValue(bc.dtype);
  if (!bytes_per_value.ok()) return bytes_per_value.status();
  BackendOptions bo;
  bo.kind = bc.backend;
  bo.cuda_device = static_cast<int>(bc.cuda_device);
  bo.dtype = bc.dtype;
  auto backend = MakeBackend(bo);
  if (!backend.ok()) return backend.status();
  BenchResult r;
  r.backend = (*backend)->name();
  r.bytes_per_value = *bytes_per_value;

  const Clock::time_point load_start = Clock::now();
  auto model_or = Load(bc, backend->get());
  if (!model_or.ok()) return model_or.status();
  std::unique_ptr<DeepseekV3Model> model = std::move(*model_or);
  (*backend)->Synchronize();
  r.load_seconds = Seconds(load_start, Clock::now());
  const ModelConfig& mc = model->config();
  r.param_count = CountParams(mc).total;

  const int64_t ctx = bc.context_length;
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
  const int64_t blocks = per_seq_blocks * std::max(max_n, prefill_seqs);
  KvBlockPoolOptions cache_options =
      model->CacheOptions(static_cast<int32_t>(blocks), static_cast<int32_t>(bc.block_size));
  auto cache_dtype = ResolveKvCacheDType(bc.kv_cache_dtype, (*backend)->weight_dtype());
  if (!cache_dtype.ok()) return cache_dtype.status();
  cache_options.dtype = *cache_dtype;
  auto pool_or = KvBlockPool::Create(backend->get(), cache_options);
  if (!pool_or.ok()) return pool_or.status();
  std::unique_ptr<KvBlockPool> pool = std::move(*pool_or);
  r.kv_cache_dtype = WeightDTypeName(pool->options().dtype);
  r.cache_bytes_per_value = static_cast<double>(WeightDTypeSize(pool->options().dtype));
  if (bc.decode_fill == "random") FillCacheRandom(backend->get(), *pool, 99);

  // Random prompt tokens, never all the same (timing on degenerate data is misleading).
  std::mt19937 gen(1234);
  std::uniform_int_distribution<int32_t> tok(0, static_cast<int32_t>(mc.vocab_size - 1));
  auto new_seqs = [&](int64_t count) -> absl::StatusOr<std::vector<SequenceStep>> {
    std::vector<SequenceStep> batch(count);
    for (SequenceStep& s : batch) {
      s.tokens.resize(ctx);
      for (int32_t& t : s.tokens) t = tok(gen);
      auto b = pool->Allocate(static_cast<int32_t>(per_seq_blocks));
      if (!b.ok()) return b.status();
      s.block_table = std::move(*b);
    }
    return batch;
  };
  auto free_seqs = [&](const std::vector<SequenceStep>& batch) -> absl::Status {
    for (const SequenceStep& s : batch) {
      absl::Status st = pool->Free(s.block_table);
      if (!st.ok()) return st;
    }
    return absl::OkStatus();
  };

  // ---- Prefill: a one-prompt warm-up, then the timed steps, then the op-timed one ----
  if (bc.prefill_batch_tokens > 0) {
    std::vector<double> prefill_times;
    const int64_t runs = bc.prefill_repeats + 1 + (bc.op_timing_steps > 0 ? 1 : 0);
    for (int64_t rep = 0; rep < runs; ++rep) {
      const bool op_timed = rep == bc.prefill_repeats + 1;
      auto batch = new_seqs(rep == 0 ? 1 : prefill_seqs);
      if (!batch.ok()) return batch.status();
      absl::StatusOr<StepOutput> out;
      const Clock::time_point t0 = Clock::now();
      if (op_timed) {
        r.prefill_op_report = with_op_timing([&] { out = model->Step(*batch, pool.get()); });
      } else {
        out = model->Step(*batch, pool.get());
      }
      const Clock::time_point t1 = Clock::now();
      if (!out.ok()) return out.status();
      if (rep > 0 && !op_timed) prefill_times.push_back(Seconds(t0, t1));
      absl::Status st = free_seqs(*batch);
      if (!st.ok()) return st;
    }
    r.prefill_tokens_per_step = prefill_seqs * ctx;
    r.prefill_step_seconds = Percentile(prefill_times, 0.5);
    r.prefill_tokens_per_s = r.prefill_tokens_per_step / r.prefill_step_seconds;
    const StepCost pc =
        PrefillStepCost(mc, prefill_seqs, ctx, r.bytes_per_value, r.cache_bytes_per_value);
    r.prefill_bytes_per_step = pc.bytes;
    r.prefill_flops_per_step = pc.flops;
    r.prefill_roofline_fraction =
        pc.RooflineSeconds(bc.peak_bytes_per_s, bc.peak_flops_per_s) / r.prefill_step_seconds;
  }

  // ---- Decode, per batch size: N sequences at ctx cached tokens, then N-way decode steps ----
  for (size_t which = 0; which < bc.decode_num_requests.size(); ++which) {
    const int64_t n = bc.decode_num_requests[which];
    const bool last = which + 1 == bc.decode_num_requests.size();
    auto seqs_or = new_seqs(n);
    if (!seqs_or.ok()) return seqs_or.status();
    std::vector<SequenceStep> seqs = std::move(*seqs_or);
    std::vector<int32_t> next(n);
    if (bc.decode_fill == "prefill") {
      for (int64_t i = 0; i < n; i += prefill_seqs) {
        std::vector<SequenceStep> chunk(seqs.begin() + i,
                                        seqs.begin() + std::min(n, i + prefill_seqs));
        auto out = model->Step(chunk, pool.get());
        if (!out.ok()) return out.status();
        for (size_t j = 0; j < chunk.size(); ++j) next[i + j] = Argmax(out->logits[j]);
      }
    } else {
      for (int64_t i = 0; i < n; ++i) next[i] = tok(gen);  // the cache already holds values
    }
    for (int64_t i = 0; i < n; ++i) {
      seqs[i].position_offset = ctx;
      seqs[i].tokens = {next[i]};
      // As the engine decodes: greedy, sampled on the device, no logits back to the host.
      seqs[i].sampling = SamplingParams{};
      seqs[i].return_logits = false;
    }
    DecodeResult d;
    std::vector<double> step_times;
    for (int64_t step = 0; step < bc.output_len; ++step) {
      const Clock::time_point t0 = Clock::now();
      auto out = model->Step(seqs, pool.get());
      const Clock::time_point t1 = Clock::now();
      if (!out.ok()) return out.status();
      if (step >= bc.warmup) step_times.push_back(Seconds(t0, t1));
      for (int64_t i = 0; i < n; ++i) {
        const int32_t t = out->sampled[i].token;
        if (i == 0) d.seq0_tokens.push_back(t);
        seqs[i].position_offset += 1;
        seqs[i].tokens = {t};
      }
    }
    absl::Status timed_status;
    if (last) {
      r.decode_op_report = with_op_timing([&] {
        for (int64_t step = 0; step < bc.op_timing_steps && timed_status.ok(); ++step) {
          auto out = model->Step(seqs, pool.get());
          if (!out.ok()) {
            timed_status = out.status();
            return;
          }
          for (int64_t i = 0; i < n; ++i) {
            seqs[i].position_offset += 1;
            seqs[i].tokens = {out->sampled[i].token};
          }
        }
      });
    }
    if (!timed_status.ok()) return timed_status;
    absl::Status st = free_seqs(seqs);
    if (!st.ok()) return st;
    d.batch = n;
    d.steps = static_cast<int64_t>(step_times.size());
    d.p50_seconds = Percentile(step_times, 0.5);
    d.p99_seconds = Percentile(step_times, 0.99);
    d.tokens_per_s = n / d.p50_seconds;
    // Mid-run context: the cost model at ctx + output_len / 2 cached tokens.
    const StepCost dc =
        DecodeStepCost(mc, n, ctx + bc.output_len / 2, r.bytes_per_value, r.cache_bytes_per_value);
    d.bytes_per_step = dc.bytes;
    d.flops_per_step = dc.flops;
    d.roofline_fraction =
        dc.RooflineSeconds(bc.peak_bytes_per_s, bc.peak_flops_per_s) / d.p50_seconds;
    r.decode.push_back(std::move(d));
  }
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
  absl::StrAppendFormat(&out, "model: %s (%.3fB parameters, %s, %.0f bytes each; KV cache %s)\n",
                        c.model, r.param_count / 1e9, c.dtype, r.bytes_per_value, r.kv_cache_dtype);
  absl::StrAppendFormat(&out, "backend: %s\nload_s: %.2f\n", r.backend, r.load_seconds);
  if (r.prefill_tokens_per_step > 0) {
    absl::StrAppendFormat(&out,
                          "prefill: %d tokens/step (%d x %d), median step %.4f s, %.1f tok/s, "
                          "roofline fraction %.4f\n",
                          r.prefill_tokens_per_step, r.prefill_tokens_per_step / c.context_length,
                          c.context_length, r.prefill_step_seconds, r.prefill_tokens_per_s,
                          r.prefill_roofline_fraction);
  }
  for (const DecodeResult& d : r.decode) {
    absl::StrAppendFormat(
        &out,
        "decode: batch %d, context %d, %d timed steps, p50 %.4f s, p99 %.4f s, %.1f tok/s, "
        "roofline fraction %.4f (%.3g bytes, %.3g FLOPs per step; %.0f GB/s, %.0f TFLOP/s "
        "peaks)\n",
        d.batch, c.context_length, d.steps, d.p50_seconds, d.p99_seconds, d.tokens_per_s,
        d.roofline_fraction, d.bytes_per_step, d.flops_per_step, c.peak_bytes_per_s / 1e9,
        c.peak_flops_per_s / 1e12);
    absl::StrAppend(&out, "seq0_decode_tokens (batch ", d.batch, "): ", Join(d.seq0_tokens),
                    "\n");
  }
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
  return out;
}

std::string FormatBenchJson(const BenchConfig& c, const BenchResult& r) {
  std::string decode;
  for (const DecodeResult& d : r.decode) {
    absl::StrAppendFormat(
        &decode,
        "%s{\"requests\": %d, \"timed_steps\": %d, \"tokens_per_s\": %.3f, \"p50_s\": %.6f, "
        "\"p99_s\": %.6f, \"roofline_fraction\": %.6f, \"bytes_per_step\": %.6g, "
        "\"flops_per_step\": %.6g, \"seq0_tokens\": [%s]}",
        decode.empty() ? "" : ", ", d.batch, d.steps, d.tokens_per_s, d.p50_seconds,
        d.p99_seconds, d.roofline_fraction, d.bytes_per_step, d.flops_per_step,
        absl::StrReplaceAll(Join(d.seq0_tokens), {{" ", ", "}}));
  }
  // The model string is a path: escape the two characters JSON strings cannot hold raw.
  const std::string model = absl::StrReplaceAll(c.model, {{"\\", "\\\\"}, {"\"", "\\\""}});
  return absl::StrFormat(
      "{\"model\": \"%s\", \"backend\": \"%s\", \"dtype\": \"%s\", \"bytes_per_value\": %.0f, "
      "\"params\": %.0f, \"load_s\": %.3f, \"context\": %d, \"peak_bytes_per_s\": %.4g, "
      "\"peak_flops_per_s\": %.4g, \"prefill\": {\"tokens_per_step\": %d, \"step_s\": %.6f, "
      "\"tokens_per_s\": %.3f, \"roofline_fraction\": %.6f, \"bytes_per_step\": %.6g, "
      "\"flops_per_step\": %.6g}, \"decode\": [%s], \"mem_peak_bytes\": %d}\n",
      model, r.backend, c.dtype, r.bytes_per_value, r.param_count, r.load_seconds,
      c.context_length, c.peak_bytes_per_s, c.peak_flops_per_s, r.prefill_tokens_per_step,
      r.prefill_step_seconds, r.prefill_tokens_per_s, r.prefill_roofline_fraction,
      r.prefill_bytes_per_step, r.prefill_flops_per_step, decode, r.device_bytes_reserved_peak);
}

std::string BenchCsvHeader() {
  return "model,backend,dtype,requests,context,prefill_tokens,prefill_tok_s,prefill_roofline,"
         "decode_tok_s,decode_p50_s,decode_p99_s,decode_roofline,mem_peak_bytes,load_s";
}

std::vector<std::string> BenchCsvRows(const BenchConfig& c, const BenchResult& r) {
  std::vector<std::string> rows;
  for (const DecodeResult& d : r.decode) {
    rows.push_back(absl::StrFormat(
        "%s,%s,%s,%d,%d,%d,%.2f,%.5f,%.2f,%.6f,%.6f,%.5f,%d,%.2f", c.model, r.backend, c.dtype,
        d.batch, c.context_length, r.prefill_tokens_per_step, r.prefill_tokens_per_s,
        r.prefill_roofline_fraction, d.tokens_per_s, d.p50_seconds, d.p99_seconds,
        d.roofline_fraction, r.device_bytes_reserved_peak, r.load_seconds));
  }
  return rows;
}

}  // namespace deepinfer
