// A WorkerServer with an engine, driven through its WorkerService like the coordinator drives
// it, against a fake ClusterService that records registrations, heartbeats and results:
//  * a 1-rank group: results arrive through ReportResults and equal GenerateGreedyOnCpu;
//  * a 2-rank group in one worker (TcpCommunicator on loopback) gives the same tokens;
//  * a refused ReportResults (the coordinator "restarted") is resent after re-registering;
//  * a dead peer turns into GROUP_FAILED in heartbeats, and a new generation serves again;
//  * stale generations and coordinators, and foreign ranks, are refused.
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/cluster.grpc.pb.h"
#include "proto/worker.grpc.pb.h"
#include "tests/testing/fake_cluster_service.h"
#include "worker/comm/tcp_communicator.h"
#include "worker/model/cpu_generate.h"
#include "worker/worker_server.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAreArray;

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope";
}

std::vector<std::vector<int32_t>> FixturePrompts() {
  std::ifstream in(FixtureDir() + "/expected.json");
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, false);
  std::vector<std::vector<int32_t>> out;
  if (!j.is_object() || !j.contains("prompts")) return out;
  for (const auto& p : j["prompts"]) {
    std::vector<int32_t> ids;
    for (const auto& v : p["ids"]) ids.push_back(v.get<int32_t>());
    out.push_back(ids);
  }
  return out;
}

class WorkerEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    prompts_ = FixturePrompts();
    ASSERT_EQ(prompts_.size(), 4u);
  }

  std::unique_ptr<WorkerServer> NewWorker(int ranks, const std::string& id) {
    WorkerConfig config;
    config.worker_id = id;
    config.coordinator_address = absl::StrCat("127.0.0.1:", fake_.port());
    config.node_name = "test-node";
    Device cpu;
    cpu.set_kind(Device::CPU);
    config.devices.push_back(cpu);
    config.engine.model = FixtureDir();
    config.engine.num_ranks = ranks;
    config.engine.kv_cache_tokens = 2048;
    config.engine.collective_timeout = absl::Seconds(60);
    auto worker = WorkerServer::Start(config);
    EXPECT_TRUE(worker.ok()) << worker.status();
    if (!worker.ok()) return nullptr;
    return std::move(*worker);
  }

  static std::unique_ptr<WorkerService::Stub> StubOf(const WorkerServer& worker) {
    return WorkerService::NewStub(grpc::CreateChannel(absl::StrCat("127.0.0.1:", worker.port()),
                                                      grpc::InsecureChannelCredentials()));
  }

  void StartWorker(int ranks) {
    worker_ = NewWorker(ranks, "w0");
    ASSERT_NE(worker_, nullptr);
    stub_ = StubOf(*worker_);
    fake_.AwaitRegistered("w0");
  }

  grpc::Status Configure(uint64_t generation, int world, int first_rank,
                         const std::string& root = "", WorkerService::Stub* stub = nullptr) {
    ConfigureGroupRequest request;
    request.set_coordinator_incarnation(fake_.incarnation());
    request.set_generation(generation);
    request.set_group_incarnation(generation * 77 + 1);
    request.set_world_size(world);
    request.set_first_rank(first_rank);
    request.set_root_address(root);
    grpc::ClientContext context;
    ConfigureGroupResponse response;
    return (stub != nullptr ? stub : stub_.get())->ConfigureGroup(&context, request, &response);
  }

  std::string Prepare(uint64_t generation) {
    PrepareGroupRequest request;
    request.set_coordinator_incarnation(fake_.incarnation());
    request.set_generation(generation);
    grpc::ClientContext context;
    PrepareGroupResponse response;
    grpc::Status s = stub_->PrepareGroup(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response.root_address();
  }

  grpc::Status Submit(uint64_t generation, std::vector<WorkItem> items, uint64_t incarnation = 0,
                      WorkerService::Stub* stub = nullptr) {
    SubmitRequestsRequest request;
    request.set_coordinator_incarnation(incarnation != 0 ? incarnation : fake_.incarnation());
    request.set_generation(generation);
    for (WorkItem& item : items) *request.add_items() = std::move(item);
    grpc::ClientContext context;
    SubmitRequestsResponse response;
    return (stub != nullptr ? stub : stub_.get())->SubmitRequests(&context, request, &response);
  }

  std::vector<WorkItem> GreedyItems(int ranks, const std::string& prefix = "r") {
    std::vector<WorkItem> items;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      WorkItem item;
      item.set_request_id(absl::StrCat(prefix, i));
      item.set_rank(i % ranks);
      item.mutable_prompt_token_ids()->Add(prompts_[i].begin(), prompts_[i].end());
      item.mutable_params()->set_max_tokens(16);
      item.mutable_params()->set_seed(5);
      item.mutable_params()->set_logprobs(-1);
      items.push_back(item);
    }
    return items;
  }

  void ExpectGreedy(const std::map<std::string, RequestResult>& results,
                    const std::string& prefix = "r") {
    for (size_t i = 0; i < prompts_.size(); ++i) {
      auto it = results.find(absl::StrCat(prefix, i));
      ASSERT_NE(it, results.end());
      auto reference = GenerateGreedyOnCpu(FixtureDir(), prompts_[i], 16, 1);
      ASSERT_TRUE(reference.ok()) << reference.status();
      EXPECT_EQ(it->second.error_code(), "") << it->second.error_message();
      EXPECT_THAT(
          std::vector<int32_t>(it->second.token_ids().begin(), it->second.token_ids().end()),
          ElementsAreArray(*reference))
          << it->first;
      EXPECT_EQ(it->second.finish_reason(), "length");
    }
  }

  testing::FakeClusterService fake_;
  std::vector<std::vector<int32_t>> prompts_;
  std::unique_ptr<WorkerServer> worker_;
  std::unique_ptr<WorkerService::Stub> stub_;
};

