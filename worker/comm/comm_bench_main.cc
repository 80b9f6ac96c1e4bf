// comm_bench: all-to-all throughput of TcpCommunicator over loopback. Every rank is a
// thread of this process with its own communicator (the sockets, framing and copies are
// the same as between processes). For each world size and per-peer segment size it runs
// equal-size AllToAllV calls for at least --min-seconds and prints the time per call and
// the bandwidth: per rank (bytes a rank sends to the other ranks, per second) and in total.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/flags/flag_set.h"
#include "glog/logging.h"
#include "worker/comm/tcp_communicator.h"

namespace deepinfer::comm {
namespace {

absl::StatusOr<std::vector<int64_t>> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (!absl::SimpleAtoi(part, &v) || v < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad number '", part, "'"));
    }
    out.push_back(v);
  }
  return out;
}

absl::StatusOr<std::vector<std::unique_ptr<TcpCommunicator>>> MakeGroup(int n, uint64_t inc) {
  absl::StatusOr<TcpCommunicator::RootListener> root = TcpCommunicator::ListenRoot("127.0.0.1:0");
  if (!root.ok()) return root.status();
  const std::string address = root->address;
  auto root_ptr = std::make_unique<TcpCommunicator::RootListener>(std::move(*root));
  std::vector<std::unique_ptr<TcpCommunicator>> group(n);
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      TcpCommunicatorSpec spec;
      spec.rank = r;
      spec.world_size = n;
      spec.root_address = address;
      spec.group_incarnation = inc;
      auto comm = TcpCommunicator::Create(spec, r == 0 ? std::move(root_ptr) : nullptr);
      status[r] = comm.status();
      if (comm.ok()) group[r] = std::move(*comm);
    });
  }
  for (auto& t : threads) t.join();
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return group;
}

// Runs `iters` all-to-alls on every rank; returns the wall time, or the first error.
absl::StatusOr<absl::Duration> Run(std::vector<std::unique_ptr<TcpCommunicator>>& group,
                                   size_t per_peer, int iters) {
  const int n = static_cast<int>(group.size());
  std::vector<absl::Status> status(n);
  // Buffers are allocated and touched before the clock starts: page faults are not
  // what we measure.
  std::vector<std::vector<uint8_t>> send(n), recv(n);
  for (int r = 0; r < n; ++r) {
    send[r].assign(per_peer * n, static_cast<uint8_t>(r));
    recv[r].assign(per_peer * n, 0);
  }
  const std::vector<size_t> bytes(n, per_peer);
  std::vector<std::thread> threads;
  const absl::Time start = absl::Now();
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      for (int i = 0; i < iters && status[r].ok(); ++i) {
        status[r] = group[r]->AllToAllV(send[r].data(), bytes, recv[r].data(), bytes);
      }
    });
  }
  for (auto& t : threads) t.join();
  const absl::Duration elapsed = absl::Now() - start;
  for (const absl::Status& s : status) {
    if (!s.ok()) return s;
  }
  return elapsed;
}

int Main(int argc, char** argv) {
  std::string world_sizes = "2,3,4";
  std::string sizes = "4096,65536,1048576,16777216";
  double min_seconds = 1.0;
  FlagSet flags("comm_bench [flags]",
                "All-to-all throughput of the TCP communicator over loopback (threads as ranks).");
  flags.AddString("world-sizes", &world_sizes, "Comma-separated world sizes.");
  flags.AddString("sizes", &sizes, "Comma-separated bytes each rank sends to each peer.");
  flags.AddDouble("min-seconds", &min_seconds, "Minimum measured time per point.");
  absl::Status parsed = flags.Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (flags.help_requested()) {
    std::cout << flags.Help();
    return 0;
  }
  absl::StatusOr<std::vector<int64_t>> worlds = ParseList(world_sizes);
  absl::StatusOr<std::vector<int64_t>> bytes = ParseList(sizes);
  if (!parsed.ok() || !worlds.ok() || !bytes.ok()) {
    std::cerr << "comm_bench: "
              << (!parsed.ok()   ? parsed
                  : !worlds.ok() ? worlds.status()
                                 : bytes.status())
              << "\n";
    return 2;
  }
  google::InitGoogleLogging(argv[0]);
  std::printf("%6s %12s %8s %12s %16s %14s\n", "world", "bytes/peer", "iters", "ms/call",
              "per-rank GB/s", "total GB/s");
  uint64_t incarnation = 1;
  for (int64_t n : *worlds) {
    auto group = MakeGroup(static_cast<int>(n), incarnation++);
    if (!group.ok()) {
      std::cerr << "comm_bench: " << group.status() << "\n";
      return 1;
    }
    for (int64_t per_peer : *bytes) {
      // Warm up, then grow the iteration count until the run is long enough.
      if (auto s = Run(*group, per_peer, 2); !s.ok()) {
        std::cerr << "comm_bench: " << s.status() << "\n";
        return 1;
      }
      int iters = 4;
      absl::Duration elapsed;
      while (true) {
        auto t = Run(*group, per_peer, iters);
        if (!t.ok()) {
          std::cerr << "comm_bench: " << t.status() << "\n";
          return 1;
        }
        elapsed = *t;
        if (absl::ToDoubleSeconds(elapsed) >= min_seconds || iters >= (1 << 20)) break;
        iters *= 2;
      }
      const double seconds = absl::ToDoubleSeconds(elapsed) / iters;
      const double per_rank = static_cast<double>(per_peer) * (n - 1) / seconds / 1e9;
      std::printf("%6lld %12lld %8d %12.3f %16.3f %14.3f\n", static_cast<long long>(n),
                  static_cast<long long>(per_peer), iters, seconds * 1e3, per_rank, per_rank * n);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace deepinfer::comm

int main(int argc, char** argv) { return deepinfer::comm::Main(argc, argv); }
