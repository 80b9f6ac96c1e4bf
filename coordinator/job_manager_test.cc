// JobManager against fake workers (job_manager_test_fixture.h): group forming, dispatch,
// results exactly once, error lines, a lost worker, cancel, and resuming from the store.
// job_validation_test.cc has the way of a job's input through validation.
#include "coordinator/job_manager.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/eplb/placement_proto.h"
#include "coordinator/job_manager_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

TEST_F(JobManagerTest, RunsAJobWithGoodAndBadLines) {
  const std::string input =
      absl::StrJoin({Line("a", "[1, 2, 3]"), std::string("{broken"), Line("b", "[4, 5]"),
                     Line("a", "[6]"), Line("c", "[100]"), Line("d", "\"text\""),
                     std::string(R"({"custom_id": "e", "url": "/v1/edits", "body": {}})"),
                     Line("f", "[7, 8, 9]")},
                    "\n");
  auto id = Submit("mixed", input);
  ASSERT_TRUE(id.ok()) << id.status();
  // The five bad lines are answered at once.
  Job job = GetJob(*id);
  EXPECT_EQ(job.total_requests(), 8);
  EXPECT_EQ(job.failed_requests(), 5);
  EXPECT_EQ(job.state(), Job::QUEUED);

  AddWorker("w1", 1, 2);
  ServeWhenConfigured({{"w1", 1}}, 1);
  auto items = workers_.Take(3);
  ASSERT_EQ(items.size(), 3u);
  std::vector<RequestResult> results;
  for (const auto& [address, item] : items) {
    EXPECT_EQ(address, "w1:1");
    EXPECT_TRUE(item.params().has_seed());  // always seeded, so re-runs match
    results.push_back(ResultFor(item));
  }
  EXPECT_EQ(GetJob(*id).state(), Job::RUNNING);
  ASSERT_TRUE(manager_->OnResults(results).ok());
  ASSERT_TRUE(manager_->OnResults(results).ok());  // a resend changes nothing
  job = GetJob(*id);
  EXPECT_EQ(job.state(), Job::COMPLETED);
  EXPECT_EQ(job.completed_requests(), 3);

  std::map<std::string, json> by_id;
  std::vector<std::string> errors;
  for (const json& line : Output(*id)) {
    if (!line["error"].is_null()) {
      errors.push_back(line["error"]["message"]);
      continue;
    }
    const std::string custom_id = line["custom_id"];
    EXPECT_FALSE(by_id.count(custom_id)) << custom_id << " twice";
    by_id[custom_id] = line;
  }
  ASSERT_EQ(by_id.size(), 3u);
  EXPECT_EQ(by_id["a"]["response"]["body"]["choices"][0]["token_ids"], json({3, 2, 1}));
  EXPECT_EQ(by_id["f"]["response"]["body"]["choices"][0]["token_ids"], json({9, 8, 7}));
  EXPECT_EQ(by_id["b"]["response"]["body"]["model"], "tiny");
  const std::string all_errors = absl::StrJoin(errors, "\n");
  EXPECT_THAT(all_errors, HasSubstr("line 2: not valid JSON"));
  EXPECT_THAT(all_errors, HasSubstr("line 4: duplicate custom_id 'a' (first used on line 1)"));
  EXPECT_THAT(all_errors, HasSubstr("line 5: token id 100 is outside the vocabulary"));
  EXPECT_THAT(all_errors, HasSubstr("line 6: the model has no tokenizer"));
  EXPECT_THAT(all_errors, HasSubstr("line 7: url \"/v1/edits\" is not served"));
}

TEST_F(JobManagerTest, GroupSpansWorkersAndLoadIsSpread) {
  AddWorker("w1", 1, 1);
  AddWorker("w2", 2, 2);
  ServeWhenConfigured({{"w1", 1}, {"w2", 2}}, 1);
  auto configured = workers_.configured();
  ASSERT_EQ(configured.size(), 2u);
  EXPECT_EQ(configured[0].second.world_size(), 3);
  EXPECT_EQ(configured[0].second.first_rank(), 0);
  EXPECT_EQ(configured[1].second.first_rank(), 1);
  EXPECT_EQ(configured[1].second.root_address(), "127.0.0.1:9999");
  std::vector<std::string> lines;
  for (int i = 0; i < 6; ++i) lines.push_back(Line(absl::StrCat("r", i), "[1, 2, 3]"));
  auto id = Submit("", absl::StrJoin(lines, "\n"));
  ASSERT_TRUE(id.ok());
  auto items = workers_.Take(6);
  std::map<int, int> per_rank;
  for (const auto& [address, item] : items) ++per_rank[item.rank()];
  EXPECT_EQ(per_rank, (std::map<int, int>{{0, 2}, {1, 2}, {2, 2}}));
}

