// RankGroup: one rank equals HF's greedy tokens; two ranks in one worker (TcpCommunicator on
// loopback, local or expert-parallel dispatcher) give the same tokens as one rank; a peer that
// dies turns the group FAILED (and drops its requests) instead of hanging; bad layouts are
// refused; CPU ranks are planned together against the machine's memory (a model that does not
// fit is refused before loading).
#include "worker/engine/rank_group.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "worker/engine/memory_plan.h"
#include "worker/model/model_weights.h"

namespace deepinfer {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope";
}

struct Prompt {
  std::vector<int32_t> ids, greedy;
};

std::vector<Prompt> LoadPrompts() {
  std::ifstream in(FixtureDir() + "/expected.json");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  std::vector<Prompt> out;
  if (!j.is_object() || !j.contains("prompts")) return out;
  for (const auto& p : j["prompts"]) {
    Prompt pr;
    for (const auto& v : p["ids"]) pr.ids.push_back(v.get<int32_t>());
    for (const auto& v : p["greedy_24"]) pr.greedy.push_back(v.get<int32_t>());
    out.push_back(pr);
  }
  return out;
}

// Thread-safe sink that tests wait on.
class Collector {
 public:
  ResultSink Sink() {
    return [this](std::vector<RequestResult> results) {
      absl::MutexLock lock(&mu_);
      for (RequestResult& r : results) results_[r.request_id()] = std::move(r);
    };
  }
  std::map<std::string, RequestResult> Await(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return results_.size() >= n; };
    mu_.Await(absl::Condition(&enough));
    return results_;
  }
  size_t size() {
    absl::MutexLock lock(&mu_);
    return results_.size();
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, RequestResult> results_ ABSL_GUARDED_BY(mu_);
};

WorkItem Item(const std::string& id, int rank, const std::vector<int32_t>& prompt,
              int32_t max_tokens, float temperature, uint64_t seed) {
  WorkItem item;
  item.set_request_id(id);
  item.set_rank(rank);
  item.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  item.mutable_params()->set_max_tokens(max_tokens);
  item.mutable_params()->set_temperature(temperature);
  item.mutable_params()->set_seed(seed);
  item.mutable_params()->set_logprobs(-1);
  return item;
}

std::vector<int32_t> Tokens(const RequestResult& r) {
  return std::vector<int32_t>(r.token_ids().begin(), r.token_ids().end());
}

class RankGroupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prompts_ = LoadPrompts();
    ASSERT_EQ(prompts_.size(), 4u);
    auto files = ModelFiles::Open(FixtureDir());
    ASSERT_TRUE(files.ok()) << files.status();
    files_ = std::move(*files);
    options_.model = files_.get();
    options_.kv_cache_tokens = 4096;
    options_.collective_timeout = absl::Seconds(60);
  }
  // Requests on `ranks` ranks, round-robin.
  std::vector<WorkItem> Items(int ranks) {
    std::vector<WorkItem> items;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      items.push_back(Item(absl::StrCat("g", i), i % ranks, prompts_[i].ids, 24, 0, 1));
      items.push_back(Item(absl::StrCat("s", i), (i + 1) % ranks, prompts_[i].ids, 16, 0.8f, i));
    }
    return items;
  }

  // Requests on one rank and on a group of two ranks in this process (options_) finish with
  // the same tokens.
  void ExpectTwoRanksEqualOneRank();

  // Items(1) run to the end on one rank alone (options_).
  void RunOneRank(Collector* results) {
    auto group = RankGroup::Create(options_, GroupLayout{}, nullptr, results->Sink());
    ASSERT_TRUE(group.ok()) << group.status();
    (*group)->Start();
    ASSERT_TRUE((*group)->Submit(Items(1)).ok());
    results->Await(8);
  }

  // A started group (options_) of `num_ranks` ranks in this process out of `world_size`, rank 0
  // listening on a free local port; null (with a test failure) if it cannot be created.
  std::unique_ptr<RankGroup> StartGroup(uint64_t generation, uint64_t incarnation, int world_size,
                                        int num_ranks, Collector* results,
                                        GroupLayout* layout_out = nullptr) {
    auto root = comm::TcpCommunicator::ListenRoot("127.0.0.1:0");
    EXPECT_TRUE(root.ok()) << root.status();
    if (!root.ok()) return nullptr;
    GroupLayout layout;
    layout.generation = generation;
    layout.group_incarnation = incarnation;
    layout.world_size = world_size;
    layout.num_ranks = num_ranks;
    layout.root_address = root->address;
    if (layout_out != nullptr) *layout_out = layout;
    auto group = RankGroup::Create(
        options_, layout, std::make_unique<comm::TcpCommunicator::RootListener>(std::move(*root)),
        results->Sink());
    EXPECT_TRUE(group.ok()) << group.status();
    if (!group.ok()) return nullptr;
    (*group)->Start();
    return std::move(*group);
  }

  std::vector<Prompt> prompts_;
  std::unique_ptr<ModelFiles> files_;
  RankGroupOptions options_;
};

