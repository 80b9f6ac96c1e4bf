// HeartbeatMonitor: a check reports each worker that missed its deadline once, the thread
// checks on its own every interval, and stopping does not wait for the interval.
#include "coordinator/heartbeat_monitor.h"

#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(5);

void RegisterWorker(WorkerRegistry* registry, const std::string& id) {
  WorkerRegistration r;
  r.worker_id = id;
  r.worker_incarnation = 9;
  r.listen_address = "127.0.0.1:1";
  r.devices.emplace_back();
  ASSERT_TRUE(registry->Register(r).ok());
}

// With an hour between checks the thread stays idle, so every check here is a CheckNow().
TEST(HeartbeatMonitorTest, ReportsEachSilentWorkerOnceWhenItsDeadlinePasses) {
  FakeClock clock;
  WorkerRegistry registry(&clock, 1, kTimeout);
  RegisterWorker(&registry, "a");
  absl::Mutex mu;
  std::vector<WorkerTransition> reported;
  HeartbeatMonitor monitor(&registry, absl::Hours(1), [&](const WorkerTransition& t) {
    absl::MutexLock lock(&mu);
    reported.push_back(t);
  });

  clock.Advance(absl::Seconds(3));
  RegisterWorker(&registry, "b");  // its deadline is 3 s after a's
  EXPECT_TRUE(monitor.CheckNow().empty());

  clock.Advance(absl::Seconds(3));  // a silent for 6 s, b for 3 s
  std::vector<WorkerTransition> lost = monitor.CheckNow();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].worker_id, "a");
  EXPECT_EQ(lost[0].from, REGISTERED);
  EXPECT_EQ(lost[0].to, LOST);
  EXPECT_TRUE(monitor.CheckNow().empty()) << "a LOST worker is reported once";

  clock.Advance(absl::Seconds(3));  // b silent for 6 s
  lost = monitor.CheckNow();
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].worker_id, "b");

  absl::MutexLock lock(&mu);
  ASSERT_EQ(reported.size(), 2u);
  EXPECT_EQ(reported[0].worker_id, "a");
  EXPECT_EQ(reported[1].worker_id, "b");
  for (const WorkerSnapshot& w : registry.Snapshot()) EXPECT_EQ(w.state, LOST);
}

// A worker already past its deadline is found by the thread alone. A monitor whose thread
// never checked would hang here until Bazel's timeout fails the test.
TEST(HeartbeatMonitorTest, ThreadChecksEveryInterval) {
  FakeClock clock;
  WorkerRegistry registry(&clock, 1, kTimeout);
  RegisterWorker(&registry, "w");
  clock.Advance(absl::Seconds(6));
  absl::Notification lost;
  std::string lost_id;
  HeartbeatMonitor monitor(&registry, absl::Milliseconds(1), [&](const WorkerTransition& t) {
    if (lost.HasBeenNotified()) return;
    lost_id = t.worker_id;
    lost.Notify();
  });
  lost.WaitForNotification();
  EXPECT_EQ(lost_id, "w");
  EXPECT_EQ(registry.Snapshot()[0].state, LOST);
}

// The first check comes one interval after construction, and destruction wakes the thread
// from its wait: with an hour between checks, a stale worker is never reported, and a monitor
// that ignored the stop signal would hang this test until Bazel's timeout.
TEST(HeartbeatMonitorTest, StopsBeforeItsFirstIntervalWithoutChecking) {
  FakeClock clock;
  WorkerRegistry registry(&clock, 1, kTimeout);
  RegisterWorker(&registry, "w");
  clock.Advance(absl::Seconds(6));
  int reported = 0;
  {
    HeartbeatMonitor monitor(&registry, absl::Hours(1),
                             [&](const WorkerTransition&) { ++reported; });
  }
  EXPECT_EQ(reported, 0);
  EXPECT_EQ(registry.Snapshot()[0].state, REGISTERED);
}

}  // namespace
}  // namespace deepinfer
