// ParityChecks: the measurements the parity tests make of a model against an HF fixture, shared
// by the CPU and CUDA tests and by both weight dtypes: the prompt logits' error relative to HF
// float32, and (for bf16, where an exact greedy continuation is not expected) how many of HF's
// greedy tokens the model predicts when fed HF's own continuation (teacher forcing), which
// scores every position on its own instead of stopping at the first divergence.
#ifndef DEEPINFER_TESTS_PARITY_PARITY_CHECKS_H_
#define DEEPINFER_TESTS_PARITY_PARITY_CHECKS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/parity/hf_fixture.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/causal_lm.h"
#include "worker/model/model_weights.h"

namespace deepinfer {

// bf16 keeps 8 significant bits: each GEMM operand is off by up to u = 2^-9 ~ 2e-3 relative
// (half that on average), so a GEMM output is off by ~u relative to its inputs' scale. The
// fixtures chain ~10 GEMMs per layer over 3 layers with fp32 residuals and norms between them,
// and the errors add roughly in quadrature: a position's logits are measured within 1e-2 of HF
// float32's (relative to the max |logit|), so kBf16Tolerance = 2e-2 ~ 10u bounds them with a
// margin while a wrong layout or an unrounded operand on one side would still be far off.
//
// A few positions are far off (0.2 .. 0.65): isolated positions, their neighbours fine, as when
// a token's top-k experts change because two router scores are closer than the bf16 noise
// (random-weight fixtures are full of near ties), which no rounding bound covers. So the bound
// holds for most positions (kBf16PositionsWithin), and the worst position is reported.
inline constexpr double kBf16Tolerance = 2e-2;
inline constexpr double kBf16PositionsWithin = 0.9;
// HF's greedy tokens come from an fp32 model; where two logits are closer than the bf16 error
// our argmax may pick the other one.
inline constexpr double kBf16GreedyAgreement = 0.9;

struct LogitsError {
  double max_rel = 0;                // max |ours - HF| / max |HF| over every position
  std::vector<double> position_rel;  // the same per prompt position (same denominator)
};

// Our logits at every position of the prompt (one prefill) against HF's.
absl::StatusOr<LogitsError> PromptLogitsError(CausalLm* model, KvBlockPool* pool, const Fixture& fx,
                                              const FixturePrompt& prompt);

struct TeacherForcedResult {
  int64_t matches = 0;    // positions where our argmax is HF's greedy token
  int64_t positions = 0;  // prompt.greedy.size()
};

// Prefills the prompt, then decodes HF's greedy tokens one per step through the paged cache;
// at each step our argmax is compared with HF's next greedy token. Frees its blocks.
absl::StatusOr<TeacherForcedResult> TeacherForcedGreedy(CausalLm* model, KvBlockPool* pool,
                                                        const FixturePrompt& prompt);

// A fixture with the model loaded from it on `backend` and a KV cache for its prompts, whose
// entries are kv_cache_dtype ("auto": the backend's weight dtype, as the engine's default).
struct ParityModel {
  Fixture fx;
  std::unique_ptr<CausalLm> model;
  std::unique_ptr<KvBlockPool> pool;
};
absl::StatusOr<ParityModel> LoadParityModel(const std::string& fixture, Backend* backend,
                                            const std::string& kv_cache_dtype = "auto",
                                            const LoadOptions& load = {});

// PromptLogitsError over every prompt of the fixture.
struct FixtureLogitsError {
  std::vector<double> prompt_max_rel;  // per prompt
  std::vector<double> position_rel;    // every position of every prompt
  double max_rel = 0;
  double rms = 0;  // over positions
  int64_t WithinCount(double tolerance) const;
};
absl::StatusOr<FixtureLogitsError> AllPromptsLogitsError(const ParityModel& m);

// TeacherForcedGreedy summed over every prompt of the fixture.
absl::StatusOr<TeacherForcedResult> AllPromptsTeacherForced(const ParityModel& m);

// The bf16 logit check shared by the CPU and CUDA parity tests: at least kBf16PositionsWithin of
// all prompt positions within kBf16Tolerance of HF float32 (gtest expectations), the figures
// printed with `label` ("cpu", "cuda bf16-cache", ...) and the fixture's name.
void ExpectBf16LogitsWithinTolerance(const FixtureLogitsError& e, const std::string& label,
                                     const std::string& fixture);
// Prints the teacher-forced greedy agreement ("[bf16-parity] LABEL FIXTURE greedy agreement M /
// N").
void PrintGreedyAgreement(const TeacherForcedResult& r, const std::string& label,
                          const std::string& fixture);

// The FP8 latent cache (--kv-cache-dtype fp8, worker/backend/fp8_latent_entry.h) against the
// bf16 cache, both under fp32 weights so that the cache is the only rounding. e4m3 keeps 4
// significant bits against bf16's 8: its rounding of a latent value is up to 2^-4 relative
// against 2^-8, 16 times as much (the per-token scale maps the token's amax onto 448, so every
// latent value but the smallest is in e4m3's normal range, and those have a smaller absolute
// error still). The typical (median) position's logit error should grow by about that ratio
// over the bf16 cache's (measured 14-16x on the CPU): it must stay within twice the ratio, and
// above a quarter of it (the quantisation shows). At kBf16PositionsWithin of the positions the
// error stays within the bf16 bound scaled by the same ratio (the rest are near-tied expert
// choices that flip, as with bf16), and HF's greedy token is predicted at
// kBf16GreedyAgreement of the positions (teacher forced), as with bf16 weights.
inline constexpr double kFp8CacheRoundingRatio = 16.0;
inline constexpr double kFp8CacheTolerance = kFp8CacheRoundingRatio * kBf16Tolerance;

// One fixture's figures with one cache dtype.
struct CacheDTypeRun {
  FixtureLogitsError logits;
  TeacherForcedResult greedy;
  double median = 0;  // of logits.position_rel
  double p90 = 0;
};
// Loads the fixture on `backend` with the cache in `cache_dtype`, measures its prompt logits'
// error and teacher-forced greedy agreement and prints them ("[fp8-cache-parity] LABEL FIXTURE
// cache=DTYPE ..."). Test failures (gtest) where loading or a step fails.
CacheDTypeRun MeasureCacheDType(const std::string& fixture, Backend* backend,
                                const std::string& cache_dtype, const std::string& label);
// The bounds above (gtest expectations) on a fixture's fp8-cache run against its bf16-cache run.
void ExpectFp8CacheWithinBounds(const CacheDTypeRun& bf16, const CacheDTypeRun& fp8);

// Greedy continuations of every prompt (prefill, then one token per step through the paged
// cache, as many tokens as HF's greedy continuation): each prompt alone, or all in one batch.
absl::StatusOr<std::vector<std::vector<int32_t>>> GreedyContinuations(const ParityModel& m,
                                                                      bool batched);

}  // namespace deepinfer

#endif  // DEEPINFER_TESTS_PARITY_PARITY_CHECKS_H_