TEST_F(RankGroupTest, OneRankGivesHfTokens) {
  Collector results;
  GroupLayout layout;
  layout.generation = 7;
  auto group = RankGroup::Create(options_, layout, nullptr, results.Sink());
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->status(), GROUP_FORMING);
  ASSERT_TRUE((*group)->Submit(Items(1)).ok());  // accepted while forming
  (*group)->Start();
  EXPECT_EQ((*group)->AwaitFormed(), GROUP_SERVING) << (*group)->error();
  auto got = results.Await(8);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const RequestResult& r = got[absl::StrCat("g", i)];
    EXPECT_THAT(Tokens(r), ElementsAreArray(prompts_[i].greedy));
    EXPECT_EQ(r.group_generation(), 7u);
    EXPECT_EQ(got[absl::StrCat("s", i)].token_ids_size(), 16);
  }
  auto loads = (*group)->Loads();
  ASSERT_EQ(loads.size(), 1u);
  EXPECT_EQ(loads[0].rank(), 0);
  EXPECT_EQ(loads[0].kv_blocks_total(), 4096 / 16);
  // A rank this worker does not run.
  EXPECT_TRUE(absl::IsInvalidArgument((*group)->Submit({Item("x", 1, {5}, 1, 0, 1)})));
}

TEST_F(RankGroupTest, TwoRanksInOneWorkerEqualOneRank) { ExpectTwoRanksEqualOneRank(); }

// The dtype reaches the backend: bf16 weights serve (their tokens are checked against HF in
// tests/parity), the CPU's KV cache defaults to kDefaultCpuKvCacheTokens without an explicit
// size, and an unknown dtype fails the group with the backend factory's error.
TEST_F(RankGroupTest, DtypeReachesTheBackendAndCpuCacheDefaults) {
  options_.dtype = "bfloat16";
  options_.kv_cache_tokens = 0;
  Collector results;
  auto group = RankGroup::Create(options_, GroupLayout(), nullptr, results.Sink());
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_EQ((*group)->Loads()[0].kv_blocks_total(), 0);  // not planned before forming
  ASSERT_TRUE((*group)->Submit({Item("b", 0, prompts_[0].ids, 8, 0, 1)}).ok());
  (*group)->Start();
  ASSERT_EQ((*group)->AwaitFormed(), GROUP_SERVING) << (*group)->error();
  EXPECT_EQ(results.Await(1)["b"].token_ids_size(), 8);
  EXPECT_EQ((*group)->Loads()[0].kv_blocks_total(), kDefaultCpuKvCacheTokens / 16);

  options_.dtype = "float8";
  auto bad = RankGroup::Create(options_, GroupLayout(), nullptr, Collector().Sink());
  ASSERT_TRUE(bad.ok()) << bad.status();
  (*bad)->Start();
  EXPECT_EQ((*bad)->AwaitFormed(), GROUP_FAILED);
  EXPECT_THAT((*bad)->error(), ::testing::HasSubstr("unknown weight dtype 'float8'"));
}

