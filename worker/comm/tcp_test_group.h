// Test helper: a TcpCommunicator group with every rank as a thread of this process, on
// loopback, and a helper that runs a function on one thread per rank.
#ifndef DEEPINFER_WORKER_COMM_TCP_TEST_GROUP_H_
#define DEEPINFER_WORKER_COMM_TCP_TEST_GROUP_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "worker/comm/tcp_communicator.h"

namespace deepinfer::comm::testing {

using TcpGroup = std::vector<std::unique_ptr<TcpCommunicator>>;

// Forms a group of `n` ranks, one thread each; adds a test failure and returns an empty group if
// any fails.
inline TcpGroup MakeTcpGroup(int n, absl::Duration timeout = absl::Seconds(60),
                             uint64_t incarnation = 91) {
  TcpGroup group(n);
  absl::StatusOr<TcpCommunicator::RootListener> root = TcpCommunicator::ListenRoot("127.0.0.1:0");
  EXPECT_TRUE(root.ok()) << root.status();
  if (!root.ok()) return {};
  const std::string address = root->address;
  auto root_ptr = std::make_unique<TcpCommunicator::RootListener>(std::move(*root));
  std::vector<std::thread> threads;
  std::vector<absl::Status> status(n);
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      TcpCommunicatorSpec spec;
      spec.rank = r;
      spec.world_size = n;
      spec.root_address = address;
      spec.group_incarnation = incarnation;
      spec.timeout = timeout;
      auto comm = TcpCommunicator::Create(spec, r == 0 ? std::move(root_ptr) : nullptr);
      status[r] = comm.status();
      if (comm.ok()) group[r] = std::move(*comm);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    if (!status[r].ok()) return {};
  }
  return group;
}

// Runs `fn(rank)` on one thread per rank and waits for all.
inline void OnAllRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

}  // namespace deepinfer::comm::testing

#endif  // DEEPINFER_WORKER_COMM_TCP_TEST_GROUP_H_
