// CoordinatorServer over real gRPC on loopback: registration, heartbeats, status,
// drain, and the auth token on every service.
#include "coordinator/coordinator_server.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/auth.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "proto/admin.grpc.pb.h"
#include "proto/cluster.grpc.pb.h"

namespace deepinfer {
namespace {

constexpr char kToken[] = "correct-horse";

class CoordinatorServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorConfig config;
    config.auth_token = kToken;
    config.heartbeat_interval = absl::Milliseconds(100);
    config.heartbeat_timeout = absl::Seconds(3);
    auto server = CoordinatorServer::Start(config, &clock_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                       grpc::InsecureChannelCredentials());
    cluster_ = ClusterService::NewStub(channel);
    admin_ = AdminService::NewStub(channel);
  }

  std::unique_ptr<grpc::ClientContext> Context(const std::string& token) {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    AttachAuthToken(token, context.get());
    return context;
  }

  RegisterRequest MakeRegister(const std::string& id, uint64_t incarnation) {
    RegisterRequest request;
    request.set_worker_id(id);
    request.set_worker_incarnation(incarnation);
    request.set_node_name("node");
    request.set_listen_address("127.0.0.1:9");
    request.add_devices()->set_kind(Device::CPU);
    return request;
  }

  FakeClock clock_;
  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<ClusterService::Stub> cluster_;
  std::unique_ptr<AdminService::Stub> admin_;
};

TEST_F(CoordinatorServerTest, RegisterHeartbeatStatus) {
  RegisterResponse registered;
  grpc::Status s = cluster_->Register(Context(kToken).get(), MakeRegister("w1", 11), &registered);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(registered.coordinator_incarnation(), server_->incarnation());
  EXPECT_EQ(registered.heartbeat_interval_ms(), 100);
  EXPECT_EQ(registered.heartbeat_timeout_ms(), 3000);

  HeartbeatRequest beat;
  beat.set_worker_id("w1");
  beat.set_worker_incarnation(11);
  beat.set_coordinator_incarnation(registered.coordinator_incarnation());
  HeartbeatResponse beat_response;
  s = cluster_->Heartbeat(Context(kToken).get(), beat, &beat_response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(beat_response.state(), READY);

  ClusterStatusResponse status;
  s = admin_->ClusterStatus(Context(kToken).get(), ClusterStatusRequest(), &status);
  ASSERT_TRUE(s.ok()) << s.error_message();
  ASSERT_EQ(status.workers_size(), 1);
  EXPECT_EQ(status.workers(0).worker_id(), "w1");
  EXPECT_EQ(status.workers(0).state(), READY);
  EXPECT_EQ(status.workers(0).devices(0).kind(), Device::CPU);
}

TEST_F(CoordinatorServerTest, HeartbeatErrorsTellTheWorkerToRegister) {
  HeartbeatRequest beat;
  beat.set_worker_id("nobody");
  beat.set_worker_incarnation(1);
  beat.set_coordinator_incarnation(server_->incarnation());
  HeartbeatResponse response;
  EXPECT_EQ(cluster_->Heartbeat(Context(kToken).get(), beat, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
  beat.set_coordinator_incarnation(server_->incarnation() + 1);
  EXPECT_EQ(cluster_->Heartbeat(Context(kToken).get(), beat, &response).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST_F(CoordinatorServerTest, InvalidRegistrationIsRejected) {
  RegisterResponse response;
  auto request = MakeRegister("w1", 0);
  EXPECT_EQ(cluster_->Register(Context(kToken).get(), request, &response).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(CoordinatorServerTest, DrainThroughAdmin) {
  RegisterResponse registered;
  ASSERT_TRUE(cluster_->Register(Context(kToken).get(), MakeRegister("w1", 5), &registered).ok());
  DrainWorkerRequest drain;
  drain.set_worker_id("w1");
  DrainWorkerResponse drained;
  ASSERT_TRUE(admin_->DrainWorker(Context(kToken).get(), drain, &drained).ok());
  EXPECT_EQ(drained.state(), DRAINING);
  drain.set_worker_id("w2");
  EXPECT_EQ(admin_->DrainWorker(Context(kToken).get(), drain, &drained).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST_F(CoordinatorServerTest, ExpertLoadAndRebalanceWithoutAModel) {
  GetExpertLoadResponse load;
  ASSERT_TRUE(admin_->GetExpertLoad(Context(kToken).get(), GetExpertLoadRequest(), &load).ok());
  EXPECT_EQ(load.num_steps(), 0);
  EXPECT_EQ(load.num_gpus(), 0);
  RebalanceResponse rebalanced;
  grpc::Status s = admin_->Rebalance(Context(kToken).get(), RebalanceRequest(), &rebalanced);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(s.error_message(), ::testing::HasSubstr("without --model"));
}

TEST_F(CoordinatorServerTest, EveryRpcRefusesMissingOrWrongToken) {
  for (const std::string token : {"", "wrong"}) {
    SCOPED_TRACE(absl::StrCat("token '", token, "'"));
    RegisterResponse registered;
    grpc::Status s = cluster_->Register(Context(token).get(), MakeRegister("w1", 1), &registered);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    HeartbeatResponse beat;
    EXPECT_EQ(cluster_->Heartbeat(Context(token).get(), HeartbeatRequest(), &beat).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    ClusterStatusResponse status;
    EXPECT_EQ(admin_->ClusterStatus(Context(token).get(), ClusterStatusRequest(), &status)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    DrainWorkerResponse drained;
    EXPECT_EQ(admin_->DrainWorker(Context(token).get(), DrainWorkerRequest(), &drained)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    GetExpertLoadResponse load;
    EXPECT_EQ(admin_->GetExpertLoad(Context(token).get(), GetExpertLoadRequest(), &load)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
    RebalanceResponse rebalanced;
    EXPECT_EQ(admin_->Rebalance(Context(token).get(), RebalanceRequest(), &rebalanced)
                  .error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  // Nothing was registered by the refused calls.
  EXPECT_TRUE(server_->registry()->Snapshot().empty());
}

TEST(CoordinatorServerConfigTest, RejectsTimeoutNotAboveInterval) {
  CoordinatorConfig config;
  config.heartbeat_interval = absl::Seconds(2);
  config.heartbeat_timeout = absl::Seconds(1);
  auto server = CoordinatorServer::Start(config);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace deepinfer