TEST_F(RankGroupTest, RefusesBadMemoryOptions) {
  options_.gpu_memory_utilization = 1.5;
  EXPECT_TRUE(absl::IsInvalidArgument(
      RankGroup::Create(options_, GroupLayout(), nullptr, Collector().Sink()).status()));
  options_.gpu_memory_utilization = 0.9;
  options_.kv_cache_tokens = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(
      RankGroup::Create(options_, GroupLayout(), nullptr, Collector().Sink()).status()));
  options_.kv_cache_tokens = 0;
  options_.kv_cache_dtype = "int4";
  const absl::Status bad_cache =
      RankGroup::Create(options_, GroupLayout(), nullptr, Collector().Sink()).status();
  EXPECT_TRUE(absl::IsInvalidArgument(bad_cache));
  EXPECT_THAT(bad_cache.message(), ::testing::HasSubstr("'int4'"));
}

TEST_F(RankGroupTest, TwoExpertParallelRanksEqualOneRank) {
  // Each rank loads 4 of the 8 experts and the idle rank steps with empty batches; a missed
  // collective would fail the group (or time out) instead of finishing the requests.
  options_.dispatcher = EpDispatcherFactory();
  ExpectTwoRanksEqualOneRank();
}

// Expert-parallel ranks with prefix caching: each rank has its own pool and cache, so in a step
// one rank's requests hit while the other's prefill whole (or it has none); every rank still
// takes part in every step (a missed collective would fail the group or time out), and tokens
// and logprobs equal one rank without a cache. The absorbed prefill form makes results
// independent of how many new tokens a step brings.
TEST_F(RankGroupTest, ExpertParallelRanksWithPrefixCachingEqualOneRankWithout) {
  options_.prefill_attention = PrefillAttention::kAbsorbed;
  // Wave "a": three requests sharing the 130-token system prompt, on rank 0; wave "b": the same
  // prompts again, two on rank 0 (which cached the system prompt) and one on rank 1 (which
  // did not).
  auto wave = [&](const std::string& name, int ranks) {
    std::vector<WorkItem> items;
    for (size_t q = 0; q < 3; ++q) {
      std::vector<int32_t> prompt = prompts_[3].ids;
      prompt.insert(prompt.end(), prompts_[q].ids.begin(), prompts_[q].ids.end());
      const int rank = name == "b" && q == 2 ? ranks - 1 : 0;
      items.push_back(Item(absl::StrCat(name, q), rank, prompt, 8, q == 1 ? 0.8f : 0, 5 + q));
      items.back().mutable_params()->set_logprobs(2);
    }
    return items;
  };
  std::map<std::string, RequestResult> want;
  {
    RankGroupOptions one = options_;
    one.prefix_caching = false;
    Collector results;
    auto group = RankGroup::Create(one, GroupLayout{}, nullptr, results.Sink());
    ASSERT_TRUE(group.ok()) << group.status();
    (*group)->Start();
    ASSERT_TRUE((*group)->Submit(wave("a", 1)).ok());
    results.Await(3);
    ASSERT_TRUE((*group)->Submit(wave("b", 1)).ok());
    want = results.Await(6);
  }
  options_.dispatcher = EpDispatcherFactory();
  options_.prefix_caching = true;
  Collector two;
  auto group = StartGroup(2, 0x4321, 2, 2, &two);
  ASSERT_NE(group, nullptr);
  ASSERT_EQ(group->AwaitFormed(), GROUP_SERVING) << group->error();
  ASSERT_TRUE(group->Submit(wave("a", 2)).ok());
  two.Await(3);
  ASSERT_TRUE(group->Submit(wave("b", 2)).ok());
  auto got = two.Await(6);
  ASSERT_EQ(got.size(), 6u);
  for (const auto& [id, r] : want) {
    const RequestResult& g = got[id];
    EXPECT_EQ(g.error_code(), "") << id << ": " << g.error_message();
    EXPECT_THAT(Tokens(g), ElementsAreArray(Tokens(r))) << id;
    ASSERT_EQ(g.logprobs_size(), r.logprobs_size()) << id;
    for (int i = 0; i < g.logprobs_size(); ++i) {
      EXPECT_EQ(g.logprobs(i).logprob(), r.logprobs(i).logprob()) << id << " token " << i;
      EXPECT_THAT(g.logprobs(i).top_logprobs(), ElementsAreArray(r.logprobs(i).top_logprobs()))
          << id << " token " << i;
    }
    EXPECT_EQ(r.cached_prompt_tokens(), 0) << id;
  }
  // Rank 0 served wave a's full blocks from its cache (b0: 135 tokens, 8 blocks; b1: 147
  // tokens, 9 blocks); rank 1 had none.
  EXPECT_EQ(got["b0"].cached_prompt_tokens(), 128);
  EXPECT_EQ(got["b1"].cached_prompt_tokens(), 144);
  EXPECT_EQ(got["b2"].cached_prompt_tokens(), 0);
}

