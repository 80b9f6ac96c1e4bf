// TcpCommunicator with every rank as a thread of this process, on loopback: each
// collective at world sizes 1-4 with random sizes (zeros included) and random contents
// checked byte for byte, large messages, and the failure cases (a peer that is absent,
// dies or aborts; mismatched collectives; stale incarnations) ending in an error, not a
// hang. Timeouts below are liveness bounds only; nothing asserts on durations.
#include "worker/comm/tcp_communicator.h"

#include <dirent.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <random>
#include <regex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/comm/tcp_test_group.h"

namespace deepinfer::comm {
namespace {

using ::testing::AnyOf;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

using Group = testing::TcpGroup;
using testing::OnAllRanks;

// The tests' groups form with incarnation 77.
Group MakeGroup(int n, absl::Duration timeout = absl::Seconds(60)) {
  return testing::MakeTcpGroup(n, timeout, /*incarnation=*/77);
}

// Deterministic pseudo-random content, so that a receiver can recompute what a sender
// sent without talking to it.
uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
void Fill(uint8_t* out, size_t n, uint64_t seed) {
  std::mt19937_64 gen(seed);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t v = gen();
    std::memcpy(out + i, &v, 8);
  }
  const uint64_t v = gen();
  std::memcpy(out + i, &v, n - i);
}
std::vector<uint8_t> Content(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  if (n > 0) Fill(v.data(), n, seed);
  return v;
}
uint64_t SegmentSeed(uint64_t test_seed, int src, int dst) {
  return Mix(test_seed * 1000003 + src * 1009 + dst);
}
// Bytes rank `src` sends to rank `dst`: zero for about a quarter of the pairs.
size_t SegmentSize(uint64_t test_seed, int src, int dst, size_t max_bytes) {
  const uint64_t h = Mix(SegmentSeed(test_seed, src, dst) ^ 0x5555);
  if (h % 4 == 0) return 0;
  return static_cast<size_t>((h >> 8) % (max_bytes + 1));
}

class WorldSizeTest : public ::testing::TestWithParam<int> {};

INSTANTIATE_TEST_SUITE_P(Sizes, WorldSizeTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

// Each rank's AllToAllV, with sizes known on both sides. Checks every received byte.
void CheckAllToAllV(TcpCommunicator& comm, uint64_t seed, size_t max_bytes) {
  const int n = comm.world_size();
  const int me = comm.rank();
  std::vector<size_t> send_bytes(n), recv_bytes(n);
  std::vector<uint8_t> send;
  size_t recv_total = 0;
  for (int r = 0; r < n; ++r) {
    send_bytes[r] = SegmentSize(seed, me, r, max_bytes);
    recv_bytes[r] = SegmentSize(seed, r, me, max_bytes);
    std::vector<uint8_t> part = Content(send_bytes[r], SegmentSeed(seed, me, r));
    send.insert(send.end(), part.begin(), part.end());
    recv_total += recv_bytes[r];
  }
  std::vector<uint8_t> recv(recv_total, 0xAB);
  absl::Status s = comm.AllToAllV(send.data(), send_bytes, recv.data(), recv_bytes);
  ASSERT_TRUE(s.ok()) << s;
  size_t off = 0;
  for (int r = 0; r < n; ++r) {
    const std::vector<uint8_t> want = Content(recv_bytes[r], SegmentSeed(seed, r, me));
    ASSERT_TRUE(std::memcmp(recv.data() + off, want.data(), want.size()) == 0)
        << "rank " << me << ": segment from rank " << r << " (" << want.size() << " bytes) differs";
    off += recv_bytes[r];
  }
}

TEST_P(WorldSizeTest, AllToAllVVariableAndZeroSizes) {
  const int n = GetParam();
  Group group = MakeGroup(n);
  ASSERT_EQ(group.size(), static_cast<size_t>(n));
  OnAllRanks(n, [&](int r) {
    for (uint64_t seed = 1; seed <= 20; ++seed) CheckAllToAllV(*group[r], seed, 5000);
  });
  EXPECT_EQ(group[0]->collectives_run(), 20u);
}

TEST_P(WorldSizeTest, AllToAllSizesThenAllToAllV) {
  // The engine's flow: a rank knows what it sends, learns what it receives.
  const int n = GetParam();
  Group group = MakeGroup(n);
  ASSERT_EQ(group.size(), static_cast<size_t>(n));
  OnAllRanks(n, [&](int me) {
    TcpCommunicator& comm = *group[me];
    for (uint64_t seed = 100; seed < 105; ++seed) {
      std::vector<size_t> send_bytes(n);
      std::vector<uint8_t> send;
      for (int r = 0; r < n; ++r) {
        send_bytes[r] = SegmentSize(seed, me, r, 100000);
        std::vector<uint8_t> part = Content(send_bytes[r], SegmentSeed(seed, me, r));
        send.insert(send.end(), part.begin(), part.end());
      }
      absl::StatusOr<std::vector<size_t>> recv_bytes = comm.AllToAllSizes(send_bytes);
      ASSERT_TRUE(recv_bytes.ok()) << recv_bytes.status();
      size_t total = 0;
      for (int r = 0; r < n; ++r) {
        ASSERT_EQ((*recv_bytes)[r], SegmentSize(seed, r, me, 100000)) << "from rank " << r;
        total += (*recv_bytes)[r];
      }
      std::vector<uint8_t> recv(total);
      ASSERT_TRUE(comm.AllToAllV(send.data(), send_bytes, recv.data(), *recv_bytes).ok());
      size_t off = 0;
      for (int r = 0; r < n; ++r) {
        const std::vector<uint8_t> want = Content((*recv_bytes)[r], SegmentSeed(seed, r, me));
        ASSERT_TRUE(std::memcmp(recv.data() + off, want.data(), want.size()) == 0);
        off += want.size();
      }
    }
  });
}

TEST_P(WorldSizeTest, RankWithNothingStillTakesPart) {
  // Rank 0 has no tokens: null buffers, all sizes zero; the others exchange among
  // themselves and get nothing from it.
  const int n = GetParam();
  Group group = MakeGroup(n);
  ASSERT_EQ(group.size(), static_cast<size_t>(n));
  OnAllRanks(n, [&](int me) {
    std::vector<size_t> bytes(n, me == 0 ? 0 : 16);
    bytes[0] = 0;
    std::vector<uint8_t> send(16 * n, static_cast<uint8_t>(me));
    std::vector<uint8_t> recv(16 * n, 0xFF);
    absl::Status s = me == 0 ? group[me]->AllToAllV(nullptr, bytes, nullptr, bytes)
                             : group[me]->AllToAllV(send.data(), bytes, recv.data(), bytes);
    ASSERT_TRUE(s.ok()) << s;
    if (me == 0) return;
    for (int r = 1; r < n; ++r) {
      // Segments are packed: the one from rank r starts at 16 * (r - 1).
      for (int i = 0; i < 16; ++i) ASSERT_EQ(recv[16 * (r - 1) + i], r);
    }
  });
}

TEST_P(WorldSizeTest, AllGather) {
  const int n = GetParam();
  Group group = MakeGroup(n);
  ASSERT_EQ(group.size(), static_cast<size_t>(n));
  OnAllRanks(n, [&](int me) {
    for (size_t bytes : {size_t{0}, size_t{1}, size_t{8}, size_t{1000}, size_t{300000}}) {
      std::vector<uint8_t> mine = Content(bytes, Mix(bytes + me));
      std::vector<uint8_t> all(bytes * n, 0xCD);
      ASSERT_TRUE(group[me]->AllGather(mine.data(), bytes, all.data()).ok());
      for (int r = 0; r < n; ++r) {
        const std::vector<uint8_t> want = Content(bytes, Mix(bytes + r));
        ASSERT_TRUE(std::memcmp(all.data() + r * bytes, want.data(), bytes) == 0)
            << bytes << " bytes from rank " << r;
      }
      // In place: our contribution already sits in our slot.
      std::vector<uint8_t> inplace(bytes * n, 0xEE);
      std::memcpy(inplace.data() + me * bytes, mine.data(), bytes);
      ASSERT_TRUE(group[me]->AllGather(inplace.data() + me * bytes, bytes, inplace.data()).ok());
      ASSERT_TRUE(inplace == all);
    }
  });
}

TEST_P(WorldSizeTest, AllReduceSumAndMax) {
  const int n = GetParam();
  Group group = MakeGroup(n);
  ASSERT_EQ(group.size(), static_cast<size_t>(n));
  constexpr size_t kCount = 1001;
  auto floats = [](int rank) {
    std::mt19937 gen(rank + 1);
    std::uniform_real_distribution<float> dist(-1000.0f, 1000.0f);
    std::vector<float> v(kCount);
    for (float& x : v) x = dist(gen);
    return v;
  };
  auto ints = [](int rank) {
    std::mt19937_64 gen(rank + 100);
    std::vector<int64_t> v(kCount);
    for (int64_t& x : v) x = static_cast<int64_t>(gen() >> 2) - (int64_t{1} << 60);
    return v;
  };
  // Expected results, reduced in rank order like the implementation promises.
  std::vector<float> fsum = floats(0), fmax = floats(0);
  std::vector<int64_t> isum = ints(0), imax = ints(0);
  for (int r = 1; r < n; ++r) {
    std::vector<float> f = floats(r);
    std::vector<int64_t> i = ints(r);
    for (size_t k = 0; k < kCount; ++k) {
      fsum[k] += f[k];
      fmax[k] = std::max(fmax[k], f[k]);
      isum[k] += i[k];
      imax[k] = std::max(imax[k], i[k]);
    }
  }
  OnAllRanks(n, [&](int me) {
    TcpCommunicator& comm = *group[me];
    std::vector<float> f = floats(me), fout(kCount);
    ASSERT_TRUE(comm.AllReduce(f.data(), fout.data(), kCount, ReduceOp::kSum).ok());
    EXPECT_TRUE(fout == fsum) << "float sum differs on rank " << me;               // bit-exact
    ASSERT_TRUE(comm.AllReduce(f.data(), f.data(), kCount, ReduceOp::kMax).ok());  // in place
    EXPECT_TRUE(f == fmax);
    std::vector<int64_t> i = ints(me), iout(kCount);
    ASSERT_TRUE(comm.AllReduce(i.data(), iout.data(), kCount, ReduceOp::kSum).ok());
    EXPECT_TRUE(iout == isum);
    ASSERT_TRUE(comm.AllReduce(i.data(), iout.data(), kCount, ReduceOp::kMax).ok());
    EXPECT_TRUE(iout == imax);
    // Token counts, the engine's use: every rank learns the total and the maximum.
    int64_t tokens = 10 * me + 3, total = 0, most = 0;
    ASSERT_TRUE(comm.AllReduce(&tokens, &total, 1, ReduceOp::kSum).ok());
    ASSERT_TRUE(comm.AllReduce(&tokens, &most, 1, ReduceOp::kMax).ok());
    EXPECT_EQ(total, 5 * n * (n - 1) + 3 * n);
    EXPECT_EQ(most, 10 * (n - 1) + 3);
  });
}

TEST_P(WorldSizeTest, BarrierWaitsForEveryRank) {
  const int n = GetParam();
  Group group = MakeGroup(n);
  ASSERT_EQ(group.size(), static_cast<size_t>(n));
  std::atomic<int> arrived{0};
  OnAllRanks(n, [&](int me) {
    for (int round = 1; round <= 50; ++round) {
      arrived.fetch_add(1);
      ASSERT_TRUE(group[me]->Barrier().ok());
      // Nobody leaves round k before all have arrived in round k.
      EXPECT_GE(arrived.load(), round * n);
      ASSERT_TRUE(group[me]->Barrier().ok());  // keeps rounds apart
    }
  });
}

TEST_P(WorldSizeTest, MixedCollectivesStayInStep) {
  const int n = GetParam();
  Group group = MakeGroup(n);
  ASSERT_EQ(group.size(), static_cast<size_t>(n));
  OnAllRanks(n, [&](int me) {
    for (int step = 0; step < 30; ++step) {
      CheckAllToAllV(*group[me], 1000 + step, 300);
      int64_t count = me + step, counts[4] = {};
      ASSERT_TRUE(group[me]->AllGather(&count, sizeof(count), counts).ok());
      for (int r = 0; r < n; ++r) ASSERT_EQ(counts[r], r + step);
      if (step % 7 == 0) {
        ASSERT_TRUE(group[me]->Barrier().ok());
      }
    }
  });
}

TEST_P(WorldSizeTest, MoeDispatchAndCombineRoundTrip) {
  // The engine's use: tokens routed to the rank owning their expert (dispatch), changed
  // there, and sent back (combine, the same call with the sizes swapped). Every token
  // must come back to its slot, changed by the rank that owns it.
  const int n = GetParam();
  Group group = MakeGroup(n);
  ASSERT_EQ(group.size(), static_cast<size_t>(n));
  constexpr int kHidden = 48;  // floats per token
  OnAllRanks(n, [&](int me) {
    Communicator& comm = *group[me];
    for (int step = 0; step < 5; ++step) {
      const int tokens = static_cast<int>(Mix(step * 31 + me) % 200);  // may be 0
      auto owner = [&](int token) {
        return static_cast<int>(Mix(step * 7919 + me * 131 + token) % n);
      };
      // Pack tokens by destination rank, remembering where each went.
      std::vector<std::vector<int>> by_rank(n);
      for (int t = 0; t < tokens; ++t) by_rank[owner(t)].push_back(t);
      std::vector<float> send;
      std::vector<size_t> send_bytes(n);
      for (int r = 0; r < n; ++r) {
        for (int t : by_rank[r]) {
          for (int h = 0; h < kHidden; ++h) send.push_back(me * 1e4f + t + h * 0.25f);
        }
        send_bytes[r] = by_rank[r].size() * kHidden * sizeof(float);
      }
      absl::StatusOr<std::vector<size_t>> recv_bytes = comm.AllToAllSizes(send_bytes);
      ASSERT_TRUE(recv_bytes.ok()) << recv_bytes.status();
      size_t total = 0;
      for (size_t b : *recv_bytes) total += b;
      std::vector<float> expert_in(total / sizeof(float));
      ASSERT_TRUE(comm.AllToAllV(send.data(), send_bytes, expert_in.data(), *recv_bytes).ok());
      // The "expert": scale by (owner rank + 2); exact in float for these values.
      for (float& x : expert_in) x *= static_cast<float>(me + 2);
      std::vector<float> back(send.size());
      ASSERT_TRUE(comm.AllToAllV(expert_in.data(), *recv_bytes, back.data(), send_bytes).ok());
      size_t i = 0;
      for (int r = 0; r < n; ++r) {
        for (int t : by_rank[r]) {
          for (int h = 0; h < kHidden; ++h, ++i) {
            ASSERT_EQ(back[i], (me * 1e4f + t + h * 0.25f) * static_cast<float>(r + 2))
                << "rank " << me << " token " << t;
          }
        }
      }
    }
  });
}

TEST(TcpCommunicatorTest, LargeMessages) {
  for (int n : {2, 4}) {
    // Tens of MB per rank: far more than the socket buffers, so every rank must send
    // and receive at once.
    const size_t per_peer = n == 2 ? (32u << 20) : (12u << 20);
    Group group = MakeGroup(n);
    ASSERT_EQ(group.size(), static_cast<size_t>(n));
    OnAllRanks(n, [&](int me) {
      std::vector<size_t> bytes(n, per_peer);
      std::vector<uint8_t> send(per_peer * n), recv(per_peer * n);
      for (int r = 0; r < n; ++r) Fill(send.data() + r * per_peer, per_peer, Mix(me * 16 + r));
      ASSERT_TRUE(group[me]->AllToAllV(send.data(), bytes, recv.data(), bytes).ok());
      std::vector<uint8_t> want(per_peer);
      for (int r = 0; r < n; ++r) {
        Fill(want.data(), per_peer, Mix(r * 16 + me));
        ASSERT_TRUE(std::memcmp(recv.data() + r * per_peer, want.data(), per_peer) == 0)
            << "world " << n << ": segment from rank " << r << " differs on rank " << me;
      }
    });
  }
}

int OpenFds() {
  int count = 0;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  while (readdir(dir) != nullptr) ++count;
  closedir(dir);
  return count;
}

TEST(TcpCommunicatorTest, WorldOfOneOpensNoSockets) {
  const int before = OpenFds();
  ASSERT_GT(before, 0);
  TcpCommunicatorSpec spec;  // rank 0 of 1, no root address, no incarnation
  absl::StatusOr<std::unique_ptr<TcpCommunicator>> comm = TcpCommunicator::Create(spec);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ(OpenFds(), before);
  std::vector<uint8_t> send = Content(100, 5), recv(100);
  ASSERT_TRUE((*comm)->AllToAllV(send.data(), {100}, recv.data(), {100}).ok());
  EXPECT_TRUE(recv == send);
  absl::StatusOr<std::vector<size_t>> sizes = (*comm)->AllToAllSizes({42});
  ASSERT_TRUE(sizes.ok());
  EXPECT_EQ((*sizes)[0], 42u);
  float x = 1.5f, y = 0;
  ASSERT_TRUE((*comm)->AllReduce(&x, &y, 1, ReduceOp::kSum).ok());
  EXPECT_EQ(y, 1.5f);
  EXPECT_TRUE((*comm)->Barrier().ok());
  EXPECT_EQ(OpenFds(), before);
}

TEST(TcpCommunicatorTest, BadSpecsAreRefused) {
  TcpCommunicatorSpec spec;
  spec.world_size = 2;
  spec.rank = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(TcpCommunicator::Create(spec).status()));
  spec.rank = 1;
  spec.group_incarnation = 0;  // required once there are peers
  spec.root_address = "127.0.0.1:1";
  EXPECT_TRUE(absl::IsInvalidArgument(TcpCommunicator::Create(spec).status()));
}

// --- Failures: each ends in an error naming the culprit, within the timeout. ---

TEST(TcpCommunicatorFailureTest, AbsentPeerTimesOutNamingIt) {
  Group group = MakeGroup(3, absl::Milliseconds(500));
  ASSERT_EQ(group.size(), 3u);
  std::vector<absl::Status> status(2);
  OnAllRanks(2, [&](int me) {
    std::vector<size_t> bytes(3, 64);
    std::vector<uint8_t> send(192), recv(192);
    status[me] = group[me]->AllToAllV(send.data(), bytes, recv.data(), bytes);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_TRUE(absl::IsDeadlineExceeded(status[r])) << status[r];
    EXPECT_THAT(status[r].message(), HasSubstr("waiting for data from rank(s) 2"));
  }
}

TEST(TcpCommunicatorFailureTest, PeerThatDiesGivesUnavailableNotAHang) {
  // A long timeout: the survivors must learn from the closed connection, not the clock.
  Group group = MakeGroup(3, absl::Seconds(120));
  ASSERT_EQ(group.size(), 3u);
  const size_t per_peer = 8u << 20;  // more than the socket buffers hold
  std::vector<absl::Status> status(3);
  OnAllRanks(3, [&](int me) {
    if (me == 0) {
      // Rank 0 never enters the collective and goes away; likely while the others are
      // blocked in it (the outcome must be the same if it goes before they enter).
      absl::SleepFor(absl::Milliseconds(200));
      group[0].reset();
      return;
    }
    std::vector<size_t> bytes(3, per_peer);
    std::vector<uint8_t> send(per_peer * 3), recv(per_peer * 3);
    status[me] = group[me]->AllToAllV(send.data(), bytes, recv.data(), bytes);
  });
  // Each survivor names a lost peer: rank 0, or the other survivor after it gave up
  // (mid-frame, so without an abort frame). The first survivor to fail can only have
  // seen rank 0 go, so at least one names rank 0.
  int named_rank0 = 0;
  for (int r = 1; r < 3; ++r) {
    EXPECT_THAT(status[r].code(), AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kAborted))
        << status[r];
    const std::string message(status[r].message());
    EXPECT_THAT(message, ContainsRegex("rank [012] (closed the connection|connection lost)"))
        << status[r];
    if (std::regex_search(message, std::regex("rank 0 (closed the connection|connection lost)"))) {
      ++named_rank0;
    }
  }
  EXPECT_GE(named_rank0, 1) << status[1] << "\n" << status[2];
  // The error sticks: the communicator is broken for good.
  absl::Status again = group[1]->Barrier();
  EXPECT_FALSE(again.ok());
}

TEST(TcpCommunicatorFailureTest, MismatchedCollectivesAreDetected) {
  Group group = MakeGroup(2);
  ASSERT_EQ(group.size(), 2u);
  std::vector<absl::Status> status(2);
  OnAllRanks(2, [&](int me) {
    uint8_t buf[64] = {};
    if (me == 0) {
      status[0] = group[0]->AllGather(buf, 8, buf + 16);
    } else {
      status[1] = group[1]->AllToAllV(buf, {8, 8}, buf + 32, {8, 8});
    }
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(status[r].ok());
    EXPECT_THAT(std::string(status[r].message()), HasSubstr("collective mismatch")) << status[r];
  }
  // Rank 1 reports what rank 0 ran, and vice versa (unless it heard of the other's abort).
  EXPECT_THAT(status[1].message(), AnyOf(HasSubstr("rank 0 sent AllGather #1 while rank 1 runs "
                                                   "AllToAllV #1"),
                                         HasSubstr("rank 0 aborted")));
}

TEST(TcpCommunicatorFailureTest, MismatchedReductionAndSizesAreDetected) {
  {
    Group group = MakeGroup(2);
    ASSERT_EQ(group.size(), 2u);
    std::vector<absl::Status> status(2);
    OnAllRanks(2, [&](int me) {
      float x = 1, y = 0;
      status[me] = group[me]->AllReduce(&x, &y, 1, me == 0 ? ReduceOp::kSum : ReduceOp::kMax);
    });
    for (int r = 0; r < 2; ++r) {
      EXPECT_THAT(status[r].message(), HasSubstr("float32 sum")) << status[r];
      EXPECT_THAT(status[r].message(), HasSubstr("float32 max")) << status[r];
    }
  }
  {
    Group group = MakeGroup(2);
    ASSERT_EQ(group.size(), 2u);
    std::vector<absl::Status> status(2);
    OnAllRanks(2, [&](int me) {
      std::vector<uint8_t> send(200), recv(200);
      // Rank 0 sends 100 bytes to rank 1, which expects 50.
      status[me] = me == 0 ? group[0]->AllToAllV(send.data(), {0, 100}, recv.data(), {0, 10})
                           : group[1]->AllToAllV(send.data(), {10, 0}, recv.data(), {50, 0});
    });
    EXPECT_TRUE(absl::IsFailedPrecondition(status[1])) << status[1];
    EXPECT_THAT(status[1].message(), HasSubstr("rank 0 sends 100 bytes, rank 1 expects 50"));
    // Rank 0 may have finished its half before rank 1 noticed; its next call fails.
    if (status[0].ok()) status[0] = group[0]->Barrier();
    EXPECT_FALSE(status[0].ok());
  }
}

TEST(TcpCommunicatorFailureTest, AbortTellsThePeers) {
  Group group = MakeGroup(3);
  ASSERT_EQ(group.size(), 3u);
  OnAllRanks(3, [&](int me) { ASSERT_TRUE(group[me]->Barrier().ok()); });
  group[2]->Abort(absl::CancelledError("shutting down for maintenance"));
  std::vector<absl::Status> status(3);
  OnAllRanks(3, [&](int me) { status[me] = group[me]->Barrier(); });
  for (int r = 0; r < 3; ++r) {
    EXPECT_TRUE(absl::IsAborted(status[r])) << status[r];
    EXPECT_THAT(status[r].message(), HasSubstr("shutting down for maintenance")) << status[r];
  }
}

TEST(TcpCommunicatorFailureTest, AbortUnblocksACollectiveInFlight) {
  Group group = MakeGroup(2);
  ASSERT_EQ(group.size(), 2u);
  absl::Status status;
  // Rank 1 never joins the barrier; only Abort() can end rank 0's wait before the timeout.
  std::thread waiter([&] { status = group[0]->Barrier(); });
  absl::SleepFor(absl::Milliseconds(100));
  group[0]->Abort(absl::CancelledError("engine stopping"));
  waiter.join();
  EXPECT_TRUE(absl::IsAborted(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("engine stopping"));
}

TEST(TcpCommunicatorFailureTest, InvalidCallAbortsTheGroup) {
  Group group = MakeGroup(2);
  ASSERT_EQ(group.size(), 2u);
  std::vector<absl::Status> status(2);
  OnAllRanks(2, [&](int me) {
    uint8_t buf[8] = {};
    status[me] = me == 0 ? group[0]->AllToAllV(buf, {1}, buf, {1})  // wrong vector length
                         : group[1]->Barrier();
  });
  EXPECT_TRUE(absl::IsInvalidArgument(status[0])) << status[0];
  // The peer hears of it instead of waiting out its 60 s timeout.
  EXPECT_TRUE(absl::IsAborted(status[1])) << status[1];
  EXPECT_THAT(status[1].message(), HasSubstr("world size is 2"));
}

TEST(TcpCommunicatorFailureTest, StaleIncarnationIsRefusedAndTheRightRankStillJoins) {
  absl::StatusOr<TcpCommunicator::RootListener> root = TcpCommunicator::ListenRoot("127.0.0.1:0");
  ASSERT_TRUE(root.ok());
  const std::string address = root->address;
  auto root_ptr = std::make_unique<TcpCommunicator::RootListener>(std::move(*root));
  absl::StatusOr<std::unique_ptr<TcpCommunicator>> rank0;
  std::thread t0([&] {
    TcpCommunicatorSpec spec;
    spec.world_size = 2;
    spec.root_address = address;
    spec.group_incarnation = 7;
    rank0 = TcpCommunicator::Create(spec, std::move(root_ptr));
  });
  TcpCommunicatorSpec spec;
  spec.rank = 1;
  spec.world_size = 2;
  spec.root_address = address;
  spec.group_incarnation = 6;  // a process left over from the previous group
  absl::StatusOr<std::unique_ptr<TcpCommunicator>> stale = TcpCommunicator::Create(spec);
  EXPECT_TRUE(absl::IsFailedPrecondition(stale.status())) << stale.status();
  EXPECT_THAT(stale.status().message(), HasSubstr("group incarnation mismatch"));
  spec.group_incarnation = 7;
  absl::StatusOr<std::unique_ptr<TcpCommunicator>> rank1 = TcpCommunicator::Create(spec);
  t0.join();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  std::thread t([&] { EXPECT_TRUE((*rank0)->Barrier().ok()); });
  EXPECT_TRUE((*rank1)->Barrier().ok());
  t.join();
}

TEST(TcpCommunicatorFailureTest, StrayConnectionsDoNotStopTheGroupFromForming) {
  absl::StatusOr<TcpCommunicator::RootListener> root = TcpCommunicator::ListenRoot("127.0.0.1:0");
  ASSERT_TRUE(root.ok());
  const std::string address = root->address;
  // Before any rank: one connection that never speaks, one that speaks HTTP.
  const absl::Time later = absl::Now() + absl::Seconds(60);
  absl::StatusOr<ScopedFd> silent = ConnectTcp(address, later);
  ASSERT_TRUE(silent.ok());
  absl::StatusOr<ScopedFd> garbage = ConnectTcp(address, later);
  ASSERT_TRUE(garbage.ok());
  const std::string http = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(WriteFull(garbage->get(), http.data(), http.size(), later).ok());

  auto root_ptr = std::make_unique<TcpCommunicator::RootListener>(std::move(*root));
  absl::StatusOr<std::unique_ptr<TcpCommunicator>> rank0;
  std::thread t0([&] {
    TcpCommunicatorSpec spec;
    spec.world_size = 2;
    spec.root_address = address;
    spec.group_incarnation = 3;
    rank0 = TcpCommunicator::Create(spec, std::move(root_ptr));
  });
  TcpCommunicatorSpec spec;
  spec.rank = 1;
  spec.world_size = 2;
  spec.root_address = address;
  spec.group_incarnation = 3;
  absl::StatusOr<std::unique_ptr<TcpCommunicator>> rank1 = TcpCommunicator::Create(spec);
  t0.join();
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(rank1.ok()) << rank1.status();
  std::thread t([&] { EXPECT_TRUE((*rank0)->Barrier().ok()); });
  EXPECT_TRUE((*rank1)->Barrier().ok());
  t.join();
}

TEST(TcpCommunicatorFailureTest, IncompleteGroupTimesOutNamingMissingRanks) {
  absl::StatusOr<TcpCommunicator::RootListener> root = TcpCommunicator::ListenRoot("127.0.0.1:0");
  ASSERT_TRUE(root.ok());
  const std::string address = root->address;
  auto root_ptr = std::make_unique<TcpCommunicator::RootListener>(std::move(*root));
  absl::Status status0, status1;
  std::thread t0([&] {
    TcpCommunicatorSpec spec;
    spec.world_size = 3;
    spec.root_address = address;
    spec.group_incarnation = 9;
    spec.timeout = absl::Milliseconds(500);
    status0 = TcpCommunicator::Create(spec, std::move(root_ptr)).status();
  });
  TcpCommunicatorSpec spec;
  spec.rank = 1;
  spec.world_size = 3;
  spec.root_address = address;
  spec.group_incarnation = 9;
  spec.timeout = absl::Milliseconds(500);
  status1 = TcpCommunicator::Create(spec).status();
  t0.join();
  EXPECT_TRUE(absl::IsDeadlineExceeded(status0)) << status0;
  EXPECT_THAT(status0.message(), HasSubstr("ranks not joined: 2"));
  EXPECT_FALSE(status1.ok());
}

}  // namespace
}  // namespace deepinfer::comm
