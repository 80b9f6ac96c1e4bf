// ParityChecks: prompt logits error and teacher-forced greedy agreement.
#include "tests/parity/parity_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include "gtest/gtest.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

int32_t Argmax(const std::vector<float>& l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

constexpr int32_t kBlocks = 256;
constexpr int32_t kBlockSize = 16;

}  // namespace

absl::StatusOr<ParityModel> LoadParityModel(const std::string& fixture, Backend* backend,
                                            const std::string& kv_cache_dtype,
                                            const LoadOptions& load) {
  ParityModel m;
  m.fx = LoadFixture(fixture);
  if (m.fx.prompts.empty()) return absl::NotFoundError("fixture " + fixture + " has no prompts");
  auto model = LoadModel(m.fx.dir, backend, load);
  if (!model.ok()) return model.status();
  m.model = std::move(*model);
  if (m.model->config().vocab_size != m.fx.vocab) {
    return absl::FailedPreconditionError("fixture " + fixture + ": model and logits vocab differ");
  }
  auto cache_dtype = ResolveKvCacheDType(kv_cache_dtype, backend->weight_dtype());
  if (!cache_dtype.ok()) return cache_dtype.status();
  absl::StatusOr<KvCacheSpec> spec = m.model->CacheSpec().WithDType(*cache_dtype);
  if (!spec.ok()) return spec.status();
  auto pool = KvBlockPool::Create(backend, {*spec, kBlocks, kBlockSize});
  if (!pool.ok()) return pool.status();
  m.pool = std::move(*pool);
  return m;
}

int64_t FixtureLogitsError::WithinCount(double tolerance) const {
  int64_t n = 0;
  for (double r : position_rel) n += r <= tolerance;
  return n;
}

absl::StatusOr<FixtureLogitsError> AllPromptsLogitsError(const ParityModel& m) {
  FixtureLogitsError all;
  double sum_sq = 0;
  for (const FixturePrompt& p : m.fx.prompts) {
    auto e = PromptLogitsError(m.model.get(), m.pool.get(), m.fx, p);
    if (!e.ok()) return e.status();
    all.prompt_max_rel.push_back(e->max_rel);
    all.max_rel = std::max(all.max_rel, e->max_rel);
    for (double r : e->position_rel) {
      all.position_rel.push_back(r);
      sum_sq += r * r;
    }
  }
  all.rms = std::sqrt(sum_sq / static_cast<double>(all.position_rel.size()));
  return all;
}

absl::StatusOr<TeacherForcedResult> AllPromptsTeacherForced(const ParityModel& m) {
  TeacherForcedResult sum;
  for (const FixturePrompt& p : m.fx.prompts) {
    auto r = TeacherForcedGreedy(m.model.get(), m.pool.get(), p);
    if (!r.ok()) return r.status();
    sum.matches += r->matches;
    sum.positions += r->positions;
  }
  return sum;
}

absl::StatusOr<std::vector<std::vector<int32_t>>> GreedyContinuations(const ParityModel& m,
                                                                      bool batched) {
  const std::vector<FixturePrompt>& prompts = m.fx.prompts;
  std::vector<SequenceStep> seqs;
  for (const FixturePrompt& p : prompts) {
    auto blocks =
        m.pool->Allocate(m.pool->BlocksFor(static_cast<int64_t>(p.ids.size() + p.greedy.size())));
    if (!blocks.ok()) return blocks.status();
    SequenceStep s;
    s.tokens = p.ids;
    s.block_table = *blocks;
    seqs.push_back(std::move(s));
  }
  std::vector<std::vector<int32_t>> got(prompts.size());
  absl::Status st;
  // Runs `group` (indices into seqs) for `steps` steps, feeding back each argmax.
  auto run = [&](const std::vector<size_t>& group, size_t steps) {
    for (size_t step = 0; step < steps && st.ok(); ++step) {
      std::vector<SequenceStep> batch;
      for (size_t i : group) batch.push_back(seqs[i]);
      auto r = m.model->Step(batch, m.pool.get());
      if (!r.ok()) {
        st = r.status();
        return;
      }
      for (size_t j = 0; j < group.size(); ++j) {
        SequenceStep& s = seqs[group[j]];
        got[group[j]].push_back(Argmax(r->logits[j]));
        s.position_offset += static_cast<int64_t>(s.tokens.size());
        s.tokens = {got[group[j]].back()};
      }
    }
  };
  if (batched) {
    std::vector<size_t> all(prompts.size());
    for (size_t i = 0; i < all.size(); ++i) all[i] = i;
    run(all, prompts.empty() ? 0 : prompts[0].greedy.size());
  } else {
    for (size_t i = 0; i < prompts.size(); ++i) run({i}, prompts[i].greedy.size());
  }
  for (const SequenceStep& s : seqs) {
    if (absl::Status f = m.pool->Free(s.block_table); st.ok()) st = f;
  }
  if (!st.ok()) return st;
  return got;
}