// Prefix-aware routing: of requests sharing a prefix, the first goes out alone (the least
// loaded rank) and the others follow it there once its prefill is done (a token generated);
// the job's summary counts prompt, cached and per-rank tokens.
TEST_F(JobManagerTest, RequestsSharingAPrefixWaitForTheFirstAndFollowItToItsRank) {
  AddWorker("w1", 1, 2);
  ASSERT_TRUE(WaitFor([&] { return !workers_.configured().empty(); }));
  WorkerReport report;
  report.group_generation = 1;
  report.group_status = GROUP_SERVING;
  for (int r = 0; r < 2; ++r) {
    RankLoad load;
    load.set_rank(r);
    load.set_prefix_cache_root(12345);  // the ranks cache prefixes
    report.rank_loads.push_back(load);
  }
  ASSERT_TRUE(registry_.Heartbeat("w1", 1, registry_.coordinator_incarnation(), report).ok());
  // Two prefixes of 32 tokens (two blocks), three questions of 8 tokens each.
  std::vector<std::string> lines;
  for (int q = 0; q < 3; ++q) {
    for (int p = 0; p < 2; ++p) {
      std::vector<int> prompt;
      for (int i = 0; i < 32; ++i) prompt.push_back(1 + p * 40 + i % 30);
      for (int i = 0; i < 8; ++i) prompt.push_back(90 + q);
      lines.push_back(
          Line(absl::StrCat("p", p, "q", q), absl::StrCat("[", absl::StrJoin(prompt, ","), "]")));
    }
  }
  auto id = Submit("", absl::StrJoin(lines, "\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  auto leaders = workers_.Take(2);
  ASSERT_EQ(leaders.size(), 2u);
  absl::SleepFor(absl::Milliseconds(50));  // ten ticks: the others still wait
  EXPECT_TRUE(workers_.Take(0).empty());
  // Line numbers are 2q + p + 1: the prefix of a request is (line - 1) % 2.
  auto prefix_of = [](const WorkItem& item) {
    return (std::stoi(item.request_id().substr(item.request_id().rfind(':') + 1)) - 1) % 2;
  };
  std::map<int, int> rank_of;  // prefix -> rank of its first request
  google::protobuf::RepeatedPtrField<RequestProgress> progress;
  for (const auto& [address, item] : leaders) {
    rank_of[prefix_of(item)] = item.rank();
    RequestProgress* p = progress.Add();
    p->set_request_id(item.request_id());
    p->set_generated_tokens(1);
  }
  ASSERT_EQ(rank_of.size(), 2u);                                  // one request of each prefix
  EXPECT_NE(leaders[0].second.rank(), leaders[1].second.rank());  // least loaded first
  manager_->OnProgress("w1", 1, progress);
  auto followers = workers_.Take(4);
  ASSERT_EQ(followers.size(), 4u);
  std::vector<RequestResult> results;
  for (const auto& [address, item] : leaders) results.push_back(ResultFor(item));
  for (const auto& [address, item] : followers) {
    EXPECT_EQ(item.rank(), rank_of[prefix_of(item)]) << item.request_id();
    RequestResult r = ResultFor(item);
    r.set_cached_prompt_tokens(32);
    results.push_back(r);
  }
  ASSERT_TRUE(manager_->OnResults(results).ok());
  const Job job = GetJob(*id);
  EXPECT_EQ(job.state(), Job::COMPLETED);
  EXPECT_EQ(job.prompt_tokens(), 6 * 40);
  EXPECT_EQ(job.cached_prompt_tokens(), 4 * 32);
  // Each rank ran one prefix's three requests: 3 x (40 prompt + 40 "generated" tokens).
  EXPECT_THAT(job.rank_tokens(), ::testing::ElementsAre(240, 240));
}

TEST_F(JobManagerTest, ExpertPlacementsGoToNewGroupsAndLiveToTheServingOne) {
  ExpertBalancerConfig eplb;
  eplb.num_logical = 4;
  eplb.num_redundant = 2;
  auto initial = ExpertPlacement::FromPhy2Log({{0, 1, 2, 3, 0, 1}}, 4);
  ASSERT_TRUE(initial.ok());
  eplb.initial = std::make_shared<const ExpertPlacement>(*initial);
  StartManager(2, eplb);
  AddWorker("w1", 1, 1);
  AddWorker("w2", 2, 1);
  ServeWhenConfigured({{"w1", 1}, {"w2", 2}}, 1);
  auto configured = workers_.configured();
  ASSERT_EQ(configured.size(), 2u);
  for (const auto& [address, c] : configured) {
    EXPECT_EQ(c.placement().epoch(), 1u);
    EXPECT_EQ(*PlacementFromProto(c.placement()), *initial);
  }
  ASSERT_TRUE(WaitFor([&] { return manager_->group().serving; }));
  auto next = std::make_shared<const ExpertPlacement>(
      *ExpertPlacement::FromPhy2Log({{3, 2, 1, 0, 3, 3}}, 4));
  // The scheduler thread calls `record`; what it records is shared with it, as the manager
  // (and a callback not called yet) outlives this body.
  struct Recorded {
    absl::Mutex mu;
    std::vector<absl::StatusOr<uint64_t>> done ABSL_GUARDED_BY(mu);
  };
  auto recorded = std::make_shared<Recorded>();
  auto record = [recorded](absl::StatusOr<uint64_t> r) {
    absl::MutexLock lock(&recorded->mu);
    recorded->done.push_back(r);
  };
  manager_->ApplyPlacement(next, 7, record);  // not the serving generation
  manager_->ApplyPlacement(next, 1, record);
  std::vector<absl::StatusOr<uint64_t>> done;
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock lock(&recorded->mu);
    done = recorded->done;
    return done.size() == 2;
  }));
  EXPECT_TRUE(absl::IsFailedPrecondition(done[0].status())) << done[0].status();
  ASSERT_TRUE(done[1].ok()) << done[1].status();
  EXPECT_EQ(*done[1], 2u);
  auto sent = workers_.placements();
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[0].first, "w1:1");
  EXPECT_EQ(sent[1].first, "w2:1");
  for (const auto& [address, r] : sent) {
    EXPECT_EQ(r.generation(), 1u);
    EXPECT_EQ(r.placement().epoch(), 2u);
    EXPECT_EQ(*PlacementFromProto(r.placement()), *next);
  }
  // A group formed later starts with the newest placement.
  EXPECT_EQ(balancer_->SpecForGroup(2).epoch(), 2u);
}

// Heartbeat of global rank `rank` with 10 steps of counts for 1 layer of 4 experts.
HeartbeatRequest LoadBeat(int rank, std::vector<int64_t> counts) {
  HeartbeatRequest hb;
  ExpertLoadReport* r = hb.add_expert_loads();
  r->set_rank(rank);
  r->set_group_generation(1);
  r->set_num_steps(10);
  r->set_num_layers(1);
  r->set_num_experts(4);
  for (int64_t c : counts) r->add_counts(c);
  return hb;
}

TEST_F(JobManagerTest, AutomaticRebalanceOnlyAboveTheThreshold) {
  ExpertBalancerConfig eplb;
  eplb.num_logical = 4;
  eplb.num_redundant = 2;
  eplb.interval_steps = 10;
  eplb.balance_threshold = 1.05;
  StartManager(2, eplb);
  AddWorker("w1", 1, 1);
  AddWorker("w2", 2, 1);
  ServeWhenConfigured({{"w1", 1}, {"w2", 2}}, 1);
  ASSERT_TRUE(WaitFor([&] { return manager_->group().serving; }));
  // Balanced (experts {0,1} and {2,3} carry the same): checked, skipped.
  balancer_->OnHeartbeat("w1", LoadBeat(0, {50, 50, 50, 50}));
  ASSERT_TRUE(WaitFor([&] { return !balancer_->AutoRebalanceDue(); }));
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_TRUE(workers_.placements().empty());
  // Skewed: expert 0 carries most; the next interval sends a placement to both workers.
  balancer_->OnHeartbeat("w1", LoadBeat(0, {900, 20, 20, 20}));
  balancer_->OnHeartbeat("w2", LoadBeat(1, {900, 20, 20, 20}));
  ASSERT_TRUE(WaitFor([&] { return workers_.placements().size() == 2; }));
  auto sent = workers_.placements();
  EXPECT_EQ(sent[0].second.placement().epoch(), 1u);
  auto placement = PlacementFromProto(sent[0].second.placement());
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->num_physical(), 6);
  EXPECT_GE(placement->logcnt()[0][0], 2);  // the hot expert got a replica
}

