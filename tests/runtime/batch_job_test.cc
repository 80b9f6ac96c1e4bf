// Batch jobs through real processes: `deepinfer run` on 1 worker, 2 workers and 1
// worker with 2 ranks gives identical tokens (greedy and seeded sampling); a SIGKILLed
// worker or coordinator mid-job loses and duplicates nothing; good and bad lines mix;
// generated ids past the tokenizer give no text; 2,000 short requests complete. Model: the
// HF-made fixture tests/fixtures/dsv3_qlora_rope (token-id prompts, CPU backend).
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "coordinator/client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/batch_jobs.h"
#include "tests/testing/subprocess.h"
#include "tokenizer/test_tokenizer_json.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::MakeCompletionJob;
using ::deepinfer::testing::ReadFile;
using ::deepinfer::testing::RunCommand;
using ::deepinfer::testing::Runfile;
using ::deepinfer::testing::Subprocess;
using ::deepinfer::testing::TempPath;
using ::deepinfer::testing::WaitForPortFile;
using ::testing::HasSubstr;
using ::testing::Not;
using json = nlohmann::json;

const char kModel[] = "tests/fixtures/dsv3_qlora_rope";

// Output lines by custom_id; fails the test on a duplicate.
std::map<std::string, json> ByCustomId(const std::string& output) {
  std::map<std::string, json> out;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    json j = json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    if (j.is_discarded()) continue;
    std::string id = j["custom_id"].is_string() ? j["custom_id"].get<std::string>() : "";
    EXPECT_TRUE(out.emplace(id, j).second) << "custom_id " << id << " appears twice";
  }
  return out;
}

std::vector<int> Tokens(const json& line) {
  return line["response"]["body"]["choices"][0]["token_ids"].get<std::vector<int>>();
}

// `deepinfer run` on the fixture (or `model`); returns the output file's text.
std::string RunJob(const std::string& name, const std::string& input, int workers, int ranks,
                   const std::string& model = kModel) {
  const std::string in = TempPath(name + ".in.jsonl");
  const std::string out = TempPath(name + ".out.jsonl");
  std::ofstream(in) << input;
  auto result = RunCommand({Runfile("coordinator/cli/deepinfer"), "run", "--model=" + model,
                            "--input=" + in, "--output=" + out, absl::StrCat("--workers=", workers),
                            absl::StrCat("--ranks-per-worker=", ranks), "--timeout-s=600",
                            "--state-dir=" + TempPath(name + ".state")},
                           TempPath(name + ".run"), absl::Seconds(900));
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return "";
  EXPECT_EQ(result->exit_code, 0) << result->err;
  return ReadFile(out);
}

TEST(BatchJobTest, SameTokensOnOneWorkerTwoWorkersAndTwoRanks) {
  const std::string job = MakeCompletionJob(12, 8, 7);
  auto one = ByCustomId(RunJob("one", job, 1, 1));
  auto two_workers = ByCustomId(RunJob("two_workers", job, 2, 1));
  auto two_ranks = ByCustomId(RunJob("two_ranks", job, 1, 2));
  ASSERT_EQ(one.size(), 12u);
  ASSERT_EQ(two_workers.size(), 12u);
  ASSERT_EQ(two_ranks.size(), 12u);
  for (const auto& [id, line] : one) {
    ASSERT_TRUE(line["error"].is_null()) << line.dump();
    EXPECT_EQ(Tokens(line).size(), 8u) << id;
    EXPECT_EQ(Tokens(line), Tokens(two_workers[id])) << id << " differs on 2 workers";
    EXPECT_EQ(Tokens(line), Tokens(two_ranks[id])) << id << " differs on 2 ranks";
    EXPECT_EQ(line["response"]["body"]["usage"]["completion_tokens"], 8);
  }
  // Multi-rank groups split the 8 routed experts over their ranks (expert parallelism, the
  // worker's default): each rank hosted half of them.
  const std::string one_log = ReadFile(TempPath("one.state/logs/worker-0.log"));
  const std::string w0 = ReadFile(TempPath("two_workers.state/logs/worker-0.log"));
  const std::string w1 = ReadFile(TempPath("two_workers.state/logs/worker-1.log"));
  const std::string ranks = ReadFile(TempPath("two_ranks.state/logs/worker-0.log"));
  EXPECT_THAT(one_log, Not(HasSubstr("expert parallel"))) << one_log;
  for (const std::string* log : {&w0, &w1, &ranks}) {
    EXPECT_EQ(
        absl::StrContains(*log, "rank 0 of 2: expert parallel, hosts routed experts 0..3 of 8") +
            absl::StrContains(*log, "rank 1 of 2: expert parallel, hosts routed experts 4..7 of 8"),
        log == &ranks ? 2 : 1)
        << *log;
  }
}

