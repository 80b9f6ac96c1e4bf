// ExchangeMeter over a two-rank TCP group on loopback: data passes through unchanged, only the
// exchange calls are counted, bytes count what goes to the other rank, and the time is measured
// only with timing on (a peer that arrives 200 ms late shows up in it).
#include "tools/bench/exchange_meter.h"

#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/backend_factory.h"
#include "worker/comm/tcp_test_group.h"

namespace deepinfer {
namespace {

TEST(ExchangeMeterTest, CountsExchangesAndTimesThemOnlyWhenAsked) {
  comm::testing::TcpGroup group = comm::testing::MakeTcpGroup(2);
  ASSERT_EQ(group.size(), 2u);
  std::vector<ExchangeCounts> untimed(2), timed(2);
  std::vector<std::vector<int32_t>> received(2);
  comm::testing::OnAllRanks(2, [&](int r) {
    auto backend = MakeBackend(BackendOptions{});
    ASSERT_TRUE(backend.ok()) << backend.status();
    ExchangeMeter meter(group[r].get(), backend->get());
    EXPECT_EQ(meter.rank(), r);
    EXPECT_EQ(meter.world_size(), 2);
    EXPECT_EQ(meter.memory_kind(), comm::MemoryKind::kHost);
    // Rank r sends r + 1 ints to itself and 3 * (r + 1) to the other rank.
    const int other = 1 - r;
    std::vector<size_t> send_bytes(2);
    send_bytes[r] = (r + 1) * sizeof(int32_t);
    send_bytes[other] = 3 * (r + 1) * sizeof(int32_t);
    std::vector<int32_t> send(4 * (r + 1));
    for (size_t i = 0; i < send.size(); ++i) send[i] = 100 * r + static_cast<int32_t>(i);
    auto exchange = [&]() {
      auto recv_bytes = meter.AllToAllSizes(send_bytes);
      ASSERT_TRUE(recv_bytes.ok()) << recv_bytes.status();
      size_t total = 0;
      for (size_t b : *recv_bytes) total += b;
      received[r].assign(total / sizeof(int32_t), -1);
      ASSERT_TRUE(meter.AllToAllV(send.data(), send_bytes, received[r].data(), *recv_bytes).ok());
    };
    exchange();
    // Not exchanges: not counted.
    int64_t x = r;
    ASSERT_TRUE(meter.AllReduce(&x, &x, 1, comm::ReduceOp::kMax).ok());
    EXPECT_EQ(x, 1);
    ASSERT_TRUE(meter.Barrier().ok());
    untimed[r] = meter.Take();
    meter.set_timing(true);
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    exchange();
    timed[r] = meter.Take();
    EXPECT_EQ(meter.Take().calls, 0);  // Take zeroes
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(untimed[r].calls, 2) << r;
    EXPECT_EQ(untimed[r].bytes_to_peers, 3.0 * (r + 1) * sizeof(int32_t)) << r;
    EXPECT_EQ(untimed[r].seconds, 0) << r;
    EXPECT_EQ(timed[r].calls, 2) << r;
    EXPECT_EQ(timed[r].bytes_to_peers, untimed[r].bytes_to_peers) << r;
  }
  // Rank 0 waited for rank 1 inside the timed exchange.
  EXPECT_GE(timed[0].seconds, 0.1);
  EXPECT_GT(timed[1].seconds, 0);
  // Segment s of rank r's receive buffer is what rank s sent to r. Rank 0 receives [its own
  // 1 int: 0][rank 1's segment for rank 0: 6 ints from 100].
  EXPECT_EQ(received[0], (std::vector<int32_t>{0, 100, 101, 102, 103, 104, 105}));
  // Rank 1 receives [rank 0's segment for rank 1: 3 ints 1..3][own 2 ints: 106, 107].
  EXPECT_EQ(received[1], (std::vector<int32_t>{1, 2, 3, 106, 107}));
}

}  // namespace
}  // namespace deepinfer