// Why forming failed is kept as GroupView::formation_error (ClusterStatus shows it) until a
// group serves; a member that fails once its group served is not a formation error.
TEST_F(JobManagerTest, FormationErrorsAreKeptUntilAGroupServes) {
  AddWorker("w1", 1, 1);
  ASSERT_TRUE(WaitFor([&] { return !workers_.configured().empty(); }));
  EXPECT_EQ(manager_->group().formation_error, "");
  WorkerReport failed;
  failed.group_generation = 1;
  failed.group_status = GROUP_FAILED;
  failed.group_error = "rank 0: RESOURCE_EXHAUSTED: the model does not fit";
  ASSERT_TRUE(registry_.Heartbeat("w1", 1, registry_.coordinator_incarnation(), failed).ok());
  ASSERT_TRUE(WaitFor([&] { return !manager_->group().formation_error.empty(); }));
  EXPECT_EQ(manager_->group().formation_error,
            "worker w1 reports the group failed: rank 0: RESOURCE_EXHAUSTED: the model does not "
            "fit");
  EXPECT_FALSE(manager_->group().serving);
  // The next attempt, after the regroup delay, serves.
  clock_.Advance(absl::Seconds(7));
  ASSERT_TRUE(registry_.Heartbeat("w1", 1, registry_.coordinator_incarnation()).ok());
  ServeWhenConfigured({{"w1", 1}}, 2);
  ASSERT_TRUE(WaitFor([&] { return manager_->group().serving; }));
  EXPECT_EQ(manager_->group().formation_error, "");
  failed.group_generation = 2;
  failed.group_error = "rank 0: UNAVAILABLE: peer died";
  ASSERT_TRUE(registry_.Heartbeat("w1", 1, registry_.coordinator_incarnation(), failed).ok());
  ASSERT_TRUE(WaitFor([&] { return !manager_->group().serving; }));
  EXPECT_THAT(manager_->group().last_error, HasSubstr("peer died"));
  EXPECT_EQ(manager_->group().formation_error, "");
}

TEST_F(JobManagerTest, LostWorkerRequestsRunAgainExactlyOnce) {
  AddWorker("w1", 1, 1);
  AddWorker("w2", 2, 1);
  ServeWhenConfigured({{"w1", 1}, {"w2", 2}}, 1);
  std::vector<std::string> lines = NumberedLines(8);
  auto id = Submit("", absl::StrJoin(lines, "\n"));
  ASSERT_TRUE(id.ok());
  auto first = workers_.Take(8);
  // w1 finishes its share; w2 finishes one and then dies.
  std::vector<RequestResult> done;
  const WorkItem* w2_done = nullptr;
  for (const auto& [address, item] : first) {
    if (address == "w1:1") done.push_back(ResultFor(item));
    if (address == "w2:1" && w2_done == nullptr) w2_done = &item;
  }
  ASSERT_NE(w2_done, nullptr);
  done.push_back(ResultFor(*w2_done));
  ASSERT_TRUE(manager_->OnResults(done).ok());
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(registry_.Heartbeat("w1", 1, 77).ok());
  registry_.ExpireStale();  // w2 is LOST
  ServeWhenConfigured({{"w1", 1}}, 2);
  auto second = workers_.Take(3);
  ASSERT_EQ(second.size(), 3u);
  std::vector<RequestResult> rest;
  for (const auto& [address, item] : second) {
    EXPECT_EQ(address, "w1:1");
    rest.push_back(ResultFor(item));
  }
  ASSERT_TRUE(manager_->OnResults(rest).ok());
  // A late result from the dead worker's first generation is a duplicate: ignored.
  ASSERT_TRUE(manager_->OnResults({ResultFor(*w2_done)}).ok());
  Job job = GetJob(*id);
  EXPECT_EQ(job.state(), Job::COMPLETED);
  EXPECT_EQ(job.completed_requests(), 8);
  std::set<std::string> ids;
  for (const json& line : Output(*id)) EXPECT_TRUE(ids.insert(line["custom_id"]).second);
  EXPECT_EQ(ids.size(), 8u);
}