// One greedy 24-token completion line per fixture prompt (custom ids "hf-N"), with `logprobs`
// top logprobs when > 0; `want` gets HF's recorded continuation of each.
std::vector<std::string> HfGreedyLines(int logprobs, std::map<std::string, std::vector<int>>* want) {
  json expected = json::parse(ReadFile(Runfile(std::string(kModel) + "/expected.json")));
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
    if (logprobs > 0) body["logprobs"] = logprobs;
    lines.push_back(
        json({{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}})
            .dump());
  }
  return lines;
}

// HF transformers' own greedy continuations (recorded in the fixture by
// tools/make_fixtures.py) come out of `deepinfer run`, on one worker and on two.
TEST(BatchJobTest, DeepinferRunReproducesHfGreedyTokens) {
  std::map<std::string, std::vector<int>> want;
  const std::vector<std::string> lines = HfGreedyLines(0, &want);
  ASSERT_FALSE(want.empty());
  for (int workers : {1, 2}) {
    auto out = ByCustomId(
        RunJob(absl::StrCat("hf", workers), absl::StrJoin(lines, "\n") + "\n", workers, 1));
    ASSERT_EQ(out.size(), want.size());
    for (const auto& [id, tokens] : want) {
      EXPECT_EQ(Tokens(out[id]), tokens) << id << " on " << workers << " worker(s)";
    }
  }
}

