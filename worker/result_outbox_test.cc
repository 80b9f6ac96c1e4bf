// ResultOutbox: results stay until popped, in order.
#include "worker/result_outbox.h"

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

}  // namespace
}  // namespace deepinfer
