// DeepSeek-V4 through real processes: `deepinfer run` on the HF-made fixtures completes a job
// whose greedy tokens are HF's greedy_24 continuations: dsv4_mix (FP8 and MXFP4 storage) on 1
// worker, on 2 workers and on 1 worker with 2 ranks (the routed experts split over the ranks),
// and with a KV cache too small for every sequence at once and a step budget smaller than the
// long prompt (chunked prefill, preemption and the bounded rebuild of a preempted sequence);
// dsv4_bf16 (bf16 storage) on 1 worker; requests sharing a long prefix with and without the
// prefix cache.
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
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
using ::deepinfer::testing::TempPath;
using ::testing::HasSubstr;
using json = nlohmann::json;

const char kMix[] = "tests/fixtures/dsv4_mix";
const char kBf16[] = "tests/fixtures/dsv4_bf16";

// One greedy 24-token completion line per fixture prompt ("hf-N"); `want` gets greedy_24.
std::string HfGreedyJob(const std::string& model, std::map<std::string, std::vector<int>>* want) {
  json expected = json::parse(ReadFile(Runfile(model + "/expected.json")));
  std::vector<std::string> lines;
  for (size_t i = 0; i < expected["prompts"].size(); ++i) {
    const json& p = expected["prompts"][i];
    const std::string id = absl::StrCat("hf-", i);
    (*want)[id] = p["greedy_24"].get<std::vector<int>>();
    json body = {{"prompt", p["ids"]},
                 {"max_tokens", 24},
                 {"temperature", 0},
                 {"ignore_eos", true},
                 {"return_token_ids", true}};
    lines.push_back(
        json({{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}})
            .dump());
  }
  return absl::StrJoin(lines, "\n") + "\n";
}

// `deepinfer run` on the fixture; the output lines by custom_id.
std::map<std::string, json> RunJob(const std::string& model, const std::string& name,
                                   const std::string& input, int workers, int ranks,
                                   const std::string& worker_args = "",
                                   const std::vector<std::string>& extra = {}) {
  std::vector<std::string> flags = {"--model=" + model, absl::StrCat("--workers=", workers),
                                    absl::StrCat("--ranks-per-worker=", ranks)};
  if (!worker_args.empty()) flags.push_back("--worker-args=" + worker_args);
  flags.insert(flags.end(), extra.begin(), extra.end());
  return RunCliJob(name, input, flags).lines;
}

std::vector<int> Tokens(const json& line) {
  return line["response"]["body"]["choices"][0]["token_ids"].get<std::vector<int>>();
}

void ExpectHfGreedy(const std::map<std::string, json>& out,
                    const std::map<std::string, std::vector<int>>& want, const std::string& what) {
  ASSERT_EQ(out.size(), want.size()) << what;
  for (const auto& [id, tokens] : want) {
    const json& line = out.at(id);
    ASSERT_TRUE(line["error"].is_null()) << what << ": " << line.dump();
    EXPECT_EQ(Tokens(line), tokens) << id << ", " << what;
  }
}

TEST(V4RunTest, HfGreedyTokensOnOneWorkerTwoWorkersAndTwoRanks) {
  std::map<std::string, std::vector<int>> want;
  const std::string job = HfGreedyJob(kMix, &want);
  ExpectHfGreedy(RunJob(kMix, "one", job, 1, 1), want, "1 worker");
  ExpectHfGreedy(RunJob(kMix, "two_workers", job, 2, 1), want, "2 workers");
  ExpectHfGreedy(RunJob(kMix, "two_ranks", job, 1, 2), want, "1 worker x 2 ranks");
  // The 8 routed experts of each layer were split over the two ranks.
  const std::string ranks = ReadFile(TempPath("two_ranks.state/logs/worker-0.log"));
  EXPECT_THAT(ranks, HasSubstr("rank 0 of 2: expert parallel, hosts routed experts 0..3 of 8"));
  EXPECT_THAT(ranks, HasSubstr("rank 1 of 2: expert parallel, hosts routed experts 4..7 of 8"));
}

// 25 blocks of 16 tokens for sequences needing 2 + 4 + 21 blocks, 48 new tokens per step: the
// long prompt is prefilled in chunks, and a sequence is preempted and prefilled again.
TEST(V4RunTest, HfGreedyTokensWithChunkedPrefillAndPreemption) {
  std::map<std::string, std::vector<int>> want;
  const std::string job = HfGreedyJob(kMix, &want);
  ExpectHfGreedy(RunJob(kMix, "small_cache", job, 1, 1,
                        "--kv-cache-tokens=400 --max-batch-tokens=48 --max-running=4 --v=1"),
                 want, "small cache");
  // The engine logs each preemption at --v=1.
  const std::string log = ReadFile(TempPath("small_cache.state/logs/worker-0.log"));
  EXPECT_THAT(log, HasSubstr("preempting"));
  // The long sequence is rebuilt by a bounded replay (docs/model.md, "Replay after preemption or
  // worker loss").
  EXPECT_THAT(log, HasSubstr("its rebuild replays from position"));
}

