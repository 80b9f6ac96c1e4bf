// DeepSeek-V4 with its routed experts kept MXFP4 on the CUDA backend (`--dtype mxfp4`: bf16
// weights, LoadOptions::mxfp4_experts) against the CPU backend running the same model in fp32 on
// the same MXFP4 experts: the reference's source (Mxfp4ExpertValuesSource) hands it every
// routed-expert tensor as MXFP4 bytes and scales (the checkpoint's as stored, else quantised with
// the loader's quantiser) dequantised to fp32, the same tensors a `--dtype mxfp4` load takes
// (mxfp4_expert_values_source_test), so the experts' values are the same in both runs and what is
// left between them is the GPU's bf16 (the other matrices, the activations into and between the
// expert GEMMs).
// Cases: the dsv4_bf16 fixture's checkpoint (fused bf16 experts, quantised at load by
// WeightLoader::LoadFusedMxfp4Experts), its config with dummy weights (per expert,
// WeightLoader::LoadMxfp4Mlp), and the dsv4_mix checkpoint, whose experts are MXFP4 as a V4
// release stores them (kept as stored). Rows: one prefill of each of dsv4_bf16's prompts
// (decode-sized expert batches, RoutedExpertsMxfp4's MMA path), the same one token a step
// (decode), and one 300-token prefill (above kMxfp4MaxDeviceTokens: the experts widened to bf16
// for cuBLAS). dsv4_mix's indexer (4 heads) leaves many scores exactly 0, whose ties the GPU and
// the CPU break differently (kernels/v4/indexer_topk.h; cuda_v4_parity_test.cc prints its
// figures too): there its figures are printed and only finite logits asserted.
//
// Bounds. A row's error is max |logit - reference| / max |reference logit|. The CPU backend in
// bf16 on the same source makes the same kind of error (bf16 weights and activations, the
// experts' MXFP4 values exact in bf16: at most 3 significant bits), so it calibrates: the GPU's
// median and 90th-percentile row errors within twice the CPU bf16 run's (as CudaV4Bf16PrefillTest
// bounds the bf16 prefill path), and its argmax the reference's on at least as many rows as the
// CPU bf16 run less 5% of the rows. Greedy tokens agree on most rows: at least 80% outright (the
// CPU backend's bf16 V4 agrees with HF float32 on 68 / 72 and 69 / 72 teacher-forced positions,
// 94%, cuda_v4_parity_test.cc; 80% leaves room for the random prompt's and dummy weights' flatter
// logits, which the relative bound above already covers).
// The GPU runs twice: with bf16 activations into the experts everywhere (W4A16,
// CudaTuning::mxfp4_w4a8_min_tokens 0), which the bounds above are for, and with the default
// tuning (W4A8, e4m3 activations, where a step routes 3-128 tokens: the prompts' one-step
// prefills), whose figures are printed beside them and of which only finite logits and the 80%
// greedy floor are asserted (e4m3 activations are within 2^-4, not bf16's 2^-9).
// Decode graphs: CudaV4Mxfp4GraphTest below. Skips itself without a GPU.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "tests/parity/hf_fixture.h"
#include "tests/parity/mxfp4_expert_values_source.h"
#include "tests/parity/v4_parity_runs.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

