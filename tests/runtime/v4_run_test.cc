// DeepSeek-V4 through real processes: `deepinfer run` on the HF-made fixtures completes a job
// whose greedy tokens are HF's greedy_24 continuations: dsv4_mix (FP8 and MXFP4 storage) on 1
// worker, on 2 workers and on 1 worker with 2 ranks (the routed experts split over the ranks),
// and with a KV cache too small for every sequence at once and a step budget smaller than the
// long prompt (chunked prefill, preemption and the bounded rebuild of a preempted sequence);
// dsv4_bf16 (bf16 storage) on 1 worker.
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/batch_jobs.h"
#include "tests/testing/subprocess.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::ReadFile;
using ::deepinfer::testing::RunCommand;
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
                                   const std::string& worker_args = "") {
  const std::string in = TempPath(name + ".in.jsonl");
  const std::string out = TempPath(name + ".out.jsonl");
  std::ofstream(in) << input;
  std::vector<std::string> argv = {Runfile("coordinator/cli/deepinfer"),
                                   "run",
                                   "--model=" + model,
                                   "--input=" + in,
                                   "--output=" + out,
                                   absl::StrCat("--workers=", workers),
                                   absl::StrCat("--ranks-per-worker=", ranks),
                                   "--timeout-s=600",
                                   "--state-dir=" + TempPath(name + ".state")};
  if (!worker_args.empty()) argv.push_back("--worker-args=" + worker_args);
  auto result = RunCommand(argv, TempPath(name + ".run"), absl::Seconds(900));
  EXPECT_TRUE(result.ok()) << result.status();
  std::map<std::string, json> lines;
  if (!result.ok()) return lines;
  EXPECT_EQ(result->exit_code, 0) << result->err;
  for (absl::string_view line : absl::StrSplit(ReadFile(out), '\n', absl::SkipEmpty())) {
    json j = json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    if (!j.is_discarded()) lines[j["custom_id"].get<std::string>()] = j;
  }
  return lines;
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

}  // namespace
}  // namespace deepinfer