TEST_F(WorkerEngineTest, OneRankGroupReportsGreedyResults) {
  StartWorker(1);
  EXPECT_EQ(fake_.last_register().num_ranks(), 1);
  // Nothing is accepted before a group exists.
  EXPECT_EQ(Submit(1, GreedyItems(1)).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(Configure(1, 1, 0).ok());
  HeartbeatRequest hb = fake_.AwaitGroup(worker_->worker_id(), 1);
  ASSERT_EQ(hb.group_status(), GROUP_SERVING) << hb.group_error();
  ASSERT_EQ(hb.rank_loads_size(), 1);
  EXPECT_EQ(hb.rank_loads(0).kv_blocks_total(), 2048 / 16);

  ASSERT_TRUE(Submit(1, GreedyItems(1)).ok());
  auto results = fake_.AwaitResults(4);
  ExpectGreedy(results);
  EXPECT_EQ(results["r0"].group_generation(), 1u);

  // Refusals: another generation, a stale coordinator, a rank not here, an older group.
  EXPECT_EQ(Submit(2, GreedyItems(1)).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Submit(1, GreedyItems(1), /*incarnation=*/12345).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Submit(1, GreedyItems(2)).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(Configure(1, 1, 0).ok());  // the same generation again: a retry, no change
  EXPECT_EQ(Configure(0, 1, 0).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_EQ(Configure(5, 3, 0).error_code(), grpc::StatusCode::INVALID_ARGUMENT);  // 8 experts
}

TEST_F(WorkerEngineTest, TwoRanksInOneWorkerGiveTheSameTokens) {
  StartWorker(2);
  EXPECT_EQ(fake_.last_register().num_ranks(), 2);
  const std::string root = Prepare(1);
  ASSERT_FALSE(root.empty());
  ASSERT_TRUE(Configure(1, 2, 0, root).ok());
  HeartbeatRequest hb = fake_.AwaitGroup(worker_->worker_id(), 1);
  ASSERT_EQ(hb.group_status(), GROUP_SERVING) << hb.group_error();
  ASSERT_EQ(hb.rank_loads_size(), 2);
  ASSERT_TRUE(Submit(1, GreedyItems(2)).ok());
  ExpectGreedy(fake_.AwaitResults(4));
}

TEST_F(WorkerEngineTest, ResultsAreResentAfterTheCoordinatorRestarts) {
  StartWorker(1);
  ASSERT_TRUE(Configure(1, 1, 0).ok());
  ASSERT_EQ(fake_.AwaitGroup(worker_->worker_id(), 1).group_status(), GROUP_SERVING);
  const int registrations = fake_.registrations();
  fake_.RefuseNextReports(1);
  ASSERT_TRUE(Submit(1, GreedyItems(1)).ok());
  ExpectGreedy(fake_.AwaitResults(4));
  EXPECT_GT(fake_.registrations(), registrations);
  EXPECT_EQ(worker_->undelivered_results(), 0u);
}

TEST_F(WorkerEngineTest, DeadPeerTurnsIntoGroupFailedAndANewGenerationServes) {
  StartWorker(1);
  const std::string root = Prepare(2);
  ASSERT_TRUE(Configure(2, 2, 0, root).ok());
  // This test is rank 1 of the group: join, pass the load barrier, then die.
  comm::TcpCommunicatorSpec spec;
  spec.rank = 1;
  spec.world_size = 2;
  spec.root_address = root;
  spec.group_incarnation = 2 * 77 + 1;
  auto peer = comm::TcpCommunicator::Create(spec);
  ASSERT_TRUE(peer.ok()) << peer.status();
  ASSERT_TRUE((*peer)->Barrier().ok());
  ASSERT_EQ(fake_.AwaitGroup(worker_->worker_id(), 2).group_status(), GROUP_SERVING);
  peer->reset();
  // The worker's rank notices at its next agreement round.
  HeartbeatRequest hb = fake_.AwaitStatus(worker_->worker_id(), 2, GROUP_FAILED);
  EXPECT_THAT(hb.group_error(), ::testing::HasSubstr("rank 0"));
  EXPECT_EQ(Submit(2, GreedyItems(1)).error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  // A new group of one serves again.
  ASSERT_TRUE(Configure(3, 1, 0).ok());
  ASSERT_EQ(fake_.AwaitGroup(worker_->worker_id(), 3).group_status(), GROUP_SERVING);
  ASSERT_TRUE(Submit(3, GreedyItems(1)).ok());
  ExpectGreedy(fake_.AwaitResults(4));
}

// Two workers of one rank each form a group of two, as the coordinator forms it: PrepareGroup
// on the worker of rank 0, then ConfigureGroup on both.
TEST_F(WorkerEngineTest, TwoWorkersFormOneGroup) {
  StartWorker(1);
  std::unique_ptr<WorkerServer> second = NewWorker(1, "w1");
  ASSERT_NE(second, nullptr);
  auto second_stub = StubOf(*second);
  fake_.AwaitRegistered("w1");
  const std::string root = Prepare(1);
  ASSERT_TRUE(Configure(1, 2, 0, root).ok());
  ASSERT_TRUE(Configure(1, 2, 1, root, second_stub.get()).ok());
  ASSERT_EQ(fake_.AwaitGroup("w0", 1).group_status(), GROUP_SERVING);
  HeartbeatRequest hb = fake_.AwaitGroup("w1", 1);
  ASSERT_EQ(hb.group_status(), GROUP_SERVING);
  ASSERT_EQ(hb.rank_loads_size(), 1);
  EXPECT_EQ(hb.rank_loads(0).rank(), 1);
  std::vector<WorkItem> items = GreedyItems(2);
  std::vector<WorkItem> mine, theirs;
  for (WorkItem& item : items) (item.rank() == 0 ? mine : theirs).push_back(item);
  // Each worker only takes its own ranks.
  EXPECT_EQ(Submit(1, theirs).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ASSERT_TRUE(Submit(1, mine).ok());
  ASSERT_TRUE(Submit(1, theirs, 0, second_stub.get()).ok());
  ExpectGreedy(fake_.AwaitResults(4));
}

}  // namespace
}  // namespace deepinfer
