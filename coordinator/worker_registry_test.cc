#include "coordinator/worker_registry.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kCoordinator = 0xC00D;
constexpr absl::Duration kTimeout = absl::Seconds(5);

WorkerRegistration MakeWorker(const std::string& id, uint64_t incarnation) {
  WorkerRegistration r;
  r.worker_id = id;
  r.worker_incarnation = incarnation;
  r.node_name = "node-" + id;
  r.listen_address = "127.0.0.1:1234";
  Device cpu;
  cpu.set_kind(Device::CPU);
  r.devices.push_back(cpu);
  return r;
}

class WorkerRegistryTest : public ::testing::Test {
 protected:
  WorkerState StateOf(const std::string& id) {
    for (const auto& w : registry_.Snapshot()) {
      if (w.registration.worker_id == id) return w.state;
    }
    return WORKER_STATE_UNSPECIFIED;
  }

  FakeClock clock_;
  WorkerRegistry registry_{&clock_, kCoordinator, kTimeout};
};

TEST_F(WorkerRegistryTest, RegisterThenHeartbeatMakesReady) {
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 1)).ok());
  EXPECT_EQ(StateOf("a"), REGISTERED);
  auto state = registry_.Heartbeat("a", 1, kCoordinator);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, READY);
  EXPECT_EQ(StateOf("a"), READY);
}

TEST_F(WorkerRegistryTest, RejectsIncompleteRegistrations) {
  auto no_id = MakeWorker("", 1);
  EXPECT_EQ(registry_.Register(no_id).code(), absl::StatusCode::kInvalidArgument);
  auto no_incarnation = MakeWorker("a", 0);
  EXPECT_EQ(registry_.Register(no_incarnation).code(), absl::StatusCode::kInvalidArgument);
  auto no_address = MakeWorker("a", 1);
  no_address.listen_address.clear();
  EXPECT_EQ(registry_.Register(no_address).code(), absl::StatusCode::kInvalidArgument);
  auto no_devices = MakeWorker("a", 1);
  no_devices.devices.clear();
  EXPECT_EQ(registry_.Register(no_devices).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(registry_.Snapshot().empty());
}

TEST_F(WorkerRegistryTest, UnknownWorkerMustRegister) {
  auto state = registry_.Heartbeat("ghost", 1, kCoordinator);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(WorkerRegistryTest, StaleCoordinatorIncarnationMustReregister) {
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 1)).ok());
  auto state = registry_.Heartbeat("a", 1, kCoordinator + 1);
  EXPECT_EQ(state.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(state.status().message()), HasSubstr("coordinator incarnation"));
}

TEST_F(WorkerRegistryTest, HeartbeatFromOldIncarnationIsRefused) {
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 1)).ok());
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 2)).ok());  // restarted
  EXPECT_EQ(registry_.Heartbeat("a", 1, kCoordinator).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(registry_.Heartbeat("a", 2, kCoordinator).ok());
  EXPECT_EQ(registry_.Snapshot()[0].restarts, 1);
}

TEST_F(WorkerRegistryTest, SameIncarnationReregisterIsNotARestart) {
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 1)).ok());
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 1)).ok());
  EXPECT_EQ(registry_.Snapshot()[0].restarts, 0);
}

TEST_F(WorkerRegistryTest, SilentWorkerBecomesLostExactlyAfterTimeout) {
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 1)).ok());
  ASSERT_TRUE(registry_.Register(MakeWorker("b", 7)).ok());
  ASSERT_TRUE(registry_.Heartbeat("a", 1, kCoordinator).ok());
  ASSERT_TRUE(registry_.Heartbeat("b", 7, kCoordinator).ok());

  clock_.Advance(kTimeout);  // exactly at the deadline: still alive
  EXPECT_TRUE(registry_.ExpireStale().empty());
  ASSERT_TRUE(registry_.Heartbeat("b", 7, kCoordinator).ok());

  clock_.Advance(absl::Milliseconds(1));
  auto transitions = registry_.ExpireStale();
  ASSERT_EQ(transitions.size(), 1u);
  EXPECT_EQ(transitions[0].worker_id, "a");
  EXPECT_EQ(transitions[0].from, READY);
  EXPECT_EQ(transitions[0].to, LOST);
  EXPECT_EQ(StateOf("a"), LOST);
  EXPECT_EQ(StateOf("b"), READY);
  EXPECT_TRUE(registry_.ExpireStale().empty());  // reported once
}

