// A WorkerServer against an in-process CoordinatorServer: registration, READY, the
// worker's own service, a coordinator restart, and a refused token.
#include "worker/worker_server.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

constexpr char kToken[] = "t0ken";

// Polls `done` every 10 ms for up to 30 s (generous: CI machines are slow).
template <typename F>
bool WaitFor(F done) {
  for (int i = 0; i < 3000; ++i) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

WorkerState StateOf(CoordinatorServer* coordinator, const std::string& id) {
  for (const auto& w : coordinator->registry()->Snapshot()) {
    if (w.registration.worker_id == id) return w.state;
  }
  return WORKER_STATE_UNSPECIFIED;
}

CoordinatorConfig FastCoordinator(int port, const std::string& token) {
  CoordinatorConfig config;
  config.port = port;
  config.auth_token = token;
  config.heartbeat_interval = absl::Milliseconds(50);
  config.heartbeat_timeout = absl::Seconds(2);
  return config;
}

WorkerConfig MakeWorker(int coordinator_port, const std::string& token) {
  WorkerConfig config;
  config.coordinator_address = absl::StrCat("127.0.0.1:", coordinator_port);
  config.auth_token = token;
  config.node_name = "test-node";
  Device cpu;
  cpu.set_kind(Device::CPU);
  config.devices.push_back(cpu);
  return config;
}

TEST(WorkerServerTest, RegistersBecomesReadyAndFollowsCoordinatorRestart) {
  auto coordinator = CoordinatorServer::Start(FastCoordinator(0, kToken));
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const int port = (*coordinator)->port();
  const uint64_t first_incarnation = (*coordinator)->incarnation();

  auto worker = WorkerServer::Start(MakeWorker(port, kToken));
  ASSERT_TRUE(worker.ok()) << worker.status();
  const std::string id = (*worker)->worker_id();
  EXPECT_EQ(id, absl::StrCat("test-node:", (*worker)->port()));
  ASSERT_TRUE(WaitFor([&] { return StateOf(coordinator->get(), id) == READY; }));

  // The worker's own service reports the registration, and wants the token too.
  auto stub = WorkerService::NewStub(grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", (*worker)->port()), grpc::InsecureChannelCredentials()));
  {
    grpc::ClientContext context;
    AttachAuthToken(kToken, &context);
    GetWorkerInfoResponse info;
    ASSERT_TRUE(stub->GetWorkerInfo(&context, GetWorkerInfoRequest(), &info).ok());
    EXPECT_EQ(info.worker_id(), id);
    EXPECT_TRUE(info.registered());
    EXPECT_EQ(info.coordinator_incarnation(), first_incarnation);
  }
  {
    grpc::ClientContext context;
    GetWorkerInfoResponse info;
    EXPECT_EQ(stub->GetWorkerInfo(&context, GetWorkerInfoRequest(), &info).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }

  // Restart the coordinator on the same port: a new incarnation that knows nobody.
  coordinator->reset();
  auto restarted = CoordinatorServer::Start(FastCoordinator(port, kToken));
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_NE((*restarted)->incarnation(), first_incarnation);
  ASSERT_TRUE(WaitFor([&] { return StateOf(restarted->get(), id) == READY; }));
  EXPECT_EQ((*worker)->link_state().coordinator_incarnation, (*restarted)->incarnation());
  EXPECT_GE((*worker)->link_state().registrations, 2);
}

TEST(WorkerServerTest, WrongTokenNeverRegisters) {
  auto coordinator = CoordinatorServer::Start(FastCoordinator(0, kToken));
  ASSERT_TRUE(coordinator.ok());
  auto worker = WorkerServer::Start(MakeWorker((*coordinator)->port(), "not-the-token"));
  ASSERT_TRUE(worker.ok());
  ASSERT_TRUE(WaitFor([&] { return !(*worker)->link_state().last_error.empty(); }));
  EXPECT_THAT((*worker)->link_state().last_error, ::testing::HasSubstr("wrong auth token"));
  EXPECT_FALSE((*worker)->link_state().registered);
  EXPECT_TRUE((*coordinator)->registry()->Snapshot().empty());
}

TEST(WorkerServerTest, NeedsCoordinatorAndDevices) {
  WorkerConfig config = MakeWorker(1, "");
  config.coordinator_address.clear();
  EXPECT_EQ(WorkerServer::Start(config).status().code(), absl::StatusCode::kInvalidArgument);
  config = MakeWorker(1, "");
  config.devices.clear();
  EXPECT_EQ(WorkerServer::Start(config).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer
