// Speculative decoding through `deepinfer run` (real coordinator and worker processes, CPU
// backend): a model with an MTP layer (the fixture's config with generated weights, which have
// the MTP module the HF fixture lacks) gives the same tokens and logprobs with
// --speculative-tokens as without, greedy and seeded sampled, on one rank and on two ranks of an
// expert-parallel group.
#include <cmath>
#include <map>
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
constexpr int kRequests = 8;

// The fixture's prompts, greedy and seeded sampled, 20 tokens each with 2 top logprobs.
std::string Job() {
  const json expected = json::parse(ReadFile(Runfile(std::string(kModel) + "/expected.json")));
  std::vector<std::string> lines;
  for (int i = 0; i < kRequests; ++i) {
    json body = {{"prompt", expected["prompts"][i % 4]["ids"]},
                 {"max_tokens", 20},
                 {"logprobs", 2},
                 {"ignore_eos", true},
                 {"return_token_ids", true}};
    if (i >= 4) {
      body["temperature"] = 0.8;
      body["seed"] = 300 + i;
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

// `deepinfer run` on generated weights of the fixture's config; the output lines by custom_id.
std::map<std::string, json> RunJob(const std::string& name, const std::vector<std::string>& extra,
                                   const std::string& worker_args) {
  std::vector<std::string> flags = {
      absl::StrCat("--model=dummy:", Runfile(kModel), "/config.json@5"),
      "--worker-args=--prefill-attention=absorbed " + worker_args};
  flags.insert(flags.end(), extra.begin(), extra.end());
  return RunCliJob(name, Job(), flags).lines;
}

void ExpectSame(const std::map<std::string, json>& got, const std::map<std::string, json>& want) {
  ASSERT_EQ(got.size(), static_cast<size_t>(kRequests));
  ASSERT_EQ(want.size(), got.size());
  for (int i = 0; i < kRequests; ++i) {
    const std::string id = absl::StrCat("r", i);
    SCOPED_TRACE(id);
    ASSERT_TRUE(got.at(id)["error"].is_null()) << got.at(id).dump();
    ASSERT_TRUE(want.at(id)["error"].is_null()) << want.at(id).dump();
    const json& g = got.at(id)["response"]["body"]["choices"][0];
    const json& w = want.at(id)["response"]["body"]["choices"][0];
    EXPECT_EQ(g["token_ids"], w["token_ids"]);
    ASSERT_EQ(w["token_ids"].size(), 20u);
    ASSERT_EQ(g["logprobs"]["token_logprobs"].size(), w["logprobs"]["token_logprobs"].size());
    for (size_t t = 0; t < w["logprobs"]["token_logprobs"].size(); ++t) {
      EXPECT_NEAR(g["logprobs"]["token_logprobs"][t].get<double>(),
                  w["logprobs"]["token_logprobs"][t].get<double>(), 1e-4)
          << "token " << t;
    }
  }
}

TEST(SpeculativeDecodingRunTest, SameTokensWithAndWithoutDrafts) {
  auto off = RunJob("off", {}, "");
  auto on = RunJob("on", {}, "--speculative-tokens=3");
  ExpectSame(on, off);
}

TEST(SpeculativeDecodingRunTest, ExpertParallelRanksSameTokens) {
  auto off = RunJob("ep_off", {"--ranks-per-worker=2"}, "");
  auto on = RunJob("ep_on", {"--ranks-per-worker=2"}, "--speculative-tokens=2");
  ExpectSame(on, off);
  // One rank: the same again (the expert-parallel exchange changes no result on the CPU).
  auto single = RunJob("single", {}, "");
  ExpectSame(on, single);
}

}  // namespace
}  // namespace deepinfer