// dsv4_bf16 (bf16-stored matrices, 8 index heads): greedy_24 on every prompt.
TEST(V4RunTest, HfGreedyTokensOnTheBf16Fixture) {
  std::map<std::string, std::vector<int>> want;
  const std::string job = HfGreedyJob(kBf16, &want);
  ExpectHfGreedy(RunJob(kBf16, "bf16", job, 1, 1), want, "dsv4_bf16, 1 worker");
}

// A job whose requests share dsv4_mix's first 200 prompt tokens, then a question of 10..29 ids
// whose first differs from every other request's; greedy and seeded sampled, 2 top logprobs.
std::string SharedPrefixJob(int requests) {
  const json expected = json::parse(ReadFile(Runfile(std::string(kMix) + "/expected.json")));
  const std::vector<int> long_prompt = expected["prompts"][2]["ids"].get<std::vector<int>>();
  const std::vector<int> prefix(long_prompt.begin(), long_prompt.begin() + 200);
  std::mt19937 rng(5);
  std::vector<std::string> lines;
  for (int i = 0; i < requests; ++i) {
    std::vector<int> prompt = prefix;
    prompt.push_back(900 + i);
    const int extra = 9 + static_cast<int>(rng() % 20);
    for (int k = 0; k < extra; ++k) prompt.push_back(2 + static_cast<int>(rng() % 890));
    json body = {{"prompt", prompt},
                 {"max_tokens", 8},
                 {"logprobs", 2},
                 {"ignore_eos", true},
                 {"return_token_ids", true}};
    if (i % 2 == 1) {
      body["temperature"] = 0.7;
      body["seed"] = 40 + i;
    } else {
      body["temperature"] = 0;
    }
    lines.push_back(json({{"custom_id", absl::StrCat("s", i)},
                          {"method", "POST"},
                          {"url", "/v1/completions"},
                          {"body", body}})
                        .dump());
  }
  return absl::StrJoin(lines, "\n") + "\n";
}

// Prefix caching on V4 (docs/kv-cache.md, "Kinds with per-sequence state"): one request at a
// time, every request after the first hits the shared prefix's 12 full blocks (192 positions),
// replays its last 4 * 15 + 2 * 16 = 92 positions and reports the 100 it did not compute; the
// tokens and logprobs are those of a run without the cache.
TEST(V4RunTest, SharedPrefixSameTokensAndLogprobsAsWithoutTheCache) {
  constexpr int kRequests = 5;
  const std::string job = SharedPrefixJob(kRequests);
  auto off = RunJob(kMix, "prefix_off", job, 1, 1, "--max-running=1", {"--no-prefix-caching"});
  auto on = RunJob(kMix, "prefix_on", job, 1, 1, "--max-running=1");
  ASSERT_EQ(off.size(), static_cast<size_t>(kRequests));
  ASSERT_EQ(on.size(), off.size());
  int hits = 0;
  for (int i = 0; i < kRequests; ++i) {
    const std::string id = absl::StrCat("s", i);
    SCOPED_TRACE(id);
    ASSERT_TRUE(off[id]["error"].is_null()) << off[id].dump();
    ASSERT_TRUE(on[id]["error"].is_null()) << on[id].dump();
    const json& want = off[id]["response"]["body"]["choices"][0];
    const json& got = on[id]["response"]["body"]["choices"][0];
    EXPECT_EQ(got["token_ids"], want["token_ids"]);
    EXPECT_EQ(got["logprobs"]["token_logprobs"], want["logprobs"]["token_logprobs"]);
    EXPECT_EQ(got["logprobs"]["top_logprobs"], want["logprobs"]["top_logprobs"]);
    EXPECT_EQ(want["token_ids"].size(), 8u);
    auto cached = [](const json& line) {
      return line["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
    };
    EXPECT_EQ(cached(off[id]), 0);
    if (cached(on[id]) != 0) {
      EXPECT_EQ(cached(on[id]), 100);
      ++hits;
    }
  }
  EXPECT_EQ(hits, kRequests - 1);
}

}  // namespace
}  // namespace deepinfer