TEST_F(WorkerRegistryTest, LostWorkerMustReregisterThenRecovers) {
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 1)).ok());
  clock_.Advance(kTimeout + absl::Seconds(1));
  ASSERT_EQ(registry_.ExpireStale().size(), 1u);
  EXPECT_EQ(registry_.Heartbeat("a", 1, kCoordinator).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 1)).ok());
  EXPECT_EQ(StateOf("a"), REGISTERED);
  EXPECT_EQ(*registry_.Heartbeat("a", 1, kCoordinator), READY);
}

TEST_F(WorkerRegistryTest, DrainingSurvivesHeartbeatsAndCanBeLost) {
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 1)).ok());
  ASSERT_TRUE(registry_.Heartbeat("a", 1, kCoordinator).ok());
  EXPECT_EQ(*registry_.Drain("a"), DRAINING);
  EXPECT_EQ(*registry_.Heartbeat("a", 1, kCoordinator), DRAINING);
  clock_.Advance(kTimeout + absl::Seconds(1));
  auto transitions = registry_.ExpireStale();
  ASSERT_EQ(transitions.size(), 1u);
  EXPECT_EQ(transitions[0].from, DRAINING);
  EXPECT_EQ(registry_.Drain("a").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.Drain("nobody").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(WorkerRegistryTest, DeregisteredWorkerIsLeftAtOnceAndNeverLost) {
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 1)).ok());
  ASSERT_TRUE(registry_.Register(MakeWorker("b", 7)).ok());
  ASSERT_TRUE(registry_.Heartbeat("a", 1, kCoordinator).ok());
  ASSERT_TRUE(registry_.Heartbeat("b", 7, kCoordinator).ok());
  auto left = registry_.Deregister("a", 1, kCoordinator);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(left->worker_id, "a");
  EXPECT_EQ(left->from, READY);
  EXPECT_EQ(left->to, LEFT);
  EXPECT_EQ(StateOf("a"), LEFT);  // with no time passing
  EXPECT_EQ(StateOf("b"), READY);
  // Calls from the instance that left are refused; a second Deregister is harmless.
  EXPECT_EQ(registry_.Heartbeat("a", 1, kCoordinator).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.CheckSender("a", 1, kCoordinator).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.Drain("a").status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.Deregister("a", 1, kCoordinator)->from, LEFT);
  // The deadline passes: it stays LEFT (the staleness check skips it).
  clock_.Advance(kTimeout + absl::Seconds(1));
  auto transitions = registry_.ExpireStale();
  ASSERT_EQ(transitions.size(), 1u);
  EXPECT_EQ(transitions[0].worker_id, "b");
  EXPECT_EQ(StateOf("a"), LEFT);
  // A new process registers again under the same id.
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 2)).ok());
  EXPECT_EQ(*registry_.Heartbeat("a", 2, kCoordinator), READY);
}

TEST_F(WorkerRegistryTest, DeregisterFromAnotherIncarnationChangesNothing) {
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 2)).ok());
  ASSERT_TRUE(registry_.Heartbeat("a", 2, kCoordinator).ok());
  // The previous process of this id, or one registered with a previous coordinator.
  EXPECT_EQ(registry_.Deregister("a", 1, kCoordinator).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.Deregister("a", 2, kCoordinator + 1).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_.Deregister("ghost", 1, kCoordinator).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(StateOf("a"), READY);
}

TEST_F(WorkerRegistryTest, SnapshotIsSortedById) {
  ASSERT_TRUE(registry_.Register(MakeWorker("c", 1)).ok());
  ASSERT_TRUE(registry_.Register(MakeWorker("a", 1)).ok());
  ASSERT_TRUE(registry_.Register(MakeWorker("b", 1)).ok());
  std::vector<std::string> ids;
  for (const auto& w : registry_.Snapshot()) ids.push_back(w.registration.worker_id);
  EXPECT_THAT(ids, ElementsAre("a", "b", "c"));
}

}  // namespace
}  // namespace deepinfer