class CudaV4Mxfp4Test : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaV4Mxfp4Test, LogitsMatchTheCpuOnTheSameMxfp4Experts) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Fixture fx = LoadFixture("dsv4_bf16");
  const std::string model = GetParam() == "dummy_dsv4_bf16" ? "dummy:" + fx.dir + "/config.json@5"
                                                            : LoadFixture(GetParam()).dir;
  const bool asserted = GetParam() != "dsv4_mix";
  ModelConfig config;
  auto source = OpenWeightSource(model, &config);
  ASSERT_TRUE(source.ok()) << source.status();
  Mxfp4ExpertValuesSource values(source->get());

  // The rows: the fixture's prompts (ids below either vocabulary), and 300 tokens.
  std::vector<std::vector<int32_t>> prompts;
  for (const FixturePrompt& p : fx.prompts) {
    std::vector<int32_t> ids = CoveredIds(p);
    for (int32_t& id : ids) id %= static_cast<int32_t>(config.vocab_size);
    prompts.push_back(ids);
  }
  std::vector<int32_t> long_prompt(300);
  std::mt19937 gen(11);
  std::uniform_int_distribution<int32_t> token(2, static_cast<int32_t>(config.vocab_size) - 1);
  for (int32_t& id : long_prompt) id = token(gen);
  ASSERT_GT(static_cast<int64_t>(long_prompt.size()), CudaBackend::kMxfp4MaxDeviceTokens);

  // Every row of every run: each prompt in one step and a token a step, then the long prompt.
  auto run = [&](Backend* backend, WeightSource* src,
                 const LoadOptions& load) -> absl::StatusOr<std::vector<float>> {
    auto m = BuildModel(config, src, backend, load);
    if (!m.ok()) return m.status();
    auto dtype = ResolveKvCacheDType("auto", backend->weight_dtype());
    if (!dtype.ok()) return dtype.status();
    auto spec = (*m)->CacheSpec().WithDType(*dtype);
    if (!spec.ok()) return spec.status();
    auto pool = KvBlockPool::Create(backend, {*spec, 64, 16});
    if (!pool.ok()) return pool.status();
    std::vector<float> all;
    for (const std::vector<int32_t>& ids : prompts) {
      for (int64_t chunk : {0, 1}) {
        auto logits = RunInSteps(m->get(), pool->get(), ids, chunk);
        if (!logits.ok()) return logits.status();
        all.insert(all.end(), logits->begin(), logits->end());
      }
    }
    auto logits = RunInSteps(m->get(), pool->get(), long_prompt, 0);
    if (!logits.ok()) return logits.status();
    all.insert(all.end(), logits->begin(), logits->end());
    return all;
  };
  // W4A16: bf16 activations into the experts at every size (CudaTuning::mxfp4_w4a8_min_tokens
  // 0), the run the bounds below are for.
  CudaTuning w4a16;
  w4a16.mxfp4_w4a8_min_tokens = 0;
  auto gpu = CudaBackend::Create(0, WeightDType::kBFloat16, w4a16);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  LoadOptions mxfp4;
  mxfp4.mxfp4_experts = true;
  // The GPU model reads the source itself: its experts become MXFP4 at load.
  auto got = run(gpu->get(), source->get(), mxfp4);
  ASSERT_TRUE(got.ok()) << got.status();
  // The default tuning: W4A8 (e4m3 activations) where a step routes 3-128 tokens.
  auto gpu8 = CudaBackend::Create(0, WeightDType::kBFloat16);
  ASSERT_TRUE(gpu8.ok()) << gpu8.status();
  auto got8 = run(gpu8->get(), source->get(), mxfp4);
  ASSERT_TRUE(got8.ok()) << got8.status();
  ASSERT_EQ(got8->size(), got->size());
  CpuBackend cpu32(4, WeightDType::kFloat32);
  auto want = run(&cpu32, &values, LoadOptions());
  ASSERT_TRUE(want.ok()) << want.status();
  CpuBackend cpu16(4, WeightDType::kBFloat16);
  auto bf16 = run(&cpu16, &values, LoadOptions());
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  ASSERT_EQ(got->size(), want->size());
  ASSERT_EQ(bf16->size(), want->size());

  const int64_t vocab = config.vocab_size;
  const LogitRowErrors gpu_err = RowErrors(*got, *want, vocab),
                       w4a8_err = RowErrors(*got8, *want, vocab),
                       cpu_err = RowErrors(*bf16, *want, vocab);
  EXPECT_EQ(gpu_err.nonfinite, 0);
  EXPECT_EQ(w4a8_err.nonfinite, 0);
  EXPECT_EQ(cpu_err.nonfinite, 0);
  for (const auto& [name, e] : {std::pair<const char*, LogitRowErrors>{"cuda mxfp4 w4a16", gpu_err},
                                std::pair<const char*, LogitRowErrors>{
                                    "cuda mxfp4 default (w4a8 at 3-128 tokens)", w4a8_err},
                                std::pair<const char*, LogitRowErrors>{"cpu bf16", cpu_err}}) {
    std::printf(
        "[v4-mxfp4] %s %s, %lld rows, against the CPU in fp32 on the same MXFP4 experts: rows' "
        "rel error median %.3e, p90 %.3e, max %.3e; argmax equal on %lld rows\n",
        GetParam().c_str(), name, static_cast<long long>(e.rows), e.median, e.p90, e.max,
        static_cast<long long>(e.argmax_match));
  }
  if (!asserted) return;
  EXPECT_LE(gpu_err.median, 2 * cpu_err.median);
  EXPECT_LE(gpu_err.p90, 2 * cpu_err.p90);
  EXPECT_GE(gpu_err.argmax_match, cpu_err.argmax_match - gpu_err.rows / 20);
  EXPECT_GE(gpu_err.argmax_match, gpu_err.rows * 80 / 100);
  // W4A8: only the greedy floor (its relative errors are printed above, not bounded).
  EXPECT_GE(w4a8_err.argmax_match, w4a8_err.rows * 80 / 100);
}