// A model whose vocabulary (the fixture's 1000 ids) is larger than its tokenizer's (the test
// tokenizer's 269), as DeepSeek-V3's 129,280 embedding rows over 128,815 tokens: HF's greedy
// continuations, which are mostly ids past the tokenizer, come back whole with their logprobs;
// those ids add no text and their logprob token is "". Prompt ids past the model's vocabulary
// still get an error line.
TEST(BatchJobTest, GeneratedIdsPastTheTokenizerGiveNoText) {
  const std::string model = TempPath("big_vocab_model");
  ASSERT_EQ(mkdir(model.c_str(), 0755), 0);
  for (const char* file : {"config.json", "generation_config.json", "model.safetensors"}) {
    const std::string from = Runfile(absl::StrCat(kModel, "/", file));
    ASSERT_EQ(symlink(from.c_str(), absl::StrCat(model, "/", file).c_str()), 0) << from;
  }
  std::ofstream(model + "/tokenizer.json") << tokenizer::TestTokenizerJson().dump();
  auto tok = tokenizer::Tokenizer::FromJson(tokenizer::TestTokenizerJson().dump(), nullptr);
  ASSERT_TRUE(tok.ok()) << tok.status();
  constexpr int kTokenizerIds = 269;  // the test tokenizer knows ids 0..268
  ASSERT_EQ((*tok)->IdToToken(kTokenizerIds), nullptr);

  std::map<std::string, std::vector<int>> want;
  std::vector<std::string> lines = HfGreedyLines(2, &want);
  lines.push_back(
      R"({"custom_id": "outside", "method": "POST", "url": "/v1/completions", "body": {"prompt": [5, 1000]}})");
  auto out = ByCustomId(RunJob("big_vocab", absl::StrJoin(lines, "\n") + "\n", 1, 1, model));
  ASSERT_EQ(out.size(), want.size() + 1);
  for (const auto& [id, tokens] : want) {
    SCOPED_TRACE(id);
    const json& line = out[id];
    ASSERT_TRUE(line["error"].is_null()) << line.dump();
    EXPECT_EQ(line["response"]["status_code"], 200);
    EXPECT_EQ(Tokens(line), tokens);
    std::vector<uint32_t> known;
    for (int t : tokens) {
      if (t < kTokenizerIds) known.push_back(static_cast<uint32_t>(t));
    }
    ASSERT_LT(known.size(), tokens.size());  // HF's continuation has ids past the tokenizer
    auto text = (*tok)->Decode(known, /*skip_special_tokens=*/true);
    ASSERT_TRUE(text.ok()) << text.status();
    const json& choice = line["response"]["body"]["choices"][0];
    EXPECT_EQ(choice["text"], *text);
    const json& logprobs = choice["logprobs"];
    ASSERT_EQ(logprobs["tokens"].size(), tokens.size());
    ASSERT_EQ(logprobs["token_logprobs"].size(), tokens.size());
    for (size_t k = 0; k < tokens.size(); ++k) {
      std::string token_text;
      if (tokens[k] < kTokenizerIds) {
        auto one = (*tok)->Decode({static_cast<uint32_t>(tokens[k])}, false);
        ASSERT_TRUE(one.ok()) << one.status();
        token_text = *one;
      }
      EXPECT_EQ(logprobs["tokens"][k], token_text) << "token " << k << " = id " << tokens[k];
    }
  }
  EXPECT_FALSE(out["outside"]["error"].is_null());
  EXPECT_THAT(out["outside"]["error"]["message"].get<std::string>(),
              HasSubstr("token id 1000 is outside the vocabulary"));
}

// DeepSeek-V3's full config with random weights on the CPU needs 2.44 TiB of fp32 weights: the
// worker refuses it before loading and `deepinfer run` ends at once with the worker's reason,
// instead of waiting for a group that never forms.
TEST(BatchJobTest, ModelThatDoesNotFitEndsTheRunWithTheReason) {
  json config = json::parse(ReadFile(Runfile("tools/bench/configs/deepseek_v3_4layers.json")));
  config["num_hidden_layers"] = 61;
  const std::string path = TempPath("deepseek_v3.json");
  std::ofstream(path) << config.dump();
  const std::string in = TempPath("too_big.in.jsonl");
  std::ofstream(in)
      << R"({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 2, 3]}})"
      << "\n";
  auto result = RunCommand({Runfile("coordinator/cli/deepinfer"), "run", "--model=dummy:" + path,
                            "--input=" + in, "--output=" + TempPath("too_big.out.jsonl"),
                            "--timeout-s=600", "--state-dir=" + TempPath("too_big.state")},
                           TempPath("too_big.run"), absl::Seconds(900));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->exit_code, 1) << result->err;
  EXPECT_THAT(result->err, HasSubstr("deepinfer run: the workers could not start the model: "
                                     "worker worker-0 reports the group failed: rank 0: "
                                     "RESOURCE_EXHAUSTED: the model does not fit in this "
                                     "machine's memory: 1 rank: weights 2.44 TiB (float32) + KV "
                                     "cache 16384 tokens per rank 2.14 GiB (float32) = 2.45 TiB"));
}

