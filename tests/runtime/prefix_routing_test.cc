// Prefix-aware routing through `deepinfer run` on two ranks (real coordinator and worker
// processes, CPU backend, the HF-made fixture tests/fixtures/dsv3_qlora_rope; docs/kv-cache.md,
// "Routing"): a job of 4 system prompts x 6 questions gives the same tokens and logprobs on two
// ranks with routing, two ranks without and one rank; with routing, every request but the
// first of its system prompt finds the system prompt cached (the others wait for the first's
// prefill and follow it to its rank), far more than without, and the job's tokens per rank stay
// balanced. The workers run the absorbed MLA prefill form (docs/kv-cache.md, "Identity").
#include <map>
#include <random>
#include <regex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/batch_jobs.h"
#include "tests/testing/subprocess.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::CliJobRun;
using ::deepinfer::testing::RunCliJob;
using json = nlohmann::json;

const char kModel[] = "tests/fixtures/dsv3_qlora_rope";
constexpr int kSystems = 4;
constexpr int kQuestions = 6;
constexpr int kSystemTokens = 130;

// System prompt s: 130 random ids; question q: 6..30 random ids whose first differs from every
// other question's. Lines in a shuffled order; greedy, 6 tokens, 2 top logprobs.
std::string SharedPrefixJob() {
  std::mt19937 rng(23);
  std::vector<std::vector<int>> systems(kSystems);
  for (auto& s : systems) {
    for (int k = 0; k < kSystemTokens; ++k) s.push_back(2 + static_cast<int>(rng() % 998));
  }
  std::vector<std::string> lines;
  for (int s = 0; s < kSystems; ++s) {
    for (int q = 0; q < kQuestions; ++q) {
      std::vector<int> prompt = systems[s];
      prompt.push_back(2 + s * kQuestions + q);
      const int extra = 5 + static_cast<int>(rng() % 25);
      for (int k = 0; k < extra; ++k) prompt.push_back(2 + static_cast<int>(rng() % 998));
      json body = {{"prompt", prompt}, {"max_tokens", 6},    {"logprobs", 2},
                   {"temperature", 0}, {"ignore_eos", true}, {"return_token_ids", true}};
      lines.push_back(json({{"custom_id", absl::StrCat("s", s, "q", q)},
                            {"method", "POST"},
                            {"url", "/v1/completions"},
                            {"body", body}})
                          .dump());
    }
  }
  std::shuffle(lines.begin(), lines.end(), rng);
  return absl::StrJoin(lines, "\n") + "\n";
}

struct JobRun {
  std::map<std::string, json> lines;  // by custom_id
  std::string err;                    // deepinfer run's stderr (the job summary)
};

JobRun RunJob(const std::string& name, const std::string& input,
              const std::vector<std::string>& extra) {
  std::vector<std::string> flags = {absl::StrCat("--model=", kModel),
                                    "--worker-args=--prefill-attention=absorbed"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  CliJobRun cli = RunCliJob(name, input, flags);
  return {std::move(cli.lines), std::move(cli.err)};
}

const json& Body(const json& line) { return line["response"]["body"]; }
int64_t CachedTokens(const JobRun& run) {
  int64_t n = 0;
  for (const auto& [id, line] : run.lines) {
    n += Body(line)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  }
  return n;
}

// "tokens per rank max/mean X" of the job summary; -1 when absent.
double Balance(const JobRun& run) {
  std::smatch m;
  static const std::regex kBalance("tokens per rank max/mean ([0-9.]+)");
  if (!std::regex_search(run.err, m, kBalance)) return -1;
  return std::stod(m[1]);
}

TEST(PrefixRoutingRunTest, TwoRanksFollowTheirPrefixWithTheSameOutputs) {
  const std::string job = SharedPrefixJob();
  const JobRun one = RunJob("one_rank", job, {});
  const JobRun unrouted =
      RunJob("unrouted", job, {"--ranks-per-worker=2", "--prefix-routing=false"});
  const JobRun routed = RunJob("routed", job, {"--ranks-per-worker=2"});
  const size_t n = kSystems * kQuestions;
  ASSERT_EQ(one.lines.size(), n);
  ASSERT_EQ(unrouted.lines.size(), n);
  ASSERT_EQ(routed.lines.size(), n);
  for (const auto& [id, want_line] : one.lines) {
    SCOPED_TRACE(id);
    const json& want = Body(want_line)["choices"][0];
    for (const JobRun* run : {&unrouted, &routed}) {
      const json& got = Body(run->lines.at(id))["choices"][0];
      EXPECT_EQ(got["token_ids"], want["token_ids"]);
      EXPECT_EQ(got["logprobs"]["token_logprobs"], want["logprobs"]["token_logprobs"]);
      EXPECT_EQ(got["logprobs"]["top_logprobs"], want["logprobs"]["top_logprobs"]);
    }
  }
  // Routed: all but the first request of each system prompt find its 8 full blocks (128
  // tokens), unless the load threshold sent one to the other rank (then that rank computes it
  // once more): at least 90% of that.
  const int64_t ideal = int64_t{kSystems} * (kQuestions - 1) * 128;
  const int64_t routed_cached = CachedTokens(routed);
  EXPECT_GE(routed_cached, ideal * 9 / 10) << routed.err;
  EXPECT_LE(routed_cached, ideal);
  EXPECT_GT(routed_cached, CachedTokens(unrouted)) << unrouted.err;
  const double balance = Balance(routed);
  EXPECT_GE(balance, 1.0) << routed.err;
  EXPECT_LE(balance, 1.5) << routed.err;
  std::cerr << "cached tokens: one rank " << CachedTokens(one) << ", two unrouted "
            << CachedTokens(unrouted) << ", two routed " << routed_cached << " (ideal " << ideal
            << "); routed balance " << balance << ", unrouted " << Balance(unrouted) << "\n";
}

}  // namespace
}  // namespace deepinfer