// A worker that deregisters (SIGTERM) is left out of the next group at once: no heartbeat
// timeout (the fake clock never moves) and no regroup delay, although the survivor reports
// the old group failed.
TEST_F(JobManagerTest, DeregisteredWorkerRequestsRunAgainAtOnce) {
  AddWorker("w1", 1, 1);
  AddWorker("w2", 2, 1);
  ServeWhenConfigured({{"w1", 1}, {"w2", 2}}, 1);
  std::vector<std::string> lines = NumberedLines(6);
  auto id = Submit("", absl::StrJoin(lines, "\n"));
  ASSERT_TRUE(id.ok());
  auto first = workers_.Take(6);
  ASSERT_EQ(first.size(), 6u);
  ASSERT_TRUE(registry_.Deregister("w2", 2, 77).ok());
  WorkerReport failed;
  failed.group_generation = 1;
  failed.group_status = GROUP_FAILED;
  failed.group_error = "peer closed the connection";
  ASSERT_TRUE(registry_.Heartbeat("w1", 1, 77, failed).ok());
  ServeWhenConfigured({{"w1", 1}}, 2);
  auto second = workers_.Take(6);  // every request again, all on w1
  ASSERT_EQ(second.size(), 6u);
  std::vector<RequestResult> results;
  for (const auto& [address, item] : second) {
    EXPECT_EQ(address, "w1:1");
    results.push_back(ResultFor(item));
  }
  ASSERT_TRUE(manager_->OnResults(results).ok());
  EXPECT_EQ(GetJob(*id).state(), Job::COMPLETED);
  std::set<std::string> ids;
  for (const json& line : Output(*id)) EXPECT_TRUE(ids.insert(line["custom_id"]).second);
  EXPECT_EQ(ids.size(), 6u);
  EXPECT_THAT(manager_->group().members, ElementsAre("w1"));
}

TEST_F(JobManagerTest, JoiningWorkerGetsANewGenerationAndWork) {
  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  std::vector<std::string> lines = NumberedLines(4);
  auto id = Submit("", absl::StrJoin(lines, "\n"));
  ASSERT_TRUE(id.ok());
  auto first = workers_.Take(4);  // all on w1, never answered: the group changes first
  AddWorker("w2", 2, 1);
  ServeWhenConfigured({{"w1", 1}, {"w2", 2}}, 2);
  auto second = workers_.Take(4);  // re-run on the new generation, spread over both
  std::set<std::string> addresses;
  std::vector<RequestResult> results;
  for (const auto& [address, item] : second) {
    addresses.insert(address);
    results.push_back(ResultFor(item));
  }
  EXPECT_EQ(addresses, (std::set<std::string>{"w1:1", "w2:1"}));
  ASSERT_TRUE(manager_->OnResults(results).ok());
  EXPECT_EQ(GetJob(*id).state(), Job::COMPLETED);
  EXPECT_EQ(Output(*id).size(), 4u);
}

TEST_F(JobManagerTest, FailedSubmitIsRequeued) {
  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  workers_.Refuse("w1:1");
  auto id = Submit("", Line("a", "[1]"));
  ASSERT_TRUE(id.ok());
  absl::SleepFor(absl::Milliseconds(50));
  workers_.Refuse("");
  auto items = workers_.Take(1);
  ASSERT_EQ(items.size(), 1u);
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[0].second)}).ok());
  EXPECT_EQ(GetJob(*id).state(), Job::COMPLETED);
}

TEST_F(JobManagerTest, CancelStopsTheJob) {
  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  auto id = Submit("", absl::StrJoin({Line("a", "[1]"), Line("b", "[2]")}, "\n"));
  ASSERT_TRUE(id.ok());
  auto items = workers_.Take(2);
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[0].second)}).ok());
  auto cancelled = manager_->Cancel(*id);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state(), Job::CANCELLED);
  EXPECT_EQ(workers_.cancelled().size(), 1u);
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[1].second)}).ok());  // too late: ignored
  EXPECT_EQ(GetJob(*id).completed_requests(), 1);
  EXPECT_EQ(Output(*id).size(), 1u);
}

