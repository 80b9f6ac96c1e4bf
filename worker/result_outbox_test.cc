// ResultOutbox: results stay until popped, in order.
#include "worker/result_outbox.h"

#include <thread>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

std::vector<RequestResult> Results(std::vector<std::string> ids) {
  std::vector<RequestResult> out;
  for (auto& id : ids) {
    out.emplace_back();
    out.back().set_request_id(id);
  }
  return out;
}

TEST(ResultOutboxTest, PeekDoesNotRemovePopDoes) {
  ResultOutbox box;
  EXPECT_FALSE(box.WaitForResults(absl::ZeroDuration()));
  box.Add(Results({"a", "b", "c"}));
  EXPECT_TRUE(box.WaitForResults(absl::ZeroDuration()));
  auto batch = box.Peek(2);
  ASSERT_EQ(batch.size(), 2u);
  EXPECT_EQ(batch[0].request_id(), "a");
  EXPECT_EQ(box.size(), 3u);  // a failed send loses nothing
  EXPECT_EQ(box.Peek(2)[1].request_id(), "b");
  box.Pop(2);
  EXPECT_EQ(box.size(), 1u);
  EXPECT_EQ(box.delivered(), 2u);
  EXPECT_EQ(box.Peek(10)[0].request_id(), "c");
}

// Interrupt() wakes a sender waiting without a deadline (it would wait for ever otherwise), and
// later waits return at once; results still count.
TEST(ResultOutboxTest, InterruptWakesTheWaiters) {
  ResultOutbox box;
  bool woke_with_results = true;
  std::thread waiter([&] { woke_with_results = box.WaitForResults(absl::InfiniteDuration()); });
  box.Interrupt();
  waiter.join();
  EXPECT_FALSE(woke_with_results);
  EXPECT_FALSE(box.WaitForResults(absl::InfiniteDuration()));
  box.Add(Results({"a"}));
  EXPECT_TRUE(box.WaitForResults(absl::InfiniteDuration()));
}

}  // namespace
}  // namespace deepinfer