TEST(BatchJobTest, GoodAndBadLinesEachGetTheirLine) {
  std::vector<std::string> lines = {
      R"({"custom_id": "ok-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": [5, 6, 7], "max_tokens": 3, "temperature": 0, "ignore_eos": true, "logprobs": 2}})",
      R"(this is not json)",
      R"({"method": "POST", "url": "/v1/completions", "body": {"prompt": [5]}})",
      R"({"custom_id": "ok-1", "method": "POST", "url": "/v1/completions", "body": {"prompt": [5]}})",
      R"({"custom_id": "bad-url", "method": "POST", "url": "/v1/embeddings", "body": {"input": "x"}})",
      R"({"custom_id": "bad-id", "method": "POST", "url": "/v1/completions", "body": {"prompt": [5, 1000]}})",
      R"({"custom_id": "too-long", "method": "POST", "url": "/v1/completions", "body": {"prompt": [5, 6], "max_tokens": 600}})",
      R"({"custom_id": "zero", "method": "POST", "url": "/v1/completions", "body": {"prompt": [5], "max_tokens": 0}})",
      R"({"custom_id": "temp", "method": "POST", "url": "/v1/completions", "body": {"prompt": [5], "temperature": -1}})",
      R"({"custom_id": "text", "method": "POST", "url": "/v1/completions", "body": {"prompt": "no tokenizer here"}})",
      R"({"custom_id": "ok-2", "method": "POST", "url": "/v1/completions", "body": {"prompt": [[9, 10]], "max_tokens": 2, "temperature": 0, "ignore_eos": true}})",
  };
  const std::string output = RunJob("mixed", absl::StrJoin(lines, "\n") + "\n", 1, 1);
  std::vector<json> all;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    all.push_back(json::parse(line));
  }
  ASSERT_EQ(all.size(), lines.size());
  std::map<std::string, std::string> error_of;
  int ok = 0;
  for (const json& j : all) {
    if (j["error"].is_null()) {
      ++ok;
      EXPECT_EQ(j["response"]["status_code"], 200);
      continue;
    }
    EXPECT_TRUE(j["response"].is_null());
    EXPECT_EQ(j["error"]["code"], "invalid_request");
    std::string key = j["custom_id"].is_string() ? j["custom_id"].get<std::string>() : "(none)";
    error_of[key] += j["error"]["message"].get<std::string>() + "\n";
  }
  EXPECT_EQ(ok, 2);
  EXPECT_THAT(error_of["(none)"], HasSubstr("line 2: not valid JSON"));
  EXPECT_THAT(error_of["(none)"], HasSubstr("line 3: custom_id is missing"));
  EXPECT_THAT(error_of["ok-1"], HasSubstr("line 4: duplicate custom_id 'ok-1'"));
  EXPECT_THAT(error_of["bad-url"], HasSubstr("is not served"));
  EXPECT_THAT(error_of["bad-id"], HasSubstr("token id 1000 is outside the vocabulary"));
  EXPECT_THAT(error_of["too-long"], HasSubstr("exceeds the context length (512)"));
  EXPECT_THAT(error_of["zero"], HasSubstr("body.max_tokens must be in [1,"));
  EXPECT_THAT(error_of["temp"], HasSubstr("body.temperature"));
  EXPECT_THAT(error_of["text"], HasSubstr("no tokenizer"));
  // The good one asked for logprobs: one entry per token, two alternatives each.
  for (const json& j : all) {
    if (j["custom_id"] != "ok-1" || !j["error"].is_null()) continue;
    const json& lp = j["response"]["body"]["choices"][0]["logprobs"];
    ASSERT_EQ(lp["token_logprobs"].size(), 3u);
    EXPECT_EQ(lp["top_logprobs"][0].size(), 2u);
  }
}

