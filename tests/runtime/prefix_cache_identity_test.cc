// Prefix caching keeps every token and logprob through the cluster's disruptions, end to end
// (a coordinator and two CPU workers on the HF-made fixture tests/fixtures/dsv3_qlora_rope, the
// absorbed MLA prefill form): a job whose requests share three system prompts, greedy and seeded
// sampled with top logprobs, run with the cache on while
//  * a worker is SIGKILLed mid-job (its requests run again on the other),
//  * a live EPLB rebalance switches the expert placement mid-job, and
//  * a small KV cache preempts sequences (`deepinfer run`, one worker),
// gives, request by request, the tokens, logprobs and top logprobs of `deepinfer run
// --no-prefix-caching` on one worker and one rank, bit for bit (docs/kv-cache.md, "Identity").
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "coordinator/client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/batch_jobs.h"
#include "tests/testing/subprocess.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::ReadFile;
using ::deepinfer::testing::RunCliJob;
using ::deepinfer::testing::RunCommand;
using ::deepinfer::testing::Runfile;
using ::deepinfer::testing::Subprocess;
using ::deepinfer::testing::TempPath;
using ::deepinfer::testing::WaitForPortFile;
using ::deepinfer::testing::WaitUntil;
using ::testing::HasSubstr;
using json = nlohmann::json;

const char kModel[] = "tests/fixtures/dsv3_qlora_rope";
const char kAbsorbed[] = "--prefill-attention=absorbed";
constexpr int kRequests = 120;
constexpr int kMaxTokens = 40;

// Three system prompts of 48 random ids (three full blocks of 16), request i taking system
// prompt i % 3, then a question of 3..12 random ids whose first id differs from every other
// question's; every fourth request samples (temperature 0.8, seed 500 + i), the others are
// greedy; 2 top logprobs each.
std::string SharedSystemPromptsJob() {
  std::mt19937 rng(29);
  auto id = [&] { return 2 + static_cast<int>(rng() % 998); };
  std::vector<std::vector<int>> systems(3);
  for (auto& system : systems) {
    for (int k = 0; k < 48; ++k) system.push_back(id());
  }
  std::vector<std::string> lines;
  for (int i = 0; i < kRequests; ++i) {
    std::vector<int> prompt = systems[i % 3];
    prompt.push_back(2 + i);  // distinct first question token
    const int extra = 2 + static_cast<int>(rng() % 10);
    for (int k = 0; k < extra; ++k) prompt.push_back(id());
    json body = {{"prompt", prompt},   {"max_tokens", kMaxTokens}, {"logprobs", 2},
                 {"ignore_eos", true}, {"return_token_ids", true}, {"temperature", 0}};
    if (i % 4 == 3) {
      body["temperature"] = 0.8;
      body["seed"] = 500 + i;
    }
    lines.push_back(json({{"custom_id", absl::StrCat("r", i)},
                          {"method", "POST"},
                          {"url", "/v1/completions"},
                          {"body", body}})
                        .dump());
  }
  return absl::StrJoin(lines, "\n") + "\n";
}

// The job's lines of `deepinfer run --no-prefix-caching` on one worker and one rank.
const std::map<std::string, json>& Reference() {
  static const auto* reference = new std::map<std::string, json>(
      RunCliJob("reference", SharedSystemPromptsJob(),
                {absl::StrCat("--model=", kModel), "--no-prefix-caching", "--workers=1",
                 "--ranks-per-worker=1", absl::StrCat("--worker-args=", kAbsorbed)})
          .lines);
  return *reference;
}

const json& Choice(const json& line) { return line["response"]["body"]["choices"][0]; }

