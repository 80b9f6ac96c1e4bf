// The sampling controls through `deepinfer run` on the HF-made fixture
// tests/fixtures/dsv3_qlora_rope (CPU backend, EOS id 1), one job with one line per case, each
// checked against HF's recorded greedy continuation (expected.json) or a rule worked out from
// the definitions:
//   * logit_bias +100 forces a token at every step, -100 keeps the greedy first token out;
//   * a +100 bias on EOS ends the completion at once, unless min_tokens holds EOS back;
//   * stop_token_ids stops before the stop token, min_tokens masks it until reached;
//   * repetition_penalty 1e6 keeps every token of the prompt and of the output out;
//   * frequency/presence penalties pick, at every step, the best token of the raw top-20
//     logprobs after subtracting the penalties of the tokens generated so far;
//   * n = 3 gives 3 choices (index 0..2), choice 0 is the n = 1 completion with the same seed,
//     the same line twice gives the same choices, greedy choices are all HF's;
//   * the job run again with --no-async-scheduling gives the same lines (the workers' logs say
//     which way each run stepped).
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
using ::testing::Each;
using json = nlohmann::json;

const char kModel[] = "tests/fixtures/dsv3_qlora_rope";
constexpr int kEos = 1;

std::vector<int> Ids(const json& choice) { return choice["token_ids"].get<std::vector<int>>(); }

class SamplingControlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const json expected = json::parse(ReadFile(Runfile(std::string(kModel) + "/expected.json")));
    // Prompt 2's greedy continuation repeats token 731 six times: room for the penalties.
    prompt_ = new std::vector<int>(expected["prompts"][2]["ids"].get<std::vector<int>>());
    greedy_ = new std::vector<int>(expected["prompts"][2]["greedy_24"].get<std::vector<int>>());
    other_prompt_ = new std::vector<int>(expected["prompts"][1]["ids"].get<std::vector<int>>());
    auto line = [](const std::string& id, json body) {
      body["return_token_ids"] = true;
      if (!body.contains("prompt")) body["prompt"] = *prompt_;
      if (!body.contains("temperature")) body["temperature"] = 0;
      return json({{"custom_id", id}, {"url", "/v1/completions"}, {"body", body}}).dump() + "\n";
    };
    std::string input;
    input += line("base", {{"max_tokens", 12}, {"ignore_eos", true}});
    input += line("bias", {{"max_tokens", 6}, {"ignore_eos", true}, {"logit_bias", {{"5", 100}}}});
    input += line("ban", {{"max_tokens", 2},
                          {"ignore_eos", true},
                          {"logit_bias", {{std::to_string((*greedy_)[0]), -100}}}});
    input += line("eos", {{"max_tokens", 10}, {"logit_bias", {{"1", 100}}}});
    input += line("eos_min", {{"max_tokens", 10}, {"logit_bias", {{"1", 100}}}, {"min_tokens", 4}});
    input += line("stop_id",
                  {{"max_tokens", 10}, {"ignore_eos", true}, {"stop_token_ids", {(*greedy_)[2]}}});
    input += line("stop_id_min", {{"max_tokens", 10},
                                  {"ignore_eos", true},
                                  {"stop_token_ids", {(*greedy_)[2]}},
                                  {"min_tokens", 3}});
    input += line("rep", {{"max_tokens", 16}, {"ignore_eos", true}, {"repetition_penalty", 1e6}});
    input += line("freq", {{"max_tokens", 16},
                           {"ignore_eos", true},
                           {"frequency_penalty", 1.5},
                           {"presence_penalty", 0.5},
                           {"logprobs", 20}});
    const json sampled = {{"prompt", *other_prompt_},
                          {"max_tokens", 8},
                          {"ignore_eos", true},
                          {"temperature", 1.0},
                          {"seed", 5}};
    json n3 = sampled;
    n3["n"] = 3;
    input += line("n1", sampled);
    input += line("n3", n3);
    input += line("n3_again", n3);
    input += line("n3_greedy", {{"max_tokens", 12}, {"ignore_eos", true}, {"n", 3}});

    lines_ = new std::map<std::string, json>(RunJob("controls", input, {}));
    sync_lines_ = new std::map<std::string, json>(RunJob("sync", input, {"--no-async-scheduling"}));
  }

  // `deepinfer run` of `input` with `extra` flags; the output lines by custom_id.
  static std::map<std::string, json> RunJob(const std::string& name, const std::string& input,
                                            const std::vector<std::string>& extra) {
    std::vector<std::string> flags = {std::string("--model=") + kModel};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return RunCliJob(name, input, flags).lines;
  }

  // The choices of line `id`; fails the test if the line is an error.
  static json Choices(const std::string& id) {
    if (lines_ == nullptr || !lines_->count(id)) {
      ADD_FAILURE() << "no output line " << id;
      return json::array();
    }
    const json& line = lines_->at(id);
    EXPECT_TRUE(line["error"].is_null()) << line.dump();
    if (!line["error"].is_null()) return json::array();
    return line["response"]["body"]["choices"];
  }
  static json Choice(const std::string& id) {
    json c = Choices(id);
    EXPECT_EQ(c.size(), 1u) << id;
    return c.empty() ? json::object() : c[0];
  }
  static std::vector<int> Greedy(size_t n) {
    return std::vector<int>(greedy_->begin(), greedy_->begin() + n);
  }

  static std::vector<int>* prompt_;
  static std::vector<int>* other_prompt_;
  static std::vector<int>* greedy_;
  static std::map<std::string, json>* lines_;
  static std::map<std::string, json>* sync_lines_;
};