TEST_F(JobManagerTest, SeveralChoicesRunAsOneRequestEachAndMakeOneLine) {
  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  // One line (a job's lines are split at newlines).
  const std::string three =
      R"({"custom_id": "a", "url": "/v1/completions", "body": {"prompt": [1, 2], "n": 3, )"
      R"("seed": 9, "max_tokens": 4, "return_token_ids": true}})";
  auto id = Submit("", absl::StrJoin({three, Line("b", "[5]")}, "\n"));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(GetJob(*id).total_requests(), 2);  // lines, not choices
  auto items = workers_.Take(4);
  ASSERT_EQ(items.size(), 4u);
  std::map<std::string, WorkItem> by_id;
  for (const auto& [address, item] : items) by_id[item.request_id()] = item;
  const std::string line1 = absl::StrCat(*id, ":1");
  ASSERT_EQ(by_id.count(line1 + "/0") + by_id.count(line1 + "/1") + by_id.count(line1 + "/2"), 3u);
  EXPECT_EQ(by_id[line1 + "/0"].params().seed(), 9u);
  EXPECT_EQ(by_id[line1 + "/1"].params().seed(), ChoiceSeed(9, 1));
  EXPECT_EQ(by_id[line1 + "/2"].params().seed(), ChoiceSeed(9, 2));
  auto choice_result = [&](int c) {
    RequestResult r = ResultFor(by_id[absl::StrCat(line1, "/", c)]);
    r.add_token_ids(10 + c);  // tells the choices apart
    return r;
  };
  // Two of three choices in: no line yet.
  ASSERT_TRUE(manager_->OnResults({choice_result(2), choice_result(0)}).ok());
  ASSERT_TRUE(manager_->OnResults({ResultFor(by_id[absl::StrCat(*id, ":2")])}).ok());
  EXPECT_EQ(Output(*id).size(), 1u);
  EXPECT_EQ(GetJob(*id).state(), Job::RUNNING);
  ASSERT_TRUE(manager_->OnResults({choice_result(1)}).ok());
  ASSERT_TRUE(manager_->OnResults({choice_result(1)}).ok());  // a resend changes nothing
  EXPECT_EQ(GetJob(*id).state(), Job::COMPLETED);
  std::vector<json> out = Output(*id);
  ASSERT_EQ(out.size(), 2u);
  const json& a = out[0]["custom_id"] == "a" ? out[0] : out[1];
  const json& body = a["response"]["body"];
  ASSERT_EQ(body["choices"].size(), 3u);
  for (int c = 0; c < 3; ++c) {
    EXPECT_EQ(body["choices"][c]["index"], c);
    EXPECT_EQ(body["choices"][c]["token_ids"], json({2, 1, 10 + c}));
  }
  EXPECT_EQ(body["usage"]["completion_tokens"], 9);
  EXPECT_EQ(a["response"]["request_id"], line1);
}

TEST_F(JobManagerTest, AFailedChoiceFailsItsLine) {
  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  auto id = Submit(
      "", R"({"custom_id": "a", "url": "/v1/completions", "body": {"prompt": [1], "n": 2}})");
  ASSERT_TRUE(id.ok()) << id.status();
  auto items = workers_.Take(2);
  ASSERT_EQ(items.size(), 2u);
  RequestResult failed;
  failed.set_request_id(absl::StrCat(*id, ":1/1"));
  failed.set_error_code("INVALID_ARGUMENT");
  failed.set_error_message("bad");
  ASSERT_TRUE(manager_->OnResults({failed}).ok());
  EXPECT_EQ(GetJob(*id).state(), Job::COMPLETED);
  for (const auto& [address, item] : items) {
    ASSERT_TRUE(manager_->OnResults({ResultFor(item)}).ok());  // too late: ignored
  }
  std::vector<json> out = Output(*id);
  ASSERT_EQ(out.size(), 1u);
  EXPECT_EQ(out[0]["error"]["message"], "choice 1: bad");
  EXPECT_EQ(GetJob(*id).failed_requests(), 1);
}

