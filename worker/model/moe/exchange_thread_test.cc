// ExchangeThread: exchanges run one at a time in submission order on another thread, while the
// submitting thread goes on; each status reaches its own Wait; WaitAll and the destructor wait for
// everything submitted.
#include "worker/model/moe/exchange_thread.h"

#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(ExchangeThreadTest, RunsInSubmissionOrderOffTheSubmittingThread) {
  ExchangeThread t;
  std::vector<int> order;  // written by the exchange thread only, read after WaitAll
  const std::thread::id me = std::this_thread::get_id();
  std::vector<std::thread::id> ran_on;
  absl::Notification release;
  // The first exchange blocks until the submitting thread has queued the others: they cannot run
  // on the submitting thread, and they run after it, in order.
  t.Submit([&]() -> absl::Status {
    release.WaitForNotification();
    order.push_back(0);
    ran_on.push_back(std::this_thread::get_id());
    return absl::OkStatus();
  });
  ExchangeThread::Ticket last = 0;
  for (int i = 1; i < 5; ++i) {
    last = t.Submit([&, i]() -> absl::Status {
      order.push_back(i);
      ran_on.push_back(std::this_thread::get_id());
      return absl::OkStatus();
    });
  }
  release.Notify();
  EXPECT_TRUE(t.Wait(last).ok());
  EXPECT_TRUE(t.WaitAll().ok());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  for (std::thread::id id : ran_on) EXPECT_NE(id, me);
}

TEST(ExchangeThreadTest, EachStatusReachesItsWaitAndAnEmptyExchangeIsOk) {
  ExchangeThread t;
  const ExchangeThread::Ticket a = t.Submit([] { return absl::OkStatus(); });
  const ExchangeThread::Ticket b = t.Submit([] { return absl::AbortedError("peer gone"); });
  const ExchangeThread::Ticket c = t.Submit(ExpertDispatcher::Exchange());
  EXPECT_TRUE(t.Wait(c).ok());
  EXPECT_TRUE(absl::IsAborted(t.Wait(b)));
  EXPECT_TRUE(t.Wait(a).ok());
}

TEST(ExchangeThreadTest, WaitAllReturnsAnErrorNotWaitedForAndTheDestructorWaits) {
  bool ran = false;
  {
    ExchangeThread t;
    t.Submit([] { return absl::UnavailableError("lost"); });
    EXPECT_TRUE(absl::IsUnavailable(t.WaitAll()));
    EXPECT_TRUE(t.WaitAll().ok());  // reported once
    t.Submit([&ran] {
      ran = true;
      return absl::OkStatus();
    });
  }
  EXPECT_TRUE(ran);
}

}  // namespace
}  // namespace deepinfer