TEST_F(RankGroupTest, NcclOnTheCpuBackendFailsTheGroupWithAClearError) {
  options_.dispatcher = EpDispatcherFactory();
  options_.communicator = comm::DataPlaneChoice::kNccl;  // backend stays "cpu"
  Collector results;
  auto group = StartGroup(3, 0x77, 2, 2, &results);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->AwaitFormed(), GROUP_FAILED);
  EXPECT_THAT(group->error(), ::testing::HasSubstr("nccl needs the cuda backend"));
}

TEST_F(RankGroupTest, TwoExpertParallelRanksOverAnExplicitTcpDataPlaneEqualOneRank) {
  options_.dispatcher = EpDispatcherFactory();
  options_.communicator = comm::DataPlaneChoice::kTcp;
  ExpectTwoRanksEqualOneRank();
}

void RankGroupTest::ExpectTwoRanksEqualOneRank() {
  Collector one;
  RunOneRank(&one);
  Collector two;
  auto group = StartGroup(2, 0x1234, 2, 2, &two);
  ASSERT_NE(group, nullptr);
  ASSERT_EQ(group->AwaitFormed(), GROUP_SERVING) << group->error();
  ASSERT_TRUE(group->Submit(Items(2)).ok());
  auto a = one.Await(8);
  auto b = two.Await(8);
  for (const auto& [id, r] : a) {
    EXPECT_EQ(b[id].error_code(), "");
    EXPECT_THAT(Tokens(b[id]), ElementsAreArray(Tokens(r))) << id;
  }
  auto loads = group->Loads();
  ASSERT_EQ(loads.size(), 2u);
  EXPECT_EQ(loads[1].rank(), 1);
  for (const RankLoad& l : loads) {
    // Expert parallel on the CPU: host-staged over TCP; else every rank hosts every expert.
    EXPECT_EQ(l.expert_exchange(),
              options_.dispatcher.partitioned ? "TCP (staged on the host)" : "local");
    // Every rank stepped (each with its own requests, or idle in lock-step).
    EXPECT_GT(l.window_steps(), 0);
    EXPECT_GE(l.window_step_tokens_max(), l.window_step_tokens_mean());
  }
}

// --micro-batches 2 on every rank of an expert-parallel group: the same tokens as one rank with
// one micro-batch per step (a rank whose halves disagree on the exchanges would fail the group
// or time out instead of finishing).
TEST_F(RankGroupTest, TwoExpertParallelRanksWithTwoMicroBatchesEqualOneRank) {
  Collector one;
  RunOneRank(&one);
  options_.dispatcher = EpDispatcherFactory();
  options_.micro_batches = 2;
  Collector two;
  auto group = StartGroup(2, 0x2468, 2, 2, &two);
  ASSERT_NE(group, nullptr);
  ASSERT_EQ(group->AwaitFormed(), GROUP_SERVING) << group->error();
  ASSERT_TRUE(group->Submit(Items(2)).ok());
  auto a = one.Await(8);
  auto b = two.Await(8);
  for (const auto& [id, r] : a) {
    EXPECT_EQ(b[id].error_code(), "") << id << ": " << b[id].error_message();
    EXPECT_THAT(Tokens(b[id]), ElementsAreArray(Tokens(r))) << id;
  }
}