TEST_F(JobManagerTest, ResumesAfterRestartWithoutDuplicates) {
  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  std::vector<std::string> lines = NumberedLines(4);
  lines.push_back("not json");
  auto id = Submit("", absl::StrJoin(lines, "\n"));
  ASSERT_TRUE(id.ok());
  auto items = workers_.Take(4);
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[0].second), ResultFor(items[1].second)}).ok());
  // The coordinator restarts: a new manager over the same store.
  StartManager();
  auto again = workers_.Take(2);
  ASSERT_EQ(again.size(), 2u);
  std::vector<RequestResult> rest;
  for (const auto& [address, item] : again) rest.push_back(ResultFor(item));
  ASSERT_TRUE(manager_->OnResults(rest).ok());
  Job job = GetJob(*id);
  EXPECT_EQ(job.state(), Job::COMPLETED);
  EXPECT_EQ(job.completed_requests(), 4);
  EXPECT_EQ(job.failed_requests(), 1);
  EXPECT_EQ(Output(*id).size(), 5u);
}

TEST_F(JobManagerTest, HostileLinesGetErrorLinesAtSubmitAndAfterARestart) {
  const std::string deep = absl::StrCat(std::string(30000, '['), std::string(30000, ']'));
  const std::string input = absl::StrJoin(
      {Line("deep-prompt", deep),
       absl::StrCat(R"({"custom_id": "deep-chat", "url": "/v1/chat/completions", "body": )",
                    R"({"messages": [{"role": "user", "content": )", deep, "}]}}"),
       Line("nul", "[1]") + std::string("\0{\"x\": 1}", 9), Line("ok", "[1, 2]")},
      "\n");
  auto id = Submit("hostile", input);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(GetJob(*id).failed_requests(), 3);
  // Restarted while the good line waits: the error lines are not answered twice.
  StartManager();
  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  auto items = workers_.Take(1);
  ASSERT_EQ(items.size(), 1u);
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[0].second)}).ok());
  Job job = GetJob(*id);
  EXPECT_EQ(job.state(), Job::COMPLETED);
  EXPECT_EQ(job.completed_requests(), 1);
  EXPECT_EQ(job.failed_requests(), 3);
  std::string errors;
  for (const json& line : Output(*id)) {
    if (!line["error"].is_null()) errors += line["error"]["message"].get<std::string>() + "\n";
  }
  EXPECT_THAT(errors, HasSubstr("line 1: nested more than 64 levels deep"));
  EXPECT_THAT(errors, HasSubstr("line 2: nested more than 64 levels deep"));
  EXPECT_THAT(errors, HasSubstr("line 3: a NUL byte at byte"));
}

TEST_F(JobManagerTest, LeavesOutWorkersWhoseRanksDoNotDivideTheExperts) {
  PromptBuilder eight_experts(ModelLimits{100, 64, 8}, nullptr, nullptr);
  manager_.reset();
  JobManagerConfig config;
  config.settle = absl::ZeroDuration();
  config.tick = absl::Milliseconds(5);
  manager_ = std::make_unique<JobManager>(store_.get(), &eight_experts, &registry_, &workers_,
                                          &clock_, config);
  ASSERT_TRUE(manager_->Start().ok());
  AddWorker("w1", 1, 2);
  AddWorker("w2", 2, 1);  // 3 ranks do not divide 8 experts: w2 waits as a spare
  ServeWhenConfigured({{"w1", 1}}, 1);
  auto configured = workers_.configured();
  ASSERT_EQ(configured.size(), 1u);
  EXPECT_EQ(configured[0].first, "w1:1");
  EXPECT_EQ(configured[0].second.world_size(), 2);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(workers_.configured().size(), 1u);  // stable: no re-forming in a loop
  // Clients see why w2 does nothing, with every unfinished job.
  auto id = Submit("", Line("a", "[1]"));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(GetJob(*id).cluster_notice(),
            "worker(s) w2 left out of the expert-parallel group, which uses 2 of the 3 READY "
            "ranks: 8 routed experts cannot be split over 3 ranks; rank counts that divide 8: 1, "
            "2, 4, 8");
  auto items = workers_.Take(1);
  ASSERT_EQ(items.size(), 1u);
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[0].second)}).ok());
  EXPECT_EQ(GetJob(*id).state(), Job::COMPLETED);
  EXPECT_EQ(GetJob(*id).cluster_notice(), "");  // finished jobs carry none
  manager_.reset();
}