absl::StatusOr<LogitsError> PromptLogitsError(CausalLm* model, KvBlockPool* pool, const Fixture& fx,
                                              const FixturePrompt& prompt) {
  auto blocks = pool->Allocate(pool->BlocksFor(static_cast<int64_t>(prompt.ids.size())));
  if (!blocks.ok()) return blocks.status();
  SequenceStep s;
  s.tokens = prompt.ids;
  s.block_table = *blocks;
  s.all_logits = true;
  auto r = model->Step({s}, pool);
  if (absl::Status st = pool->Free(*blocks); !st.ok()) return st;
  if (!r.ok()) return r.status();
  const std::vector<float>& ours = r->logits[0];
  if (ours.size() != prompt.ids.size() * fx.vocab) {
    return absl::InternalError("logits of the wrong size");
  }
  const float* hf = fx.logits.data() + prompt.logits_row_offset * fx.vocab;
  double max_ref = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    max_ref = std::max(max_ref, std::abs(static_cast<double>(hf[i])));
  }
  LogitsError e;
  for (size_t t = 0; t < prompt.ids.size(); ++t) {
    double diff = 0;
    for (int64_t v = 0; v < fx.vocab; ++v) {
      const size_t i = t * fx.vocab + v;
      diff = std::max(diff, std::abs(static_cast<double>(ours[i]) - hf[i]));
    }
    e.position_rel.push_back(diff / max_ref);
    e.max_rel = std::max(e.max_rel, diff / max_ref);
  }
  return e;
}

absl::StatusOr<TeacherForcedResult> TeacherForcedGreedy(CausalLm* model, KvBlockPool* pool,
                                                        const FixturePrompt& prompt) {
  const int64_t total = static_cast<int64_t>(prompt.ids.size() + prompt.greedy.size());
  auto blocks = pool->Allocate(pool->BlocksFor(total));
  if (!blocks.ok()) return blocks.status();
  SequenceStep s;
  s.tokens = prompt.ids;
  s.block_table = *blocks;
  TeacherForcedResult result;
  absl::Status st;
  for (size_t i = 0; i < prompt.greedy.size() && st.ok(); ++i) {
    auto r = model->Step({s}, pool);
    if (!r.ok()) {
      st = r.status();
      break;
    }
    result.matches += Argmax(r->logits[0]) == prompt.greedy[i];
    ++result.positions;
    s.position_offset += static_cast<int64_t>(s.tokens.size());
    s.tokens = {prompt.greedy[i]};
  }
  if (absl::Status f = pool->Free(*blocks); st.ok()) st = f;
  if (!st.ok()) return st;
  return result;
}

void ExpectBf16LogitsWithinTolerance(const FixtureLogitsError& e, const std::string& label,
                                     const std::string& fixture) {
  const int64_t positions = static_cast<int64_t>(e.position_rel.size());
  const int64_t within = e.WithinCount(kBf16Tolerance);
  std::printf(
      "[bf16-parity] %s %s ours: max rel logit error vs HF float32 %.3e, rms over positions "
      "%.3e, %lld of %lld positions within %.0e\n",
      label.c_str(), fixture.c_str(), e.max_rel, e.rms, static_cast<long long>(within),
      static_cast<long long>(positions), kBf16Tolerance);
  EXPECT_GE(within, kBf16PositionsWithin * positions) << label << " " << fixture;
}

CacheDTypeRun MeasureCacheDType(const std::string& fixture, Backend* backend,
                                const std::string& cache_dtype, const std::string& label) {
  CacheDTypeRun run;
  auto m = LoadParityModel(fixture, backend, cache_dtype);
  EXPECT_TRUE(m.ok()) << m.status();
  if (!m.ok()) return run;
  auto e = AllPromptsLogitsError(*m);
  EXPECT_TRUE(e.ok()) << e.status();
  if (e.ok()) run.logits = *e;
  auto r = AllPromptsTeacherForced(*m);
  EXPECT_TRUE(r.ok()) << r.status();
  if (r.ok()) run.greedy = *r;
  std::vector<double> sorted = run.logits.position_rel;
  std::sort(sorted.begin(), sorted.end());
  if (!sorted.empty()) {
    run.median = sorted[sorted.size() / 2];
    run.p90 = sorted[sorted.size() * 9 / 10];
  }
  std::printf(
      "[fp8-cache-parity] %s %s cache=%s logits median=%.3e p90=%.3e max=%.3e rms=%.3e, "
      "greedy agreement %lld / %lld\n",
      label.c_str(), fixture.c_str(), cache_dtype.c_str(), run.median, run.p90, run.logits.max_rel,
      run.logits.rms, static_cast<long long>(run.greedy.matches),
      static_cast<long long>(run.greedy.positions));
  return run;
}

void ExpectFp8CacheWithinBounds(const CacheDTypeRun& bf16, const CacheDTypeRun& fp8) {
  ASSERT_FALSE(fp8.logits.position_rel.empty());
  EXPECT_LE(fp8.median, 2 * kFp8CacheRoundingRatio * bf16.median);
  EXPECT_GE(fp8.median, kFp8CacheRoundingRatio / 4 * bf16.median);
  EXPECT_GE(fp8.logits.WithinCount(kFp8CacheTolerance),
            kBf16PositionsWithin * fp8.logits.position_rel.size());
  EXPECT_GE(fp8.greedy.matches, kBf16GreedyAgreement * fp8.greedy.positions);
}

void PrintGreedyAgreement(const TeacherForcedResult& r, const std::string& label,
                          const std::string& fixture) {
  std::printf("[bf16-parity] %s %s greedy agreement %lld / %lld\n", label.c_str(), fixture.c_str(),
              static_cast<long long>(r.matches), static_cast<long long>(r.positions));
}

}  // namespace deepinfer