TEST_F(RankGroupTest, DeviceExchangeWithoutTheNcclDataPlaneFailsClearly) {
  EpExchangeOptions exchange;
  exchange.kind = EpExchangeKind::kDevice;
  options_.dispatcher = EpDispatcherFactory(exchange);
  options_.communicator = comm::DataPlaneChoice::kTcp;
  Collector results;
  auto group = StartGroup(2, 0x4321, 2, 2, &results);
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->AwaitFormed(), GROUP_FAILED);
  EXPECT_THAT(group->error(),
              ::testing::HasSubstr("--ep-exchange=device needs the NCCL data plane"));
}

TEST(EpExchangeKindTest, ParsesTheThreeNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseEpExchangeKind("auto"), EpExchangeKind::kAuto);
  EXPECT_EQ(*ParseEpExchangeKind("device"), EpExchangeKind::kDevice);
  EXPECT_EQ(*ParseEpExchangeKind("collective"), EpExchangeKind::kCollective);
  absl::StatusOr<EpExchangeKind> bad = ParseEpExchangeKind("nvlink");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("'nvlink'"));
}

TEST_F(RankGroupTest, DeadPeerFailsTheGroup) {
  Collector results;
  GroupLayout layout;
  // Rank 1 of the two is the test's own peer below.
  auto group = StartGroup(3, 99, 2, /*num_ranks=*/1, &results, &layout);
  ASSERT_NE(group, nullptr);
  comm::TcpCommunicatorSpec spec;
  spec.rank = 1;
  spec.world_size = 2;
  spec.root_address = layout.root_address;
  spec.group_incarnation = 99;
  auto peer = comm::TcpCommunicator::Create(spec);
  ASSERT_TRUE(peer.ok()) << peer.status();
  ASSERT_TRUE((*peer)->Barrier().ok());  // "loaded"
  ASSERT_EQ(group->AwaitFormed(), GROUP_SERVING);
  // Play the loop until rank 0 has work, then die in the middle of it.
  ASSERT_TRUE(group->Submit({Item("lost", 0, prompts_[3].ids, 24, 0, 1)}).ok());
  for (;;) {
    int64_t any = 0;
    ASSERT_TRUE((*peer)->AllReduce(&any, &any, 1, comm::ReduceOp::kMax).ok());
    if (any != 0) break;
  }
  peer->reset();
  group->AwaitFailed();
  EXPECT_EQ(group->status(), GROUP_FAILED);
  EXPECT_THAT(group->error(), ::testing::HasSubstr("rank 0"));
  group->Stop();
  EXPECT_EQ(results.size(), 0u);  // the request was dropped, not reported
  EXPECT_EQ(group->Loads()[0].running_requests(), 0);
}

TEST_F(RankGroupTest, PeerThatNeverFormsFailsTheGroup) {
  options_.collective_timeout = absl::Milliseconds(300);
  GroupLayout layout;
  layout.generation = 4;
  layout.group_incarnation = 5;
  layout.world_size = 2;
  layout.num_ranks = 1;
  layout.first_rank = 1;
  layout.root_address = "127.0.0.1:1";  // nobody listens there
  Collector results;
  auto group = RankGroup::Create(options_, layout, nullptr, results.Sink());
  ASSERT_TRUE(group.ok()) << group.status();
  (*group)->Start();
  EXPECT_EQ((*group)->AwaitFormed(), GROUP_FAILED);
  EXPECT_THAT((*group)->error(), ::testing::HasSubstr("rank 1"));
}

