#include "coordinator/client/coordinator_client.h"

#include "absl/strings/str_cat.h"
#include "coordinator/coordinator_server.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

TEST(CoordinatorClientTest, StatusAndDrainWithToken) {
  CoordinatorConfig config;
  config.auth_token = "tok";
  auto server = CoordinatorServer::Start(config);
  ASSERT_TRUE(server.ok()) << server.status();
  WorkerRegistration w;
  w.worker_id = "w";
  w.worker_incarnation = 3;
  w.listen_address = "127.0.0.1:5";
  w.devices.emplace_back();
  ASSERT_TRUE((*server)->registry()->Register(w).ok());

  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  CoordinatorClient client({address, "tok", "test"});
  auto status = client.ClusterStatus();
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->workers_size(), 1);
  EXPECT_EQ(status->workers(0).state(), REGISTERED);
  auto drained = client.DrainWorker("w");
  ASSERT_TRUE(drained.ok());
  EXPECT_EQ(drained->state(), DRAINING);

  CoordinatorClient no_token({address, "", "test"});
  auto refused = no_token.ClusterStatus();
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("--auth-token-file"));
}

TEST(CoordinatorClientTest, UnreachableCoordinatorSaysWhere) {
  // Port 1 on loopback: nothing listens there.
  CoordinatorClient client({"127.0.0.1:1", "", "test", absl::Seconds(2)});
  auto status = client.ClusterStatus();
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(status.status().message()), HasSubstr("127.0.0.1:1"));
  EXPECT_THAT(std::string(status.status().message()), HasSubstr("is deepinfer-coordinator"));
}

}  // namespace
}  // namespace deepinfer
