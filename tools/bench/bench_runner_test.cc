// RunBenchmark end to end on the CPU backend with a tiny dummy model: every figure is
// produced, finite and positive, for each requested batch size and both cache fills, and the
// report holds no H200 roofline and no CUDA graph line; the cuda report's roofline and graph
// lines from a made-up result; the flag helpers and the refusals. Expert parallelism (--ranks 2 and
// 4, TCP between threads) against the one-rank run: every rank's sequence 0 decodes the one-rank
// run's greedy tokens. --speculative-tokens: the decode, verify and draft times per batch size
// and the speed-up model against hand-worked numbers. --mixed-steps: a result per shape.
#include "tools/bench/bench_runner.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

std::string FixtureDir(const std::string& name = "dsv3_qlora_rope") {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/" + name;
}

BenchConfig SmallConfig() {
  BenchConfig c;
  c.model = DummyModelSpec(FixtureDir(), 7);
  c.backend = "cpu";
  c.decode_num_requests = {3};
  c.context_length = 20;
  c.prefill_batch_tokens = 40;
  c.output_len = 5;
  c.warmup = 1;
  c.prefill_repeats = 2;
  return c;
}

void ExpectDecodeFigures(const DecodeResult& d, int64_t batch) {
  EXPECT_EQ(d.batch, batch);
  EXPECT_EQ(d.steps, 4);
  EXPECT_EQ(d.seq0_tokens.size(), 5u);
  for (double v : {d.tokens_per_s, d.p50_seconds, d.bytes_per_step, d.flops_per_step}) {
    EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
  }
  EXPECT_EQ(d.roofline_fraction, 0);  // no roofline on the CPU
  EXPECT_FALSE(d.cuda_graphs);
  EXPECT_LE(d.p50_seconds, d.p99_seconds);
}

TEST(BenchRunnerTest, ProducesAllFiguresOnCpu) {
  BenchConfig c = SmallConfig();
  c.dtype = "float32";
  auto r = RunBenchmark(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->backend, "cpu");
  EXPECT_EQ(r->bytes_per_value, 4);
  EXPECT_EQ(r->kv_cache_dtype, "float32");
  EXPECT_EQ(r->cache_bytes_per_value, 4);
  EXPECT_EQ(r->prefill_tokens_per_step, 40);
  ASSERT_EQ(r->decode.size(), 1u);
  ExpectDecodeFigures(r->decode[0], 3);
  for (double v : {r->prefill_tokens_per_s, r->prefill_bytes_per_step, r->prefill_flops_per_step,
                   r->prefill_warmup_step_seconds}) {
    EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
  }
  EXPECT_EQ(r->device_bytes_reserved_peak, -1);  // the CPU backend reports no device memory
  // The peaks are an H200's and the CPU runs no CUDA graphs: neither shows (c.cuda_graphs is on,
  // as by default).
  ASSERT_TRUE(c.cuda_graphs);
  EXPECT_FALSE(r->has_roofline);
  EXPECT_FALSE(r->cuda_graphs);
  EXPECT_EQ(r->prefill_roofline_fraction, 0);
  const std::string report = FormatBenchReport(c, *r);
  EXPECT_NE(report.find("decode: batch 3"), std::string::npos) << report;
  EXPECT_NE(report.find("(untimed first step of this size "), std::string::npos) << report;
  EXPECT_NE(report.find("roofline: none on the cpu backend"), std::string::npos) << report;
  EXPECT_NE(report.find("FLOPs per step)"), std::string::npos) << report;  // costs stay
  for (const char* absent :
       {"roofline fraction", "TFLOP/s peaks", "GB/s", "cuda_graphs", "graph"}) {
    EXPECT_EQ(report.find(absent), std::string::npos) << absent << " in:\n" << report;
  }
  const std::string json = FormatBenchJson(c, *r);
  EXPECT_NE(json.find("\"warmup_step_s\": "), std::string::npos) << json;
  EXPECT_EQ(json.front(), '{');
  EXPECT_NE(json.find("\"requests\": 3, \"cuda_graphs\": null,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"dtype\": \"float32\", \"bytes_per_value\": 4,"), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"peak_bytes_per_s\": null, \"peak_flops_per_s\": null,"), std::string::npos)
      << json;
  EXPECT_NE(json.find("\"roofline_fraction\": null, \"bytes_per_step\": "), std::string::npos)
      << json;
  EXPECT_EQ(json.find("\"roofline_fraction\": 0"), std::string::npos) << json;
  EXPECT_NE(json.find("\"cuda_graphs\": null, \"decode_graph_steps\""), std::string::npos) << json;
  ASSERT_EQ(BenchCsvRows(c, *r).size(), 1u);
  const std::string row = BenchCsvRows(c, *r)[0];
  EXPECT_EQ(row.find('\n'), std::string::npos);
  // prefill_roofline (8th) and decode_roofline (12th) are empty.
  std::vector<std::string> cells;
  std::stringstream in(row);
  for (std::string cell; std::getline(in, cell, ',');) cells.push_back(cell);
  ASSERT_EQ(cells.size(), 18u) << row;
  EXPECT_EQ(cells[7], "") << row;
  EXPECT_EQ(cells[11], "") << row;
  EXPECT_NE(cells[8], "") << row;
}