// Every request of `reference` in `got`, once, without error, with the same token ids, token
// logprobs and top logprobs; returns the prompt tokens the cache served in `got`.
int ExpectIdentical(const std::map<std::string, json>& reference,
                    const std::map<std::string, json>& got) {
  EXPECT_EQ(reference.size(), static_cast<size_t>(kRequests));
  EXPECT_EQ(got.size(), reference.size());
  int cached = 0;
  for (const auto& [id, want_line] : reference) {
    SCOPED_TRACE(id);
    auto it = got.find(id);
    if (it == got.end()) {
      ADD_FAILURE() << "missing";
      continue;
    }
    EXPECT_TRUE(want_line["error"].is_null()) << want_line.dump();
    EXPECT_TRUE(it->second["error"].is_null()) << it->second.dump();
    if (!it->second["error"].is_null() || !want_line["error"].is_null()) continue;
    const json& want = Choice(want_line);
    const json& have = Choice(it->second);
    EXPECT_EQ(want["token_ids"].size(), static_cast<size_t>(kMaxTokens));
    EXPECT_EQ(have["token_ids"], want["token_ids"]);
    EXPECT_EQ(want["logprobs"]["token_logprobs"].size(), static_cast<size_t>(kMaxTokens));
    EXPECT_EQ(have["logprobs"]["token_logprobs"], want["logprobs"]["token_logprobs"]);
    EXPECT_EQ(have["logprobs"]["top_logprobs"], want["logprobs"]["top_logprobs"]);
    cached += it->second["response"]["body"]["usage"]["prompt_tokens_details"]["cached_tokens"]
                  .get<int>();
  }
  return cached;
}

// A coordinator and two one-rank workers with the cache on (the workers' default), the absorbed
// prefill form and few sequences per step (a longer job, so that the disruption comes well
// before its end).
class PrefixCacheIdentityTest : public ::testing::Test {
 protected:
  void StartCluster(const std::string& run, const std::vector<std::string>& coordinator_flags) {
    run_ = run;
    const std::string port_file = TempPath(run + ".port");
    std::vector<std::string> argv = {Runfile("coordinator/deepinfer-coordinator"),
                                     "--listen=127.0.0.1:0",
                                     "--port-file=" + port_file,
                                     std::string("--model=") + kModel,
                                     "--state-dir=" + TempPath(run + ".state"),
                                     "--min-workers=2",
                                     "--heartbeat-interval-ms=200",
                                     "--heartbeat-timeout-ms=2000"};
    argv.insert(argv.end(), coordinator_flags.begin(), coordinator_flags.end());
    auto p = Subprocess::Start(argv, TempPath(run + ".coordinator"));
    ASSERT_TRUE(p.ok()) << p.status();
    coordinator_.emplace(std::move(*p));
    const int port = WaitForPortFile(port_file, absl::Seconds(60));
    ASSERT_GT(port, 0) << coordinator_->ReadStderr();
    address_ = absl::StrCat("127.0.0.1:", port);
    client_.emplace(CoordinatorClientOptions{address_, "", "test", absl::Seconds(30)});
    for (int i = 0; i < 2; ++i) {
      auto wp =
          Subprocess::Start({Runfile("worker/deepinfer-worker"), "--coordinator=" + address_,
                             std::string("--model=") + kModel, absl::StrCat("--worker-id=w", i),
                             "--threads=1", "--max-running=4", kAbsorbed},
                            TempPath(absl::StrCat(run, ".worker", i)));
      ASSERT_TRUE(wp.ok()) << wp.status();
      workers_[i].emplace(std::move(*wp));
    }
  }

  Job WaitForJob(const std::string& id, const std::function<bool(const Job&)>& done) {
    return testing::WaitForJob(*client_, id, done, [&] {
      return "coordinator:\n" + coordinator_->ReadStderr().substr(0, 20000);
    });
  }

  // Waits for job `id` to complete with every request; its output lines by custom_id (a
  // custom_id twice fails the test).
  std::map<std::string, json> Finish(const std::string& id) {
    Job job = WaitForJob(id, [](const Job& j) { return j.state() == Job::COMPLETED; });
    EXPECT_EQ(job.completed_requests(), kRequests);
    EXPECT_EQ(job.failed_requests(), 0);
    std::map<std::string, json> lines;
    EXPECT_TRUE(client_
                    ->ReadResults(id,
                                  [&](const std::string& l) {
                                    json j = json::parse(l, nullptr, false);
                                    EXPECT_FALSE(j.is_discarded()) << l;
                                    if (j.is_discarded()) return;
                                    const std::string custom_id = j["custom_id"];
                                    EXPECT_TRUE(lines.emplace(custom_id, j).second)
                                        << custom_id << " appears twice";
                                  })
                    .ok());
    return lines;
  }