// 10 slots per MoE layer of the fixture (2 layers, 8 experts): experts 0 and 7 (layer 0),
// 2 and 5 (layer 1) have two replicas.
std::shared_ptr<const ExpertPlacement> ReplicaPlacement() {
  auto p = ExpertPlacement::FromPhy2Log(
      {{0, 1, 2, 3, 7, 4, 5, 6, 7, 0}, {2, 2, 0, 1, 3, 4, 5, 5, 6, 7}}, 8);
  EXPECT_TRUE(p.ok()) << p.status();
  return std::make_shared<const ExpertPlacement>(std::move(*p));
}

TEST_F(RankGroupTest, LivePlacementSwitchKeepsTokensAndCountsExpertLoads) {
  options_.dispatcher = EpDispatcherFactory();
  Collector one;
  RunOneRank(&one);
  Collector two;
  auto group = StartGroup(4, 0x77, 2, 2, &two);
  ASSERT_NE(group, nullptr);
  ASSERT_EQ(group->AwaitFormed(), GROUP_SERVING) << group->error();
  EXPECT_EQ(group->placement_epoch(), 0u);
  ASSERT_TRUE(group->Submit(Items(2)).ok());
  // While the requests run: both ranks stage it and switch at one agreed step; a second
  // placement follows at once (it may be read before the first is switched to).
  ASSERT_TRUE(group->SetPlacement(ReplicaPlacement(), 5).ok());
  EXPECT_TRUE(group->SetPlacement(ReplicaPlacement(), 5).ok());  // a retry: no-op
  auto reversed = ExpertPlacement::FromPhy2Log(
      {{7, 6, 5, 4, 0, 3, 2, 1, 0, 7}, {7, 6, 5, 4, 4, 3, 2, 1, 0, 0}}, 8);
  ASSERT_TRUE(reversed.ok());
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(group->SetPlacement(std::make_shared<const ExpertPlacement>(*reversed), 6).ok());
  auto a = one.Await(8);
  auto b = two.Await(8);
  for (const auto& [id, r] : a) {
    EXPECT_EQ(b[id].error_code(), "") << b[id].error_message();
    EXPECT_THAT(Tokens(b[id]), ElementsAreArray(Tokens(r))) << id;
  }
  for (int i = 0; i < 500 && group->placement_epoch() != 6u; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(group->placement_epoch(), 6u);
  EXPECT_EQ(group->status(), GROUP_SERVING) << group->error();
  // Expert loads: reports of 2 MoE layers x 8 experts, top-2 of every token computed: each
  // request's prompt once and every generated token fed back (all but a last one that hit
  // the length limit; an EOS is not returned). Ranks read their counts back about once a
  // second and when they go idle, so the last reports may come a little after the results.
  int64_t tokens = 0;
  for (const auto& [id, r] : b) {
    tokens += r.prompt_tokens() + r.token_ids_size() - (r.finish_reason() == "length" ? 1 : 0);
  }
  int64_t total = 0;
  std::set<int> ranks;
  for (int i = 0; i < 500 && total < 2 * tokens; ++i) {
    for (const ExpertLoadReport& r : group->TakeExpertLoads()) {
      ranks.insert(r.rank());
      EXPECT_EQ(r.group_generation(), 4u);
      EXPECT_EQ(r.num_layers(), 2);
      EXPECT_EQ(r.num_experts(), 8);
      ASSERT_EQ(r.counts_size(), 16);
      EXPECT_GT(r.num_steps(), 0);
      int64_t layer0 = 0, layer1 = 0;
      for (int e = 0; e < 8; ++e) {
        layer0 += r.counts(e);
        layer1 += r.counts(8 + e);
      }
      EXPECT_EQ(layer0, layer1);  // every token passes both MoE layers
      total += layer0;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1}));
  EXPECT_EQ(total, 2 * tokens);
}