// Decode steps replayed from CUDA graphs with MXFP4 experts (RoutedExpertsMxfp4 recorded, the
// routing on the device): dsv4_bf16's config with dummy weights, 40 prompts, then batch sizes 1 3
// 5 40 17 2 twice (padded to the buckets): every step takes the graph path, with tokens and
// logprobs bit for bit those of the same padded steps run eagerly (DecodeGraphOptions::replay
// false), as decode_graph_gpu_test asserts for bf16 experts.
TEST(CudaV4Mxfp4GraphTest, ReplayedStepsEqualPaddedEagerSteps) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const std::string model = "dummy:" + LoadFixture("dsv4_bf16").dir + "/config.json@11";
  const std::vector<int64_t> schedule = {1, 3, 5, 40, 17, 2, 1, 3, 5, 40, 17, 2};
  constexpr int64_t kSeqs = 40;
  struct Run {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    int64_t graph_steps = 0;
  };
  auto run = [&](Backend* backend, bool replay) -> absl::StatusOr<Run> {
    LoadOptions load;
    load.mxfp4_experts = true;
    auto m = LoadModel(model, backend, load);
    if (!m.ok()) return m.status();
    DecodeGraphOptions graphs;
    graphs.max_batch = 48;
    graphs.replay = replay;
    (*m)->SetDecodeGraphOptions(graphs);
    const int64_t vocab = (*m)->config().vocab_size;
    KvBlockPoolOptions o{(*m)->CacheSpec(), 400, 16};
    o.max_sequences = kSeqs;
    auto pool = KvBlockPool::Create(backend, o);
    if (!pool.ok()) return pool.status();
    std::vector<SequenceStep> seqs(kSeqs);
    for (int64_t i = 0; i < kSeqs; ++i) {
      const int64_t len = 1 + (i * 37) % 61;
      for (int64_t j = 0; j < len; ++j) {
        seqs[i].tokens.push_back(static_cast<int32_t>((i * 131 + j * 7 + 3) % vocab));
      }
      auto b = (*pool)->Allocate((*pool)->BlocksFor(len + static_cast<int64_t>(schedule.size())));
      if (!b.ok()) return b.status();
      seqs[i].block_table = std::move(*b);
      seqs[i].sampling = SamplingParams{};
      seqs[i].return_logits = false;
    }
    auto prefill = (*m)->Step(seqs, pool->get());
    if (!prefill.ok()) return prefill.status();
    for (int64_t i = 0; i < kSeqs; ++i) {
      seqs[i].position_offset = static_cast<int64_t>(seqs[i].tokens.size());
      seqs[i].tokens = {prefill->sampled[i].token};
    }
    Run r;
    for (int64_t n : schedule) {
      std::vector<SequenceStep> batch(seqs.begin(), seqs.begin() + n);
      auto out = (*m)->Step(batch, pool->get());
      if (!out.ok()) return out.status();
      for (int64_t i = 0; i < n; ++i) {
        r.tokens.push_back(out->sampled[i].token);
        r.logprobs.push_back(out->sampled[i].logprob);
        seqs[i].position_offset += 1;
        seqs[i].tokens = {out->sampled[i].token};
      }
    }
    r.graph_steps = (*m)->decode_graph_steps();
    return r;
  };
  auto gpu = CudaBackend::Create(0, WeightDType::kBFloat16);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto replayed = run(gpu->get(), true);
  ASSERT_TRUE(replayed.ok()) << replayed.status();
  auto eager = run(gpu->get(), false);
  ASSERT_TRUE(eager.ok()) << eager.status();
  EXPECT_EQ(replayed->graph_steps, static_cast<int64_t>(schedule.size()));
  EXPECT_EQ(eager->graph_steps, static_cast<int64_t>(schedule.size()));
  EXPECT_EQ(replayed->tokens, eager->tokens);
  ASSERT_EQ(replayed->logprobs.size(), eager->logprobs.size());
  EXPECT_EQ(std::memcmp(replayed->logprobs.data(), eager->logprobs.data(),
                        eager->logprobs.size() * sizeof(float)),
            0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaV4Mxfp4Test,
                         ::testing::Values("dsv4_bf16", "dummy_dsv4_bf16", "dsv4_mix"));

}  // namespace
}  // namespace deepinfer