  std::string WorkerLogs() {
    return workers_[0]->ReadStderr() + "\n---- w1 ----\n" + workers_[1]->ReadStderr();
  }

  std::string run_;
  std::string address_;
  std::optional<Subprocess> coordinator_;
  std::optional<Subprocess> workers_[2];
  std::optional<CoordinatorClient> client_;
};

TEST_F(PrefixCacheIdentityTest, KilledWorkerMidJobKeepsTokensAndLogprobs) {
  ASSERT_EQ(Reference().size(), static_cast<size_t>(kRequests));
  StartCluster("kill", {});
  auto id = client_->SubmitJob("kill", SharedSystemPromptsJob());
  ASSERT_TRUE(id.ok()) << id.status();
  Job job = WaitForJob(*id, [](const Job& j) { return j.completed_requests() >= 3; });
  ASSERT_LT(job.completed_requests(), kRequests) << "the job finished before the kill";
  workers_[1]->Signal(SIGKILL);
  const int cached = ExpectIdentical(Reference(), Finish(*id));
  EXPECT_GT(cached, 0) << "no request found its system prompt in the cache";
}

TEST_F(PrefixCacheIdentityTest, LiveRebalanceMidJobKeepsTokensAndLogprobs) {
  ASSERT_EQ(Reference().size(), static_cast<size_t>(kRequests));
  StartCluster("rebalance", {"--num-redundant-experts=2"});
  auto id = client_->SubmitJob("rebalance", SharedSystemPromptsJob());
  ASSERT_TRUE(id.ok()) << id.status();
  // Some results and a load window first.
  WaitForJob(*id, [](const Job& j) { return j.completed_requests() >= 2; });
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto load = client_->GetExpertLoad();
        return load.ok() && load->num_steps() > 0 && load->num_gpus() == 2;
      },
      absl::Seconds(60)));
  auto rebalance = RunCommand({Runfile("tools/admin/deepinfer-admin"), "rebalance",
                               "--coordinator=" + address_, "--policy=global"},
                              TempPath("rebalance"), absl::Seconds(60));
  ASSERT_TRUE(rebalance.ok()) << rebalance.status();
  ASSERT_EQ(rebalance->exit_code, 0) << rebalance->err;
  EXPECT_THAT(rebalance->out, HasSubstr("applied: expert placement epoch 1"));
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto load = client_->GetExpertLoad();
        return load.ok() && load->active_epoch() == 1;
      },
      absl::Seconds(120)))
      << WorkerLogs();
  auto job = client_->GetJob(*id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_LT(job->completed_requests(), kRequests) << "the job ended before the switch";
  const int cached = ExpectIdentical(Reference(), Finish(*id));
  EXPECT_GT(cached, 0) << "no request found its system prompt in the cache";
  const std::string logs = WorkerLogs();
  EXPECT_THAT(logs, HasSubstr("rank 0: switched to expert placement epoch 1"));
  EXPECT_THAT(logs, HasSubstr("rank 1: switched to expert placement epoch 1"));
}

// 20 blocks of 16 tokens for up to 8 sequences of 6..7 blocks each (3 of them a shared system
// prompt's): sequences are preempted and computed again, with the cache on.
TEST(PrefixCachePreemptionRunTest, SmallKvCacheKeepsTokensAndLogprobs) {
  ASSERT_EQ(Reference().size(), static_cast<size_t>(kRequests));
  auto run = RunCliJob(
      "small_cache", SharedSystemPromptsJob(),
      {absl::StrCat("--model=", kModel), "--workers=1", "--ranks-per-worker=1",
       absl::StrCat("--worker-args=", kAbsorbed, " --kv-cache-tokens=320 --max-running=8 --v=1")});
  const int cached = ExpectIdentical(Reference(), run.lines);
  EXPECT_GT(cached, 0) << "no request found its system prompt in the cache";
  // The engine logs each preemption at --v=1.
  EXPECT_THAT(ReadFile(TempPath("small_cache.state/logs/worker-0.log")), HasSubstr("preempting"));
}

}  // namespace
}  // namespace deepinfer
