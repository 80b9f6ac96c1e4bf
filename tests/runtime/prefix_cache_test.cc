// Prefix caching through `deepinfer run` (real coordinator and worker processes, CPU backend,
// the HF-made fixture tests/fixtures/dsv3_qlora_rope): a job whose requests share a long system
// prompt gives the same tokens and logprobs with the cache as with --no-prefix-caching, and
// usage.prompt_tokens_details.cached_tokens says how many prompt tokens the cache served.
// The workers run the absorbed MLA prefill form, whose results do not depend on how many new
// tokens a step brings (docs/kv-cache.md, "Identity").
#include <map>
#include <random>
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

using ::deepinfer::testing::ReadFile;
using ::deepinfer::testing::RunCliJob;
using ::deepinfer::testing::Runfile;
using json = nlohmann::json;

const char kModel[] = "tests/fixtures/dsv3_qlora_rope";
constexpr int kRequests = 12;

// The fixture's 130-token prompt as the system prompt, then a question of 4..40 random ids
// (2..999) whose first id differs from every other question's; greedy and seeded sampled
// requests with 3 top logprobs.
std::string SharedSystemPromptJob(std::vector<int>* prompt_lengths) {
  const json expected = json::parse(ReadFile(Runfile(std::string(kModel) + "/expected.json")));
  const std::vector<int> system = expected["prompts"][3]["ids"].get<std::vector<int>>();
  std::mt19937 rng(11);
  std::vector<std::string> lines;
  for (int i = 0; i < kRequests; ++i) {
    std::vector<int> prompt = system;
    prompt.push_back(2 + i);  // distinct first question token
    const int extra = 3 + static_cast<int>(rng() % 37);
    for (int k = 0; k < extra; ++k) prompt.push_back(2 + static_cast<int>(rng() % 998));
    prompt_lengths->push_back(static_cast<int>(prompt.size()));
    json body = {{"prompt", prompt},
                 {"max_tokens", 8},
                 {"logprobs", 3},
                 {"ignore_eos", true},
                 {"return_token_ids", true}};
    if (i % 3 == 2) {
      body["temperature"] = 0.8;
      body["seed"] = 100 + i;
    } else {
      body["temperature"] = 0;
    }
    lines.push_back(json({{"custom_id", absl::StrCat("r", i)},
                          {"method", "POST"},
                          {"url", "/v1/completions"},
                          {"body", body}})
                        .dump());
  }
  return absl::StrJoin(lines, "\n") + "\n";
}

// `deepinfer run` with the absorbed prefill form and `extra` flags; the output lines by
// custom_id.
std::map<std::string, json> RunJob(const std::string& name, const std::string& input,
                                   const std::vector<std::string>& extra,
                                   const std::string& worker_args = "") {
  std::vector<std::string> flags = {absl::StrCat("--model=", kModel),
                                    "--worker-args=--prefill-attention=absorbed " + worker_args};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return RunCliJob(name, input, flags).lines;
}

const json& Body(const json& line) { return line["response"]["body"]; }
int CachedTokens(const json& line) {
  return Body(line)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
}

TEST(PrefixCacheRunTest, SharedSystemPromptSameTokensAndLogprobsAsWithout) {
  std::vector<int> lengths;
  const std::string job = SharedSystemPromptJob(&lengths);
  auto off = RunJob("off", job, {"--no-prefix-caching"});
  auto on = RunJob("on", job, {});
  // One request at a time: every request but the first admitted finds the system prompt's 8
  // full blocks (128 of its 130 tokens) that the first one left; questions differ from their
  // first token on, so nothing more.
  auto serial = RunJob("serial", job, {}, "--max-running=1");
  ASSERT_EQ(off.size(), static_cast<size_t>(kRequests));
  ASSERT_EQ(on.size(), off.size());
  ASSERT_EQ(serial.size(), off.size());
  int zero_serial = 0;
  for (int i = 0; i < kRequests; ++i) {
    const std::string id = absl::StrCat("r", i);
    SCOPED_TRACE(id);
    ASSERT_TRUE(off[id]["error"].is_null()) << off[id].dump();
    ASSERT_TRUE(on[id]["error"].is_null()) << on[id].dump();
    ASSERT_TRUE(serial[id]["error"].is_null()) << serial[id].dump();
    const json& want = Body(off[id])["choices"][0];
    for (const auto* run : {&on, &serial}) {
      const json& got = Body(run->at(id))["choices"][0];
      EXPECT_EQ(got["token_ids"], want["token_ids"]);
      EXPECT_EQ(got["logprobs"]["token_logprobs"], want["logprobs"]["token_logprobs"]);
      EXPECT_EQ(got["logprobs"]["top_logprobs"], want["logprobs"]["top_logprobs"]);
      EXPECT_EQ(Body(run->at(id))["usage"]["prompt_tokens"], lengths[i]);
    }
    EXPECT_EQ(want["token_ids"].size(), 8u);
    EXPECT_EQ(CachedTokens(off[id]), 0);
    // Concurrent requests (those admitted in one step find nothing of each other's):
    // whatever was cached when each was admitted, whole blocks of the system prompt.
    const int cached = CachedTokens(on[id]);
    EXPECT_EQ(cached % 16, 0) << cached;
    EXPECT_LE(cached, 128);
    const int serial_cached = CachedTokens(serial[id]);
    if (serial_cached == 0) {
      ++zero_serial;
    } else {
      EXPECT_EQ(serial_cached, 128);
    }
  }
  EXPECT_EQ(zero_serial, 1);
}

}  // namespace
}  // namespace deepinfer