TEST_F(JobManagerTest, SaysWhyNoGroupCanForm) {
  PromptBuilder eight_experts(ModelLimits{100, 64, 8}, nullptr, nullptr);
  manager_.reset();
  JobManagerConfig config;
  config.settle = absl::ZeroDuration();
  config.tick = absl::Milliseconds(5);
  manager_ = std::make_unique<JobManager>(store_.get(), &eight_experts, &registry_, &workers_,
                                          &clock_, config);
  ASSERT_TRUE(manager_->Start().ok());
  auto id = Submit("", Line("a", "[1]"));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(GetJob(*id).cluster_notice(), "");  // no worker yet: nothing to explain
  AddWorker("w1", 1, 3);
  const std::string want =
      "no expert-parallel group serving: the 1 READY worker(s) cannot form one: 8 routed experts "
      "cannot be split over 3 ranks; rank counts that divide 8: 1, 2, 4, 8";
  ASSERT_TRUE(WaitFor([&] { return GetJob(*id).cluster_notice() == want; }))
      << GetJob(*id).cluster_notice();
  EXPECT_TRUE(workers_.configured().empty());
  manager_.reset();
}

TEST_F(JobManagerTest, RunningRequestsReportTheirTokensBeforeTheyFinish) {
  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  auto id = Submit("", absl::StrJoin({Line("a", "[1, 2]"), Line("b", "[3]")}, "\n"));
  ASSERT_TRUE(id.ok());
  auto items = workers_.Take(2);
  ASSERT_EQ(items.size(), 2u);
  Job job = GetJob(*id);
  EXPECT_EQ(job.running_requests(), 2);
  EXPECT_EQ(job.running_generated_tokens(), 0);
  EXPECT_EQ(job.unfinished_max_tokens(), 8);  // max_tokens 4 each
  auto progress = [&](const std::string& worker, uint64_t generation, int64_t a, int64_t b) {
    HeartbeatRequest hb;
    RequestProgress* p = hb.add_request_progress();
    p->set_request_id(items[0].second.request_id());
    p->set_generated_tokens(a);
    p = hb.add_request_progress();
    p->set_request_id(items[1].second.request_id());
    p->set_generated_tokens(b);
    manager_->OnProgress(worker, generation, hb.request_progress());
  };
  progress("w1", 1, 3, 1);
  job = GetJob(*id);
  EXPECT_EQ(job.running_generated_tokens(), 4);
  EXPECT_EQ(job.completed_requests(), 0);
  progress("w2", 1, 4, 4);  // not the worker running them
  progress("w1", 2, 4, 4);  // not their generation
  EXPECT_EQ(GetJob(*id).running_generated_tokens(), 4);
  // One finishes: its tokens move from running to finished, its max_tokens leave the bound.
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[0].second)}).ok());
  job = GetJob(*id);
  EXPECT_EQ(job.running_requests(), 1);
  EXPECT_EQ(job.running_generated_tokens(), 1);
  EXPECT_EQ(job.generated_tokens(), items[0].second.prompt_token_ids_size());
  EXPECT_EQ(job.unfinished_max_tokens(), 4);
  // A new group re-runs the other from the start: its count starts again from 0.
  AddWorker("w2", 2, 1);
  ServeWhenConfigured({{"w1", 1}, {"w2", 2}}, 2);
  ASSERT_EQ(workers_.Take(1).size(), 1u);
  job = GetJob(*id);
  EXPECT_EQ(job.running_requests(), 1);
  EXPECT_EQ(job.running_generated_tokens(), 0);
  manager_.reset();
}

TEST_F(JobManagerTest, WaitsForMinWorkers) {
  StartManager(/*min_workers=*/2);
  AddWorker("w1", 1, 1);
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_TRUE(workers_.configured().empty());
  AddWorker("w2", 2, 1);
  ServeWhenConfigured({{"w1", 1}, {"w2", 2}}, 1);
  EXPECT_EQ(workers_.configured()[0].second.world_size(), 2);
}

}  // namespace
}  // namespace deepinfer
