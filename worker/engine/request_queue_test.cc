// RequestQueue: drains what was pushed, counts tokens, wakes a waiter.
#include "worker/engine/request_queue.h"

#include <thread>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

WorkItem Item(const std::string& id, int tokens) {
  WorkItem item;
  item.set_request_id(id);
  for (int i = 0; i < tokens; ++i) item.add_prompt_token_ids(i);
  return item;
}

TEST(RequestQueueTest, DrainTakesEverythingInOrder) {
  RequestQueue q;
  q.Push({Item("a", 3), Item("b", 5)});
  q.Cancel({"x"});
  EXPECT_EQ(q.num_items(), 2);
  EXPECT_EQ(q.num_tokens(), 8);
  RequestQueue::Drained d = q.Drain();
  ASSERT_EQ(d.items.size(), 2u);
  EXPECT_EQ(d.items[0].request_id(), "a");
  EXPECT_EQ(d.items[1].request_id(), "b");
  ASSERT_EQ(d.cancelled.size(), 1u);
  EXPECT_EQ(q.num_items(), 0);
  EXPECT_EQ(q.num_tokens(), 0);
  EXPECT_TRUE(q.Drain().items.empty());
}

TEST(RequestQueueTest, PushWakesAWaiter) {
  RequestQueue q;
  // An infinite wait returns only because of the push.
  std::thread waiter([&q] { q.WaitForWork(absl::InfiniteDuration()); });
  q.Push({Item("a", 1)});
  waiter.join();
  EXPECT_EQ(q.num_items(), 1);
}

}  // namespace
}  // namespace deepinfer