TEST_F(RankGroupTest, RefusesPlacementsThatDoNotFit) {
  GroupLayout layout;
  layout.generation = 1;
  layout.group_incarnation = 1;
  layout.world_size = 2;
  layout.num_ranks = 1;
  layout.root_address = "127.0.0.1:1";
  // Not expert parallel: placements do not apply.
  auto local = RankGroup::Create(options_, layout, nullptr, Collector().Sink());
  ASSERT_TRUE(local.ok());
  EXPECT_TRUE(absl::IsFailedPrecondition((*local)->SetPlacement(ReplicaPlacement(), 1)));
  options_.dispatcher = EpDispatcherFactory();
  auto ep = RankGroup::Create(options_, layout, nullptr, Collector().Sink());
  ASSERT_TRUE(ep.ok());
  auto nine =
      ExpertPlacement::FromPhy2Log({{0, 1, 2, 3, 4, 5, 6, 7, 0}, {0, 1, 2, 3, 4, 5, 6, 7, 1}}, 8);
  ASSERT_TRUE(nine.ok());
  absl::Status st = (*ep)->SetPlacement(std::make_shared<const ExpertPlacement>(*nine), 1);
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("does not fit a group of 2"));
  auto one_layer = ExpertPlacement::FromPhy2Log({{0, 1, 2, 3, 4, 5, 6, 7}}, 8);
  st = (*ep)->SetPlacement(std::make_shared<const ExpertPlacement>(*one_layer), 1);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("the model has 2 MoE layers"));
  layout.placement = std::make_shared<const ExpertPlacement>(*nine);
  EXPECT_TRUE(absl::IsInvalidArgument(
      RankGroup::Create(options_, layout, nullptr, Collector().Sink()).status()));
}

class FixedHostMemory : public HostMemory {
 public:
  explicit FixedHostMemory(int64_t bytes) : bytes_(bytes) {}
  absl::StatusOr<int64_t> AvailableBytes() const override { return bytes_; }

 private:
  int64_t bytes_;
};

// CPU ranks share the machine's memory: a worker's ranks are planned together, each with the
// experts it will load, before any of them loads.
TEST_F(RankGroupTest, CpuRanksArePlannedTogetherAgainstTheMachinesMemory) {
  const ModelConfig& c = files_->config;
  // fp32 latent + rope key per layer and token.
  const int64_t kv = 4096 * c.num_hidden_layers * (c.kv_lora_rank + c.qk_rope_head_dim) * 4;
  const int64_t all_experts = ModelWeights::DeviceBytes(c, WeightDType::kFloat32, {}) + kv;
  // Room for one rank that hosts every expert, not for two.
  options_.host_memory = std::make_shared<FixedHostMemory>(all_experts + all_experts / 2);
  Collector results;
  auto refused = StartGroup(1, 0x51, 2, 2, &results);
  ASSERT_NE(refused, nullptr);
  EXPECT_EQ(refused->AwaitFormed(), GROUP_FAILED);
  EXPECT_THAT(refused->error(),
              AllOf(HasSubstr("RESOURCE_EXHAUSTED"),
                    HasSubstr("the model does not fit in this machine's memory: 2 ranks"),
                    HasSubstr("4096 tokens per rank")));
  refused.reset();
  // Exactly what both need: they serve.
  options_.host_memory = std::make_shared<FixedHostMemory>(2 * all_experts);
  auto fits = StartGroup(2, 0x52, 2, 2, &results);
  ASSERT_NE(fits, nullptr);
  EXPECT_EQ(fits->AwaitFormed(), GROUP_SERVING) << fits->error();
  fits.reset();
  // Expert parallel: each rank loads half the experts, and only that is planned.
  options_.dispatcher = EpDispatcherFactory();
  int64_t halves = 2 * kv;
  for (int rank = 0; rank < 2; ++rank) {
    const ExpertRange range = ExpertsOfRank(c.n_routed_experts, 2, rank);
    LoadOptions load;
    load.hosts_expert = [range](int64_t, int64_t e) {
      return e >= range.first && e < range.first + range.count;
    };
    halves += ModelWeights::DeviceBytes(c, WeightDType::kFloat32, load);
  }
  ASSERT_LT(halves, 2 * all_experts);
  options_.host_memory = std::make_shared<FixedHostMemory>(halves);
  auto ep = StartGroup(3, 0x53, 2, 2, &results);
  ASSERT_NE(ep, nullptr);
  EXPECT_EQ(ep->AwaitFormed(), GROUP_SERVING) << ep->error();
  ep.reset();
  options_.host_memory = std::make_shared<FixedHostMemory>(halves - 1);
  auto short_by_one = StartGroup(4, 0x54, 2, 2, &results);
  ASSERT_NE(short_by_one, nullptr);
  EXPECT_EQ(short_by_one->AwaitFormed(), GROUP_FAILED);
}

