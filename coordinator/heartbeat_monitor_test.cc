#include "coordinator/heartbeat_monitor.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(HeartbeatMonitorTest, MarksSilentWorkerLostAndReportsIt) {
  FakeClock clock;
  WorkerRegistry registry(&clock, 1, absl::Seconds(5));
  WorkerRegistration r;
  r.worker_id = "w";
  r.worker_incarnation = 9;
  r.listen_address = "127.0.0.1:1";
  r.devices.emplace_back();
  ASSERT_TRUE(registry.Register(r).ok());

  absl::Notification lost;
  HeartbeatMonitor monitor(&registry, absl::Milliseconds(5), [&](const WorkerTransition& t) {
    EXPECT_EQ(t.worker_id, "w");
    EXPECT_EQ(t.to, LOST);
    lost.Notify();
  });
  // Before the deadline the monitor must leave the worker alone.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_FALSE(lost.HasBeenNotified());
  clock.Advance(absl::Seconds(6));
  EXPECT_TRUE(lost.WaitForNotificationWithTimeout(absl::Seconds(10)));
  EXPECT_EQ(registry.Snapshot()[0].state, LOST);
}

// With an hour between checks, only the stop signal can end the wait: a monitor that
// ignored it would hang this test until Bazel's timeout.
TEST(HeartbeatMonitorTest, StopsWithoutWaitingForTheInterval) {
  FakeClock clock;
  WorkerRegistry registry(&clock, 1, absl::Seconds(5));
  { HeartbeatMonitor monitor(&registry, absl::Hours(1)); }
}

}  // namespace
}  // namespace deepinfer