// A coordinator and workers started by hand, for the failure tests.
class ClusterTest : public ::testing::Test {
 protected:
  void StartCoordinator(int port, int heartbeat_timeout_ms = 2000) {
    const std::string port_file = TempPath(absl::StrCat(name_, ".port.", ++starts_));
    auto p = Subprocess::Start(
        {Runfile("coordinator/deepinfer-coordinator"), absl::StrCat("--listen=127.0.0.1:", port),
         "--port-file=" + port_file, std::string("--model=") + kModel,
         "--state-dir=" + TempPath(name_ + ".state"), "--min-workers=2",
         "--heartbeat-interval-ms=200",
         absl::StrCat("--heartbeat-timeout-ms=", heartbeat_timeout_ms)},
        TempPath(absl::StrCat(name_, ".coordinator.", starts_)));
    ASSERT_TRUE(p.ok()) << p.status();
    coordinator_.emplace(std::move(*p));
    const int bound = WaitForPortFile(port_file, absl::Seconds(60));
    ASSERT_GT(bound, 0) << coordinator_->ReadStderr();
    port_ = bound;
    client_.emplace(
        CoordinatorClientOptions{absl::StrCat("127.0.0.1:", bound), "", "test", absl::Seconds(10)});
  }

  void StartWorker(int i, const std::vector<std::string>& extra_flags = {}) {
    std::vector<std::string> argv = {
        Runfile("worker/deepinfer-worker"), absl::StrCat("--coordinator=127.0.0.1:", port_),
        std::string("--model=") + kModel, absl::StrCat("--worker-id=w", i), "--threads=1"};
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    auto p = Subprocess::Start(argv, TempPath(absl::StrCat(name_, ".worker", i, ".", ++starts_)));
    ASSERT_TRUE(p.ok()) << p.status();
    workers_[i].emplace(std::move(*p));
  }

  Job WaitForJob(const std::string& id, const std::function<bool(const Job&)>& done) {
    return testing::WaitForJob(*client_, id, done, [&] {
      return "coordinator:\n" + coordinator_->ReadStderr().substr(0, 20000);
    });
  }

  std::string Output(const std::string& id) {
    std::string out;
    EXPECT_TRUE(client_->ReadResults(id, [&](const std::string& l) { out += l + "\n"; }).ok());
    return out;
  }

  std::string name_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  int starts_ = 0;
  int port_ = 0;
  std::optional<Subprocess> coordinator_;
  std::optional<Subprocess> workers_[2];
  std::optional<CoordinatorClient> client_;
};

TEST_F(ClusterTest, KilledWorkerMidJobLosesNothing) {
  StartCoordinator(0);
  StartWorker(0);
  StartWorker(1);
  const int n = 200;
  auto id = client_->SubmitJob("kill-worker", MakeCompletionJob(n, 64, 11));
  ASSERT_TRUE(id.ok()) << id.status();
  Job job = WaitForJob(*id, [](const Job& j) { return j.completed_requests() >= 3; });
  ASSERT_LT(job.completed_requests(), n) << "the job finished before the kill";
  workers_[1]->Signal(SIGKILL);
  job = WaitForJob(*id, [](const Job& j) { return j.state() == Job::COMPLETED; });
  EXPECT_EQ(job.completed_requests(), n);
  EXPECT_EQ(job.failed_requests(), 0);
  auto lines = ByCustomId(Output(*id));
  EXPECT_EQ(lines.size(), static_cast<size_t>(n));
  for (const auto& [custom_id, line] : lines) {
    EXPECT_TRUE(line["error"].is_null()) << line.dump();
  }
}