// DeepSeek-V3's full config on the CPU (fp32, every expert on one rank: 2.44 TiB) on a 24 GiB
// machine is refused at once, with the numbers; without the plan the rank would start filling
// 2.44 TiB of weights.
TEST_F(RankGroupTest, ModelFarBiggerThanTheMachineIsRefusedBeforeLoading) {
  const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/deepseek_v3.json";
  std::ofstream(path) << R"({
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "vocab_size": 129280, "hidden_size": 7168, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "num_hidden_layers": 61, "num_attention_heads": 128,
    "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
    "v_head_dim": 128, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5, "first_k_dense_replace": 3,
    "max_position_embeddings": 163840, "rope_theta": 10000})";
  auto v3 = ModelFiles::Open("dummy:" + path + "@1");
  ASSERT_TRUE(v3.ok()) << v3.status();
  // DeepSeek-V3 has 671,026,419,200 parameters without its MTP layer (the "671B" DeepSeek
  // states: embeddings and head 2 x 129280 x 7168, 61 attention blocks, 3 dense MLPs, 58 MoE
  // layers of 256 routed and 1 shared expert and a router); the model also keeps W_uk^T, a
  // second copy of kv_b's key half (61 x 128 x 128 x 512). All fp32 here.
  EXPECT_EQ(ModelWeights::DeviceBytes((*v3)->config, WeightDType::kFloat32, {}),
            4 * (int64_t{671026419200} + int64_t{61} * 128 * 128 * 512));
  options_.model = v3->get();
  options_.kv_cache_tokens = 0;
  options_.host_memory = std::make_shared<FixedHostMemory>(int64_t{24} << 30);
  Collector results;
  auto group = RankGroup::Create(options_, GroupLayout(), nullptr, results.Sink());
  ASSERT_TRUE(group.ok()) << group.status();
  (*group)->Start();
  ASSERT_EQ((*group)->AwaitFormed(), GROUP_FAILED);
  EXPECT_THAT((*group)->error(),
              AllOf(HasSubstr("rank 0: RESOURCE_EXHAUSTED: the model does not fit in this "
                              "machine's memory: 1 rank: weights 2.44 TiB (float32) + KV cache "
                              "16384 tokens per rank 2.14 GiB (float32) = 2.45 TiB of 24.00 GiB "
                              "available"),
                    HasSubstr("--dtype bfloat16")));
}

TEST_F(RankGroupTest, RefusesBadLayouts) {
  GroupLayout layout;
  layout.world_size = 3;  // 8 experts
  layout.group_incarnation = 1;
  layout.root_address = "127.0.0.1:1";
  auto g = RankGroup::Create(options_, layout, nullptr, Collector().Sink());
  EXPECT_TRUE(absl::IsInvalidArgument(g.status())) << g.status();
  EXPECT_THAT(std::string(g.status().message()), ::testing::HasSubstr("divide"));
  layout.world_size = 2;
  layout.first_rank = 1;
  layout.num_ranks = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(
      RankGroup::Create(options_, layout, nullptr, Collector().Sink()).status()));
  layout.first_rank = 0;
  layout.num_ranks = 1;
  layout.root_address.clear();
  EXPECT_TRUE(absl::IsInvalidArgument(
      RankGroup::Create(options_, layout, nullptr, Collector().Sink()).status()));
  EXPECT_EQ(ExpertsOfRank(8, 2, 1).first, 4);
  EXPECT_EQ(ExpertsOfRank(8, 2, 1).count, 4);
}

}  // namespace
}  // namespace deepinfer