std::vector<int>* SamplingControlsTest::prompt_ = nullptr;
std::vector<int>* SamplingControlsTest::other_prompt_ = nullptr;
std::vector<int>* SamplingControlsTest::greedy_ = nullptr;
std::map<std::string, json>* SamplingControlsTest::lines_ = nullptr;
std::map<std::string, json>* SamplingControlsTest::sync_lines_ = nullptr;

TEST_F(SamplingControlsTest, WithoutControlsTheTokensAreHfGreedy) {
  EXPECT_EQ(Ids(Choice("base")), Greedy(12));
}

TEST_F(SamplingControlsTest, LogitBiasForcesAndBansTokens) {
  EXPECT_THAT(Ids(Choice("bias")), ::testing::ElementsAre(5, 5, 5, 5, 5, 5));
  const std::vector<int> ban = Ids(Choice("ban"));
  ASSERT_EQ(ban.size(), 2u);
  EXPECT_NE(ban[0], (*greedy_)[0]);
}

TEST_F(SamplingControlsTest, MinTokensHoldsEosBack) {
  const json eos = Choice("eos");
  EXPECT_TRUE(Ids(eos).empty()) << eos.dump();
  EXPECT_EQ(eos["finish_reason"], "stop");
  // EOS masked for 4 tokens (greedy picks HF's, none of which is EOS), then its +100 wins.
  const json held = Choice("eos_min");
  EXPECT_EQ(Ids(held), Greedy(4)) << held.dump();
  EXPECT_EQ(held["finish_reason"], "stop");
  EXPECT_THAT(Greedy(4), Each(::testing::Ne(kEos)));
}

TEST_F(SamplingControlsTest, StopTokenIdsAndMinTokens) {
  const json stop = Choice("stop_id");
  EXPECT_EQ(Ids(stop), Greedy(2));
  EXPECT_EQ(stop["finish_reason"], "stop");
  const std::vector<int> held = Ids(Choice("stop_id_min"));
  ASSERT_GE(held.size(), 3u);
  EXPECT_EQ(std::vector<int>(held.begin(), held.begin() + 2), Greedy(2));
  EXPECT_NE(held[2], (*greedy_)[2]);  // masked while fewer than 3 tokens were generated
}

