// Two deepinfer-worker processes form one expert-parallel group the way the coordinator forms
// it (PrepareGroup on the worker of rank 0, ConfigureGroup on both), serve requests whose
// results come back through ReportResults equal to GenerateGreedyOnCpu, and when one worker
// is SIGKILLed the other reports GROUP_FAILED in its heartbeats instead of hanging; a new
// generation of one rank then serves again.
#include <csignal>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/worker.grpc.pb.h"
#include "tests/testing/fake_cluster_service.h"
#include "tests/testing/subprocess.h"
#include "worker/model/cpu_generate.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::FakeClusterService;
using ::deepinfer::testing::Runfile;
using ::deepinfer::testing::Subprocess;
using ::deepinfer::testing::TempPath;
using ::deepinfer::testing::WaitUntil;
using ::testing::ElementsAreArray;

std::string Fixture() { return Runfile("tests/fixtures/dsv3_qlora_rope"); }

std::vector<std::vector<int32_t>> Prompts() {
  std::ifstream in(Fixture() + "/expected.json");
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

struct Worker {
  std::optional<Subprocess> process;
  std::unique_ptr<WorkerService::Stub> stub;
};

class WorkerGroupTest : public ::testing::Test {
 protected:
  Worker Start(const std::string& id) {
    Worker w;
    const std::string port_file = TempPath(id + ".port");
    auto p = Subprocess::Start(
        {Runfile("worker/deepinfer-worker"), absl::StrCat("--coordinator=127.0.0.1:", fake_.port()),
         "--worker-id=" + id, "--devices=cpu", "--model=" + Fixture(), "--port-file=" + port_file,
         "--threads=1", "--kv-cache-tokens=2048", "--collective-timeout-s=60"},
        TempPath(id));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return w;
    w.process.emplace(std::move(*p));
    int port = 0;
    const bool bound = WaitUntil(
        [&] {
          std::ifstream in(port_file);
          std::string text;
          return std::getline(in, text) && absl::SimpleAtoi(text, &port) && port > 0;
        },
        absl::Seconds(60));
    EXPECT_TRUE(bound) << w.process->ReadStderr();
    w.stub = WorkerService::NewStub(
        grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
    fake_.AwaitRegistered(id);
    return w;
  }

  grpc::Status Configure(Worker& w, uint64_t generation, int world, int first_rank,
                         const std::string& root) {
    ConfigureGroupRequest request;
    request.set_coordinator_incarnation(fake_.incarnation());
    request.set_generation(generation);
    request.set_group_incarnation(0xabc0 + generation);
    request.set_world_size(world);
    request.set_first_rank(first_rank);
    request.set_root_address(root);
    grpc::ClientContext context;
    ConfigureGroupResponse response;
    return w.stub->ConfigureGroup(&context, request, &response);
  }

  grpc::Status Submit(Worker& w, uint64_t generation, const std::vector<WorkItem>& items) {
    SubmitRequestsRequest request;
    request.set_coordinator_incarnation(fake_.incarnation());
    request.set_generation(generation);
    for (const WorkItem& item : items) *request.add_items() = item;
    grpc::ClientContext context;
    SubmitRequestsResponse response;
    return w.stub->SubmitRequests(&context, request, &response);
  }

  static WorkItem Item(const std::string& id, int rank, const std::vector<int32_t>& prompt) {
    WorkItem item;
    item.set_request_id(id);
    item.set_rank(rank);
    item.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    item.mutable_params()->set_max_tokens(12);
    item.mutable_params()->set_seed(3);
    item.mutable_params()->set_logprobs(-1);
    return item;
  }

  FakeClusterService fake_;
};

TEST_F(WorkerGroupTest, TwoProcessesServeTogetherAndAKilledPeerFailsTheGroup) {
  const auto prompts = Prompts();
  ASSERT_EQ(prompts.size(), 4u);
  Worker w0 = Start("w0");
  Worker w1 = Start("w1");
  ASSERT_TRUE(w0.process && w1.process);
  EXPECT_EQ(fake_.last_register().num_ranks(), 1);

  PrepareGroupRequest prepare;
  prepare.set_coordinator_incarnation(fake_.incarnation());
  prepare.set_generation(1);
  PrepareGroupResponse prepared;
  grpc::ClientContext prepare_context;
  ASSERT_TRUE(w0.stub->PrepareGroup(&prepare_context, prepare, &prepared).ok());
  ASSERT_TRUE(Configure(w0, 1, 2, 0, prepared.root_address()).ok());
  ASSERT_TRUE(Configure(w1, 1, 2, 1, prepared.root_address()).ok());
  HeartbeatRequest hb0 = fake_.AwaitGroup("w0", 1);
  ASSERT_EQ(hb0.group_status(), GROUP_SERVING) << hb0.group_error();
  ASSERT_EQ(fake_.AwaitGroup("w1", 1).group_status(), GROUP_SERVING);

  std::vector<WorkItem> on0, on1;
  for (size_t i = 0; i < prompts.size(); ++i) {
    (i % 2 == 0 ? on0 : on1).push_back(Item(absl::StrCat("r", i), i % 2, prompts[i]));
  }
  ASSERT_TRUE(Submit(w0, 1, on0).ok());
  ASSERT_TRUE(Submit(w1, 1, on1).ok());
  auto results = fake_.AwaitResults(4);
  for (size_t i = 0; i < prompts.size(); ++i) {
    const RequestResult& r = results[absl::StrCat("r", i)];
    auto reference = GenerateGreedyOnCpu(Fixture(), prompts[i], 12, 1);
    ASSERT_TRUE(reference.ok()) << reference.status();
    EXPECT_THAT(std::vector<int32_t>(r.token_ids().begin(), r.token_ids().end()),
                ElementsAreArray(*reference));
    EXPECT_EQ(r.group_generation(), 1u);
  }

  // Kill rank 1's process: rank 0 must fail, not hang.
  w1.process->Signal(SIGKILL);
  ASSERT_TRUE(w1.process->Wait(absl::Seconds(30)).ok());
  HeartbeatRequest failed = fake_.AwaitStatus("w0", 1, GROUP_FAILED);
  EXPECT_THAT(failed.group_error(), ::testing::HasSubstr("rank 0"));
  EXPECT_EQ(Submit(w0, 1, {Item("late", 0, prompts[0])}).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);

  // The coordinator forms a smaller group; the survivor serves it.
  ASSERT_TRUE(Configure(w0, 2, 1, 0, "").ok());
  ASSERT_EQ(fake_.AwaitGroup("w0", 2).group_status(), GROUP_SERVING);
  ASSERT_TRUE(Submit(w0, 2, {Item("again", 0, prompts[1])}).ok());
  auto again = fake_.AwaitResults(5)["again"];
  EXPECT_THAT(again.token_ids(), ElementsAreArray(results["r1"].token_ids()));
  EXPECT_EQ(again.group_generation(), 2u);

  w0.process->Signal(SIGTERM);
  auto exit_code = w0.process->Wait(absl::Seconds(60));
  ASSERT_TRUE(exit_code.ok());
  EXPECT_EQ(*exit_code, 0) << w0.process->ReadStderr();
}

}  // namespace
}  // namespace deepinfer