// SIGTERM: the worker deregisters before it exits. The heartbeat timeout is an hour, so
// only its Deregister can make the coordinator drop it: the coordinator shows it LEFT once
// the process is gone, re-queues the requests in flight, and the job completes on the other
// worker with every line once. Eight sequences per rank at a time, so that the job runs in
// waves and the signal comes while most requests wait or run.
TEST_F(ClusterTest, TerminatedWorkerDeregistersAndItsRequestsRunAgain) {
  StartCoordinator(0, /*heartbeat_timeout_ms=*/3600 * 1000);
  StartWorker(0, {"--max-running=8"});
  StartWorker(1, {"--max-running=8"});
  const int n = 200;
  auto id = client_->SubmitJob("terminate-worker", MakeCompletionJob(n, 64, 13));
  ASSERT_TRUE(id.ok()) << id.status();
  Job job = WaitForJob(*id, [](const Job& j) { return j.completed_requests() >= 3; });
  ASSERT_LT(job.completed_requests(), n) << "the job finished before the signal";
  auto w1_state = [&]() {
    auto status = client_->ClusterStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    if (!status.ok()) return WORKER_STATE_UNSPECIFIED;
    for (const WorkerStatus& w : status->workers()) {
      if (w.worker_id() == "w1") return w.state();
    }
    return WORKER_STATE_UNSPECIFIED;
  };
  ASSERT_EQ(w1_state(), READY);
  workers_[1]->Signal(SIGTERM);
  auto exit_code = workers_[1]->Wait(absl::Seconds(120));
  ASSERT_TRUE(exit_code.ok()) << exit_code.status();
  EXPECT_EQ(*exit_code, 0) << workers_[1]->ReadStderr();
  EXPECT_EQ(w1_state(), LEFT) << coordinator_->ReadStderr();
  EXPECT_THAT(workers_[1]->ReadStderr(), HasSubstr("deregistered from coordinator"));
  job = WaitForJob(*id, [](const Job& j) { return j.state() == Job::COMPLETED; });
  EXPECT_EQ(job.completed_requests(), n);
  EXPECT_EQ(job.failed_requests(), 0);
  auto lines = ByCustomId(Output(*id));
  EXPECT_EQ(lines.size(), static_cast<size_t>(n));
  for (const auto& [custom_id, line] : lines) {
    EXPECT_TRUE(line["error"].is_null()) << line.dump();
  }
  const std::string log = coordinator_->ReadStderr();
  EXPECT_THAT(log, HasSubstr("worker w1 deregistered"));
  EXPECT_THAT(log, HasSubstr("broken: worker w1 is LEFT"));
  EXPECT_THAT(log, HasSubstr("in flight: the group broke"));  // re-queued
  EXPECT_THAT(log, Not(HasSubstr("missed its heartbeat deadline")));
  EXPECT_EQ(w1_state(), LEFT);
}

TEST_F(ClusterTest, KilledAndRestartedCoordinatorResumesWithoutDuplicates) {
  StartCoordinator(0);
  StartWorker(0);
  StartWorker(1);
  const int n = 200;
  auto id = client_->SubmitJob("kill-coordinator", MakeCompletionJob(n, 64, 12));
  ASSERT_TRUE(id.ok()) << id.status();
  Job job = WaitForJob(*id, [](const Job& j) { return j.completed_requests() >= 3; });
  ASSERT_LT(job.completed_requests(), n) << "the job finished before the kill";
  coordinator_->Signal(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  StartCoordinator(port_);
  job = WaitForJob(*id, [](const Job& j) { return j.state() == Job::COMPLETED; });
  EXPECT_EQ(job.completed_requests(), n);
  auto lines = ByCustomId(Output(*id));
  EXPECT_EQ(lines.size(), static_cast<size_t>(n));
  // The output file on disk holds the same lines, each once.
  std::string file;
  for (int i = 0; i < 2 && file.empty(); ++i) {
    file = ReadFile(TempPath(absl::StrCat(name_, ".state/jobs/", *id, "/output.jsonl")));
  }
  EXPECT_EQ(ByCustomId(file).size(), static_cast<size_t>(n));
}

TEST(BatchJobTest, TwoThousandShortRequests) {
  const int n = 2000;
  const absl::Time start = absl::Now();
  auto lines = ByCustomId(RunJob("many", MakeCompletionJob(n, 1, 99), 1, 1));
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_EQ(lines.size(), static_cast<size_t>(n));
  int ok = 0;
  for (const auto& [id, line] : lines) ok += line["error"].is_null();
  EXPECT_EQ(ok, n);
  // Reported, not asserted: requests/s of the whole path (control plane + tiny model).
  std::cerr << n << " requests in " << seconds << " s: " << n / seconds << " requests/s\n";
}

}  // namespace
}  // namespace deepinfer