TEST_F(SamplingControlsTest, RepetitionPenaltyKeepsPromptAndOutputTokensOut) {
  const std::vector<int> ids = Ids(Choice("rep"));
  ASSERT_EQ(ids.size(), 16u);
  std::set<int> seen(prompt_->begin(), prompt_->end());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_FALSE(seen.count(ids[i])) << "token " << i << " (" << ids[i] << ") was seen before";
    seen.insert(ids[i]);
  }
  // Greedy repeats 731; the penalty breaks that.
  EXPECT_NE(ids, Greedy(16));
}

TEST_F(SamplingControlsTest, FrequencyAndPresencePenaltiesFollowOpenAisFormula) {
  const json choice = Choice("freq");
  const std::vector<int> ids = Ids(choice);
  ASSERT_EQ(ids.size(), 16u);
  EXPECT_NE(ids, Greedy(16));
  const json& tokens = choice["logprobs"]["tokens"];
  const json& top = choice["logprobs"]["top_logprobs"];
  ASSERT_EQ(top.size(), 16u);
  ASSERT_EQ(tokens.size(), 16u);
  std::map<int, int> counts;
  for (size_t i = 0; i < ids.size(); ++i) {
    SCOPED_TRACE(::testing::Message() << "token " << i);
    // Without a tokenizer the alternatives are named "token_id:N"; their logprobs are raw.
    double best = -1e30, chosen = -1e30, lowest = 1e30;
    for (auto it = top[i].begin(); it != top[i].end(); ++it) {
      const int id = std::stoi(it.key().substr(std::string("token_id:").size()));
      const int c = counts.count(id) ? counts[id] : 0;
      const double adjusted = it.value().get<double>() - 1.5 * c - (c > 0 ? 0.5 : 0.0);
      best = std::max(best, adjusted);
      lowest = std::min(lowest, it.value().get<double>());
      if (id == ids[i]) chosen = adjusted;
    }
    ASSERT_GT(chosen, -1e30) << "the pick is not among the raw top 20";
    EXPECT_GE(chosen, best - 1e-4);
    // Tokens outside the top 20 only lose by the penalties: none of them can beat the pick.
    EXPECT_GE(chosen, lowest - 1e-4);
    ++counts[ids[i]];
  }
}

TEST_F(SamplingControlsTest, NChoices) {
  const json n3 = Choices("n3");
  ASSERT_EQ(n3.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(n3[i]["index"], i);
    EXPECT_EQ(Ids(n3[i]).size(), 8u);
  }
  // Choice 0 samples with the request's seed, as n = 1 does; the others with their own.
  EXPECT_EQ(Ids(n3[0]), Ids(Choice("n1")));
  EXPECT_TRUE(Ids(n3[1]) != Ids(n3[0]) || Ids(n3[2]) != Ids(n3[0])) << n3.dump();
  EXPECT_EQ(n3, Choices("n3_again"));
  EXPECT_EQ(lines_->at("n3")["response"]["body"]["usage"]["completion_tokens"], 24);
  const json greedy = Choices("n3_greedy");
  ASSERT_EQ(greedy.size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(Ids(greedy[i]), Greedy(12)) << i;
}

TEST_F(SamplingControlsTest, WithoutAsyncSchedulingTheLinesAreTheSame) {
  ASSERT_EQ(sync_lines_->size(), lines_->size());
  for (const auto& [id, line] : *lines_) {
    SCOPED_TRACE(id);
    ASSERT_EQ(sync_lines_->count(id), 1u);
    const json& sync = sync_lines_->at(id);
    EXPECT_EQ(sync["error"], line["error"]);
    // Ids and timestamps differ from run to run; the choices and usage are the outputs.
    EXPECT_EQ(sync["response"]["body"]["choices"], line["response"]["body"]["choices"]);
    EXPECT_EQ(sync["response"]["body"]["usage"], line["response"]["body"]["usage"]);
  }
  EXPECT_THAT(ReadFile(TempPath("controls.state") + "/logs/worker-0.log"),
              ::testing::HasSubstr("async scheduling on"));
  EXPECT_THAT(ReadFile(TempPath("sync.state") + "/logs/worker-0.log"),
              ::testing::HasSubstr("async scheduling off"));
}

}  // namespace
}  // namespace deepinfer