// The cuda backend's report, from a result made up here (no GPU needed): the roofline next to
// each throughput with the peaks it was taken against, and the CUDA graph figures.
TEST(BenchRunnerTest, CudaReportShowsRooflineAndGraphs) {
  BenchConfig c = SmallConfig();
  c.backend = "cuda";
  c.dtype = "bfloat16";
  c.context_length = 1024;
  BenchResult r;
  r.backend = "cuda";
  r.has_roofline = true;
  r.cuda_graphs = true;
  r.bytes_per_value = 2;
  r.kv_cache_dtype = "bfloat16";
  r.prefill_tokens_per_step = 2048;
  r.prefill_step_seconds = 0.25;
  r.prefill_tokens_per_s = 8192;
  r.prefill_roofline_fraction = 0.6321;
  r.prefill_attention_form = "non-absorbed";
  r.decode_graph_steps = 12;
  r.device_bytes_reserved_peak = 3LL << 30;
  DecodeResult d;
  d.batch = 64;
  d.steps = 14;
  d.p50_seconds = 0.01;
  d.p99_seconds = 0.012;
  d.tokens_per_s = 6400;
  d.tokens_per_s_per_gpu = 6400;
  d.roofline_fraction = 0.5234;
  d.bytes_per_step = 2.25e10;
  d.flops_per_step = 1e12;
  d.cuda_graphs = true;
  d.seq0_tokens = {5, 6};
  r.decode.push_back(d);
  const std::string report = FormatBenchReport(c, r);
  EXPECT_NE(report.find("6400.0 tok/s, roofline fraction 0.5234 (2.25e+10 bytes, 1e+12 FLOPs "
                        "per step; 4300 GB/s, 790 TFLOP/s peaks)"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("8192.0 tok/s, roofline fraction 0.6321, non-absorbed attention"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("cuda_graphs: on (max batch 256), 12 decode steps on the graph path"),
            std::string::npos)
      << report;
  EXPECT_EQ(report.find("roofline: none"), std::string::npos) << report;
  const std::string json = FormatBenchJson(c, r);
  EXPECT_NE(json.find("\"requests\": 64, \"cuda_graphs\": true,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"roofline_fraction\": 0.523400"), std::string::npos) << json;
  EXPECT_NE(json.find("\"roofline_fraction\": 0.632100"), std::string::npos) << json;
  EXPECT_NE(json.find("\"peak_bytes_per_s\": 4.3e+12, \"peak_flops_per_s\": 7.9e+14,"),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("\"cuda_graphs\": true, \"decode_graph_steps\": 12"), std::string::npos)
      << json;
  EXPECT_EQ(json.find("null"), std::string::npos) << json;
  ASSERT_EQ(BenchCsvRows(c, r).size(), 1u);
  EXPECT_NE(BenchCsvRows(c, r)[0].find(",0.63210,"), std::string::npos) << BenchCsvRows(c, r)[0];
  EXPECT_NE(BenchCsvRows(c, r)[0].find(",0.52340,"), std::string::npos) << BenchCsvRows(c, r)[0];
  // Expert parallel over two GPUs: the fraction is per GPU.
  r.ranks = 2;
  r.data_plane = "nccl";
  r.decode[0].tokens_per_s = 12800;
  const std::string ep = FormatBenchReport(c, r);
  EXPECT_NE(ep.find("6400.0 tok/s per GPU, roofline fraction 0.5234 per GPU (2.25e+10 bytes, "
                    "1e+12 FLOPs per step and GPU; 4300 GB/s, 790 TFLOP/s peaks)"),
            std::string::npos)
      << ep;
  // Graphs off on cuda: the line stays and says so.
  r.cuda_graphs = false;
  EXPECT_NE(FormatBenchReport(c, r).find("cuda_graphs: off"), std::string::npos);
}

TEST(BenchRunnerTest, SeveralBatchSizesRandomFillNoPrefill) {
  BenchConfig c = SmallConfig();
  c.decode_num_requests = {1, 4};
  c.decode_fill = "random";
  c.prefill_batch_tokens = 0;
  auto r = RunBenchmark(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prefill_tokens_per_step, 0);
  ASSERT_EQ(r->decode.size(), 2u);
  ExpectDecodeFigures(r->decode[0], 1);
  ExpectDecodeFigures(r->decode[1], 4);
  // More requests read more experts and more cache per step.
  EXPECT_GT(r->decode[1].bytes_per_step, r->decode[0].bytes_per_step);
  EXPECT_EQ(BenchCsvRows(c, *r).size(), 2u);
  EXPECT_EQ(FormatBenchReport(c, *r).find("prefill:"), std::string::npos);
}

// --compare-unfused-decode and --compare-pdl-off-decode: after each batch size's timed steps, a
// further result for each, in that order, of the same sequences at a later context.
TEST(BenchRunnerTest, ComparisonRunsFollowTheMeasuredDecode) {
  BenchConfig c = SmallConfig();
  c.decode_fill = "random";
  c.prefill_batch_tokens = 0;
  c.compare_unfused_decode = true;
  c.compare_pdl_off_decode = true;
  auto r = RunBenchmark(c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->decode.size(), 3u);
  const DecodeResult &measured = r->decode[0], &unfused = r->decode[1], &pdl_off = r->decode[2];
  ExpectDecodeFigures(measured, 3);
  EXPECT_TRUE(measured.fused_ops && measured.pdl);
  EXPECT_TRUE(!unfused.fused_ops && unfused.pdl);
  EXPECT_TRUE(pdl_off.fused_ops && !pdl_off.pdl);
  for (const DecodeResult* d : {&unfused, &pdl_off}) {
    EXPECT_EQ(d->batch, 3);
    EXPECT_EQ(d->steps, measured.steps);
    EXPECT_LE(d->p50_seconds, d->p99_seconds);
    EXPECT_DOUBLE_EQ(d->tokens_per_s, 3 / d->p50_seconds);
    EXPECT_DOUBLE_EQ(d->tokens_per_s_per_gpu, d->tokens_per_s);
    EXPECT_EQ(d->roofline_fraction, 0);  // no roofline on the CPU
  }
  // Each run decodes further into the sequences: more cache to read and attend per step.
  EXPECT_GT(unfused.bytes_per_step, measured.bytes_per_step);
  EXPECT_GT(pdl_off.bytes_per_step, unfused.bytes_per_step);
  EXPECT_GT(unfused.flops_per_step, measured.flops_per_step);
  EXPECT_GT(pdl_off.flops_per_step, unfused.flops_per_step);
  const std::string report = FormatBenchReport(c, *r);
  EXPECT_NE(report.find("(unfused)"), std::string::npos) << report;
  EXPECT_NE(report.find("(pdl off)"), std::string::npos) << report;
}

// --prefill-attention: the prompts of SmallConfig (40 tokens) take the non-absorbed form with
// mha (CPU backend), the absorbed one with auto (fewer than 64 new tokens) and absorbed; the
// roofline counts fewer attention FLOPs for the non-absorbed form, the same bytes.
TEST(BenchRunnerTest, PrefillRooflineCountsTheFormThatRuns) {
  BenchConfig c = SmallConfig();
  c.dtype = "float32";
  std::map<std::string, BenchResult> results;
  for (const char* form : {"auto", "absorbed", "mha"}) {
    c.prefill_attention = form;
    auto r = RunBenchmark(c);
    ASSERT_TRUE(r.ok()) << form << ": " << r.status();
    results[form] = *r;
  }
  EXPECT_EQ(results["auto"].prefill_attention_form, "absorbed");
  EXPECT_EQ(results["absorbed"].prefill_attention_form, "absorbed");
  EXPECT_EQ(results["mha"].prefill_attention_form, "non-absorbed");
  EXPECT_LT(results["mha"].prefill_flops_per_step, results["absorbed"].prefill_flops_per_step);
  EXPECT_DOUBLE_EQ(results["mha"].prefill_bytes_per_step,
                   results["absorbed"].prefill_bytes_per_step);
  c.prefill_attention = "mha";
  EXPECT_NE(FormatBenchReport(c, results["mha"]).find("non-absorbed attention"), std::string::npos);
}

TEST(BenchRunnerTest, RejectsBadInput) {
  BenchConfig c = SmallConfig();
  c.output_len = 1;
  c.warmup = 2;
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = SmallConfig();
  c.decode_num_requests = {2, 0};
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = SmallConfig();
  c.decode_fill = "zeros";
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = SmallConfig();
  c.dtype = "int4";
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = SmallConfig();
  c.dtype = "fp8";  // FP8 matrices are CUDA's; the CPU backend would quietly dequantise them
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  c = SmallConfig();
  c.prefill_attention = "flash";
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  // bfloat16 (the default) reaches the backend: bf16 weights, 2 bytes per value.
  c = SmallConfig();
  c.dtype = "bfloat16";
  auto bf16 = RunBenchmark(c);
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(bf16->bytes_per_value, 2);
  // ... and a bf16 KV cache, counted at 2 bytes per value in the roofline.
  EXPECT_EQ(bf16->kv_cache_dtype, "bfloat16");
  EXPECT_EQ(bf16->cache_bytes_per_value, 2);
  // An fp32 cache under bf16 weights when asked for; a bad name is rejected.
  c.kv_cache_dtype = "float32";
  auto f32_cache = RunBenchmark(c);
  ASSERT_TRUE(f32_cache.ok()) << f32_cache.status();
  EXPECT_EQ(f32_cache->kv_cache_dtype, "float32");
  EXPECT_EQ(f32_cache->cache_bytes_per_value, 4);
  // An FP8 cache: its real bytes per token (e4m3 latent, bf16 rope, a scale, padding), fewer
  // than bf16's, and between 1 and 2 bytes per value in the roofline.
  c.kv_cache_dtype = "fp8";
  auto fp8_cache = RunBenchmark(c);
  ASSERT_TRUE(fp8_cache.ok()) << fp8_cache.status();
  EXPECT_EQ(fp8_cache->kv_cache_dtype, "float8_e4m3");
  EXPECT_GT(fp8_cache->cache_bytes_per_value, 1);
  EXPECT_LT(fp8_cache->cache_bytes_per_value, 2);
  EXPECT_LT(fp8_cache->kv_cache_bytes_per_token, bf16->kv_cache_bytes_per_token);
  EXPECT_GT(fp8_cache->kv_cache_tokens_per_gib(), bf16->kv_cache_tokens_per_gib());
  c.kv_cache_dtype = "int8";
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
}

// A DeepSeek-V4 model: its steps priced by the V4 roofline (roofline_v4.h), and --decode-fill
// random refused (its cache keeps per-sequence state the random fill cannot write).
TEST(BenchRunnerTest, DeepseekV4StepsArePricedByTheV4Roofline) {
  BenchConfig c = SmallConfig();
  c.model = DummyModelSpec(FixtureDir("dsv4_bf16"), 7);
  c.dtype = "float32";
  auto r = RunBenchmark(c);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prefill_attention_form, "v4");
  ASSERT_EQ(r->decode.size(), 1u);
  ExpectDecodeFigures(r->decode[0], 3);
  c.decode_fill = "random";
  const absl::Status random = RunBenchmark(c).status();
  EXPECT_EQ(random.code(), absl::StatusCode::kInvalidArgument) << random;
  EXPECT_NE(random.message().find("--decode-fill prefill"), std::string::npos) << random;
  // V4 keeps no FP8 matrices: --dtype fp8 is refused by name, not run as bf16.
  c.decode_fill = "prefill";
  c.dtype = "fp8";
  const absl::Status fp8 = RunBenchmark(c).status();
  EXPECT_EQ(fp8.code(), absl::StatusCode::kInvalidArgument) << fp8;
  EXPECT_NE(fp8.message().find("DeepseekV4ForCausalLM"), std::string::npos) << fp8;
  EXPECT_NE(fp8.message().find("keeps none in FP8"), std::string::npos) << fp8;
}

// Mixed steps (mixed_step.h) after the decode batch sizes: one result per shape with its
// layout and positive times, on a V3 model (one rank and two), and on V4 (per-sequence state: a
// slot per sequence of the step); a negative prompt length is refused.
TEST(BenchRunnerTest, MixedStepsPerShape) {
  BenchConfig c = SmallConfig();
  c.dtype = "float32";
  c.mixed_steps = {{3, 30}, {2, 5}};
  c.mixed_prompt_length = 16;
  auto check = [&](const BenchResult& r) {
    ASSERT_EQ(r.mixed.size(), 2u);
    // 30 tokens over prompts of 16: 8 finishing the continued one, 16, then 6 (cut); 5: 5 of
    // the continued one's 8.
    EXPECT_EQ(r.mixed[0].prompts, 3);
    EXPECT_EQ(r.mixed[0].sampled_rows, 3 + 2);
    EXPECT_EQ(r.mixed[1].prompts, 1);
    EXPECT_EQ(r.mixed[1].sampled_rows, 2);
    for (const MixedStepResult& m : r.mixed) {
      EXPECT_EQ(m.context, 20);
      EXPECT_EQ(m.prompt_length, 16);
      EXPECT_EQ(m.timed_steps, 2);
      EXPECT_TRUE(std::isfinite(m.p50_seconds) && m.p50_seconds > 0) << m.p50_seconds;
      EXPECT_LE(m.p50_seconds, m.p99_seconds);
    }
    EXPECT_NE(FormatBenchJson(c, r).find("\"mixed\": [{\"decode_rows\": 3, \"prompt_tokens\": 30"),
              std::string::npos);
  };
  auto one = RunBenchmark(c);
  ASSERT_TRUE(one.ok()) << one.status();
  check(*one);
  c.ranks = 2;
  auto two = RunBenchmark(c);
  ASSERT_TRUE(two.ok()) << two.status();
  check(*two);
  c.ranks = 1;
  c.model = DummyModelSpec(FixtureDir("dsv4_bf16"), 7);
  auto v4 = RunBenchmark(c);
  ASSERT_TRUE(v4.ok()) << v4.status();
  check(*v4);
  c.mixed_prompt_length = -1;
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
}

// --kv-cache-blocks: a larger pool than the batches need is used as given and changes no token;
// fewer blocks than the batches need are refused.
TEST(BenchRunnerTest, KvCacheBlocksSetsThePoolSize) {
  BenchConfig c = SmallConfig();
  c.dtype = "float32";
  auto sized = RunBenchmark(c);
  ASSERT_TRUE(sized.ok()) << sized.status();
  ASSERT_GT(sized->kv_cache_blocks, 1);
  c.kv_cache_blocks = sized->kv_cache_blocks + 100;
  auto larger = RunBenchmark(c);
  ASSERT_TRUE(larger.ok()) << larger.status();
  EXPECT_EQ(larger->kv_cache_blocks, sized->kv_cache_blocks + 100);
  ASSERT_EQ(larger->decode.size(), 1u);
  EXPECT_EQ(larger->decode[0].seq0_tokens, sized->decode[0].seq0_tokens);
  EXPECT_NE(FormatBenchReport(c, *larger)
                .find(absl::StrCat(sized->kv_cache_blocks + 100, " blocks of 16")),
            std::string::npos);
  c.kv_cache_blocks = sized->kv_cache_blocks - 1;
  auto fewer = RunBenchmark(c);
  EXPECT_EQ(fewer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(fewer.status().message().find("--kv-cache-blocks"), std::string::npos)
      << fewer.status();
}

// --pause-before-decode-ms: the device idles before each decode run; the tokens are the same,
// the run takes at least the pauses longer, the report and JSON say so; negative is refused.
TEST(BenchRunnerTest, PauseBeforeDecodeChangesNoTokenAndIsReported) {
  BenchConfig c = SmallConfig();
  c.dtype = "float32";
  c.decode_num_requests = {3, 2};
  const BenchConfig plain_config = c;
  auto plain = RunBenchmark(plain_config);
  ASSERT_TRUE(plain.ok()) << plain.status();
  c.pause_before_decode_ms = 150;
  const absl::Time start = absl::Now();
  auto paused = RunBenchmark(c);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_GE(took, absl::Milliseconds(300));  // two decode runs, each after a 150 ms pause
  ASSERT_EQ(paused->decode.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(paused->decode[i].seq0_tokens, plain->decode[i].seq0_tokens) << i;
  }
  EXPECT_NE(FormatBenchReport(c, *paused).find("pause before each decode run: 150 ms"),
            std::string::npos);
  EXPECT_EQ(FormatBenchReport(plain_config, *plain).find("pause before"), std::string::npos);
  EXPECT_NE(FormatBenchJson(c, *paused).find("\"pause_before_decode_ms\": 150"), std::string::npos);
  c.pause_before_decode_ms = -1;
  auto negative = RunBenchmark(c);
  EXPECT_EQ(negative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(negative.status().message().find("--pause-before-decode-ms"), std::string::npos)
      << negative.status();
}

// The fixture: hidden 96, 3 layers of which 2 MoE, 8 routed experts top-2.
constexpr int64_t kMoeLayers = 2, kHidden = 96, kTopK = 2;

void ExpectSameTokensAsOneRank(const BenchConfig& base, bool time_all_to_all) {
  BenchConfig one = base;
  auto ref = RunBenchmark(one);
  ASSERT_TRUE(ref.ok()) << ref.status();
  EXPECT_EQ(ref->ranks, 1);
  for (const DecodeResult& d : ref->decode) {
    EXPECT_TRUE(d.per_rank.empty());
    EXPECT_DOUBLE_EQ(d.tokens_per_s_per_gpu, d.tokens_per_s);
  }
  for (int64_t ranks : {2, 4}) {
    SCOPED_TRACE(ranks);
    BenchConfig c = base;
    c.ranks = ranks;
    c.time_all_to_all = time_all_to_all;
    auto r = RunBenchmark(c);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->ranks, ranks);
    EXPECT_EQ(r->data_plane, "tcp");  // auto on the CPU
    ASSERT_EQ(r->decode.size(), ref->decode.size());
    for (size_t i = 0; i < r->decode.size(); ++i) {
      const DecodeResult& d = r->decode[i];
      SCOPED_TRACE(d.batch);
      EXPECT_EQ(d.seq0_tokens, ref->decode[i].seq0_tokens);
      EXPECT_EQ(d.steps, base.output_len - base.warmup);
      EXPECT_NEAR(d.tokens_per_s, ranks * d.batch / d.p50_seconds, 1e-9 * d.tokens_per_s);
      EXPECT_NEAR(d.tokens_per_s_per_gpu, d.tokens_per_s / ranks, 1e-9 * d.tokens_per_s);
      EXPECT_EQ(d.roofline_fraction, 0);  // no roofline on the CPU
      ASSERT_EQ(d.per_rank.size(), static_cast<size_t>(ranks));
      double bytes = 0;
      for (int64_t k = 0; k < ranks; ++k) {
        const RankDecodeResult& pr = d.per_rank[k];
        EXPECT_EQ(pr.rank, k);
        // Every rank's sequence 0 is the one-rank run's.
        EXPECT_EQ(pr.seq0_tokens, ref->decode[i].seq0_tokens) << "rank " << k;
        EXPECT_LE(pr.p50_seconds, d.p50_seconds);  // a step is the slowest rank's
        // Over TCP, per MoE layer: sizes + rows (Dispatch), rows (Combine).
        EXPECT_DOUBLE_EQ(pr.exchange_calls_per_step, 3.0 * kMoeLayers);
        // At most: every row of its own tokens out, (hidden + id) floats each, and back the
        // outputs of every rank's rows.
        EXPECT_LE(pr.exchange_bytes_per_step,
                  kMoeLayers * d.batch * kTopK * 4.0 * ((kHidden + 1) + ranks * kHidden));
        bytes += pr.exchange_bytes_per_step;
        if (time_all_to_all) {
          EXPECT_GT(pr.all_to_all_p50_seconds, 0);
          EXPECT_GE(pr.synced_step_p50_seconds, pr.all_to_all_p50_seconds);
        } else {
          EXPECT_EQ(pr.all_to_all_p50_seconds, -1);
        }
      }
      EXPECT_GT(bytes, 0);  // some rows always leave their rank (8 experts over 2 or 4 ranks)
      EXPECT_NEAR(d.exchange_bytes_per_step, bytes / ranks, 1e-6 * bytes);
      if (time_all_to_all) {
        EXPECT_GT(d.all_to_all_seconds_per_step, 0);
        EXPECT_GT(d.synced_step_p50_seconds, 0);
      } else {
        EXPECT_EQ(d.all_to_all_seconds_per_step, -1);
      }
    }
    const std::string report = FormatBenchReport(c, *r);
    EXPECT_NE(report.find("ranks: " + std::to_string(ranks) + " (expert parallel over tcp"),
              std::string::npos)
        << report;
    EXPECT_NE(report.find("tok/s per GPU"), std::string::npos) << report;
    EXPECT_NE(report.find("seq0_decode_tokens (batch 3, rank " + std::to_string(ranks - 1)),
              std::string::npos)
        << report;
    EXPECT_NE(report.find(time_all_to_all ? "s per step (" : "not timed (--time-all-to-all)"),
              std::string::npos)
        << report;
    const std::string json = FormatBenchJson(c, *r);
    EXPECT_NE(json.find("\"ranks\": " + std::to_string(ranks)), std::string::npos) << json;
    EXPECT_NE(json.find("\"per_rank\": [{\"rank\": 0"), std::string::npos) << json;
    ASSERT_EQ(BenchCsvRows(c, *r).size(), r->decode.size());
  }
}

TEST(BenchRunnerTest, ExpertParallelRanksDecodeTheOneRankTokens) {
  BenchConfig c = SmallConfig();
  c.decode_num_requests = {1, 3};
  ExpectSameTokensAsOneRank(c, /*time_all_to_all=*/false);
}

TEST(BenchRunnerTest, ExpertParallelRandomFillTimedAllToAll) {
  BenchConfig c = SmallConfig();
  c.decode_num_requests = {3};
  c.decode_fill = "random";
  c.prefill_batch_tokens = 0;
  ExpectSameTokensAsOneRank(c, /*time_all_to_all=*/true);
}

TEST(BenchRunnerTest, ExpertParallelRefusals) {
  auto refused = [](const BenchConfig& c, const std::string& words) {
    auto r = RunBenchmark(c);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status();
  };
  BenchConfig c = SmallConfig();
  c.ranks = 0;
  refused(c, "--ranks must be >= 1");
  c.ranks = 3;  // 8 experts
  refused(c, "--ranks 3 does not divide the model's 8 routed experts");
  c.ranks = 2;
  c.communicator = "nccl";  // needs cuda
  refused(c, "nccl");
  c.communicator = "carrier pigeon";
  refused(c, "carrier pigeon");
  c = SmallConfig();
  c.backend = "cuda";
  c.ranks = 2;
  c.cuda_device = 1000;  // no machine has these
  refused(c, "--ranks 2 from --cuda-device 1000 needs GPUs 1000..1001");
  // A dense model has no experts to split.
  const std::string dense = std::string(std::getenv("TEST_TMPDIR")) + "/dense.json";
  {
    std::ifstream in(FixtureDir() + "/config.json");
    std::stringstream text;
    text << in.rdbuf();
    std::string s = text.str();
    const std::string moe = "\"n_routed_experts\": 8";
    const size_t at = s.find(moe);
    ASSERT_NE(at, std::string::npos);
    s.replace(at, moe.size(), "\"n_routed_experts\": 0");
    std::ofstream(dense) << s;
  }
  c = SmallConfig();
  c.model = DummyModelSpec(dense, 7);
  c.ranks = 2;
  refused(c, "this model has none");
}

// The Ascend backend is a design only: the factory's refusal reaches the caller.
TEST(BenchRunnerTest, AscendBackendIsRefusedAsNotBuilt) {
  BenchConfig c = SmallConfig();
  c.backend = "ascend";
  auto r = RunBenchmark(c);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnimplemented) << r.status();
  EXPECT_NE(r.status().message().find("see ascend/README.md"), std::string::npos) << r.status();
}

// Seeded sampling in the decode steps: the device path and the host path (logits back, the
// host Sampler) produce the same tokens.
TEST(BenchRunnerTest, SampledDecodeSameOnDeviceAndHost) {
  BenchConfig c = SmallConfig();
  c.prefill_batch_tokens = 0;
  c.decode_temperature = 0.9f;
  c.decode_top_k = 20;
  c.decode_top_p = 0.9f;
  auto device = RunBenchmark(c);
  ASSERT_TRUE(device.ok()) << device.status();
  c.decode_sampling_on_host = true;
  auto host = RunBenchmark(c);
  ASSERT_TRUE(host.ok()) << host.status();
  ASSERT_EQ(device->decode.size(), 1u);
  ASSERT_EQ(host->decode.size(), 1u);
  EXPECT_EQ(device->decode[0].seq0_tokens, host->decode[0].seq0_tokens);
  EXPECT_EQ(device->decode[0].seq0_tokens.size(), 5u);
}

// docs/engine.md's speed-up model against numbers worked by hand.
TEST(BenchRunnerTest, SpeculativeSpeedupModel) {
  // K = 3, alpha 0.5: 1 + 0.5 + 0.25 + 0.125 = 1.875 tokens; alpha 0.8: 1 + 0.8 + 0.64 + 0.512.
  EXPECT_NEAR(SpeculativeExpectedTokens(0.5, 3), 1.875, 1e-12);
  EXPECT_NEAR(SpeculativeExpectedTokens(0.8, 3), 2.952, 1e-12);
  EXPECT_NEAR(SpeculativeExpectedTokens(0.9, 1), 1.9, 1e-12);
  EXPECT_EQ(SpeculativeExpectedTokens(0.0, 3), 1.0);
  EXPECT_EQ(SpeculativeExpectedTokens(1.0, 3), 4.0);
  // decode 10 ms, verify 12 ms, draft 1 ms: 1.875 x 10 / (12 + 3) = 1.25; 2.952 x 10 / 15.
  EXPECT_NEAR(SpeculativeSpeedup(0.5, 3, 0.010, 0.012, 0.001), 1.25, 1e-12);
  EXPECT_NEAR(SpeculativeSpeedup(0.8, 3, 0.010, 0.012, 0.001), 1.968, 1e-12);
  // One draft at alpha 0.6 with verify = 1.5 x decode and a free draft head: 1.6 / 1.5.
  EXPECT_NEAR(SpeculativeSpeedup(0.6, 1, 0.02, 0.03, 0.0), 1.6 / 1.5, 1e-12);
}

// --speculative-tokens on the CPU with the fixture's config (one MTP module, generated weights):
// every request count gets its decode, verify and draft times at the position its decode steps
// reached, the report and JSON carry them with the speed-up model, and the draft head loaded
// alongside changes none of the decode's greedy tokens.
TEST(BenchRunnerTest, SpeculativeCostOnCpu) {
  BenchConfig c = SmallConfig();
  c.dtype = "float32";
  c.decode_num_requests = {1, 3};
  auto plain = RunBenchmark(c);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->speculative.empty());
  c.speculative_tokens = 2;
  auto r = RunBenchmark(c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->decode.size(), 2u);
  ASSERT_EQ(r->speculative.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(r->decode[i].seq0_tokens, plain->decode[i].seq0_tokens) << i;
    const SpeculativeResult& sp = r->speculative[i];
    EXPECT_EQ(sp.batch, c.decode_num_requests[i]);
    EXPECT_EQ(sp.drafts, 2);
    EXPECT_EQ(sp.position, c.context_length + c.output_len);
    EXPECT_EQ(sp.calls, c.output_len - c.warmup);
    for (double v : {sp.decode_p50_seconds, sp.verify_p50_seconds, sp.draft_p50_seconds}) {
      EXPECT_TRUE(std::isfinite(v) && v > 0) << v;
    }
    EXPECT_LE(sp.decode_p50_seconds, sp.decode_p99_seconds);
    EXPECT_LE(sp.verify_p50_seconds, sp.verify_p99_seconds);
    EXPECT_LE(sp.draft_p50_seconds, sp.draft_p99_seconds);
  }
  const std::string report = FormatBenchReport(c, *r);
  EXPECT_NE(report.find("speculative: batch 3, K 2, position 25, 4 timed calls each: decode step"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("verify step (3 x 3 rows"), std::string::npos) << report;
  EXPECT_NE(report.find("at alpha 0.5: "), std::string::npos) << report;
  EXPECT_NE(report.find(", 0.9: "), std::string::npos) << report;
  const std::string json = FormatBenchJson(c, *r);
  EXPECT_NE(json.find("\"speculative\": [{\"requests\": 1, \"drafts\": 2, \"position\": 25, "),
            std::string::npos)
      << json;
  EXPECT_NE(json.find("{\"alpha\": 0.9, \"speedup\": "), std::string::npos) << json;
  EXPECT_NE(FormatBenchJson(c, *plain).find("\"speculative\": [], \"mixed\": []}"),
            std::string::npos);
}

TEST(BenchRunnerTest, SpeculativeRefusals) {
  BenchConfig c = SmallConfig();
  c.speculative_tokens = -1;
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  c.speculative_tokens = 1;
  c.ranks = 2;
  EXPECT_EQ(RunBenchmark(c).status().code(), absl::StatusCode::kInvalidArgument);
  // A config without MTP layers (the V4 fixture has none): nothing to draft with.
  c = SmallConfig();
  c.model = DummyModelSpec(FixtureDir("dsv4_bf16"), 7);
  c.speculative_tokens = 1;
  absl::Status st = RunBenchmark(c).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_NE(st.message().find("MTP"), absl::string_view::npos) << st;
}

TEST(BenchRunnerTest, FlagHelpers) {
  std::vector<int64_t> counts;
  EXPECT_TRUE(ParseRequestCounts("64", &counts));
  EXPECT_EQ(counts, std::vector<int64_t>({64}));
  EXPECT_TRUE(ParseRequestCounts("1,128", &counts));
  EXPECT_EQ(counts, std::vector<int64_t>({1, 128}));
  EXPECT_FALSE(ParseRequestCounts("1,,2", &counts));
  EXPECT_FALSE(ParseRequestCounts("many", &counts));
  EXPECT_EQ(DummyModelSpec("/m/dir", 3), "dummy:/m/dir/config.json@3");
  EXPECT_EQ(DummyModelSpec("/m/c.json", 0), "dummy:/m/c.json@0");
  EXPECT_EQ(DummyModelSpec("dummy:/m/c.json@5", 0), "dummy:/m/c.json@5");
  BenchConfig c;
  EXPECT_TRUE(ParseDecodeSampling("", &c));
  EXPECT_EQ(c.decode_temperature, 0.0f);
  EXPECT_TRUE(ParseDecodeSampling("0.8,50,0.95", &c));
  EXPECT_EQ(c.decode_temperature, 0.8f);
  EXPECT_EQ(c.decode_top_k, 50);
  EXPECT_EQ(c.decode_top_p, 0.95f);
  EXPECT_FALSE(ParseDecodeSampling("0.8,50", &c));
  EXPECT_FALSE(ParseDecodeSampling("0.8,50,1.5", &c));
  EXPECT_FALSE(ParseDecodeSampling("-1,0,1", &c));
  EXPECT_FALSE(ParseDecodeSampling("hot,0,1", &c));
  EXPECT_EQ(BytesPerValue("bfloat16").value(), 2);
  EXPECT_EQ(BytesPerValue("float32").value(), 4);
  EXPECT_EQ(BytesPerValue(kBenchMxfp4).value(), 0.5 + 1.0 / 32);  // the experts' e2m1 + scale
  EXPECT_FALSE(BytesPerValue("int4").ok());
}

}  // namespace
}  // namespace deepinfer
