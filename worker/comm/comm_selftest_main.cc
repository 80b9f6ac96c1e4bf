// comm_selftest: one rank of a TcpCommunicator group, as its own process. Joins the group
// from flags, then runs a fixed sequence of collectives per step on data every rank can
// recompute (so each checks what it received, byte for byte) and prints
// "rank R: OK, N collectives". Exit codes: 0 ok, 1 a collective or the rendezvous failed
// (the status goes to stderr), 2 bad flags, 3 wrong data received.
// Driven by //tests/comm:multiprocess_comm_test.
#include <signal.h>
#include <unistd.h>

#include <cstring>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/flags/flag_set.h"
#include "common/rpc/daemon.h"
#include "glog/logging.h"
#include "worker/comm/tcp_communicator.h"

namespace deepinfer::comm {
namespace {

struct SelftestConfig {
  TcpCommunicatorSpec spec;
  std::string port_file;
  int64_t steps = 5;
  int64_t max_bytes = 100000;
  int64_t die_after_ms = -1;
};

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
// What rank `src` sends rank `dst` in `step`: size (zero for about a fifth of the pairs)
// and contents.
size_t SegmentBytes(int64_t step, int src, int dst, int64_t max_bytes) {
  const uint64_t h = Mix((static_cast<uint64_t>(step) << 20) ^ (src << 10) ^ dst);
  return h % 5 == 0 ? 0 : static_cast<size_t>((h >> 8) % (max_bytes + 1));
}
uint8_t SegmentByte(int64_t step, int src, int dst, size_t i) {
  return static_cast<uint8_t>(
      Mix((static_cast<uint64_t>(step) << 40) ^ (src << 30) ^ (dst << 20) ^ (i / 8)) >>
      (8 * (i % 8)));
}

// Exits with 1 (communication error) or 3 (wrong data) after saying why.
[[noreturn]] void Fail(int rank, int code, const std::string& what) {
  std::cerr << "rank " << rank << ": " << what << std::endl;
  std::_Exit(code);
}

void RunStep(Communicator& comm, int64_t step, int64_t max_bytes) {
  const int n = comm.world_size();
  const int me = comm.rank();
  auto check = [&](const absl::Status& s, const char* what) {
    if (!s.ok()) Fail(me, 1, absl::StrCat(what, " failed in step ", step, ": ", s.ToString()));
  };

  // Dispatch: learn the receive sizes, then exchange.
  std::vector<size_t> send_bytes(n);
  std::vector<uint8_t> send;
  for (int r = 0; r < n; ++r) {
    send_bytes[r] = SegmentBytes(step, me, r, max_bytes);
    for (size_t i = 0; i < send_bytes[r]; ++i) send.push_back(SegmentByte(step, me, r, i));
  }
  absl::StatusOr<std::vector<size_t>> recv_bytes = comm.AllToAllSizes(send_bytes);
  check(recv_bytes.status(), "AllToAllSizes");
  size_t total = 0;
  for (int r = 0; r < n; ++r) {
    if ((*recv_bytes)[r] != SegmentBytes(step, r, me, max_bytes)) {
      Fail(me, 3, absl::StrCat("step ", step, ": wrong size from rank ", r));
    }
    total += (*recv_bytes)[r];
  }
  std::vector<uint8_t> recv(total);
  check(comm.AllToAllV(send.data(), send_bytes, recv.data(), *recv_bytes), "AllToAllV");
  size_t off = 0;
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < (*recv_bytes)[r]; ++i) {
      if (recv[off + i] != SegmentByte(step, r, me, i)) {
        Fail(me, 3, absl::StrCat("step ", step, ": byte ", i, " from rank ", r, " is wrong"));
      }
    }
    off += (*recv_bytes)[r];
  }

  // Per-step metadata: every rank's token count, their sum and maximum.
  const int64_t tokens = static_cast<int64_t>(total);
  std::vector<int64_t> all(n);
  check(comm.AllGather(&tokens, sizeof(tokens), all.data()), "AllGather");
  int64_t want_sum = 0, want_max = 0;
  for (int r = 0; r < n; ++r) {
    int64_t expect = 0;
    for (int s = 0; s < n; ++s) expect += SegmentBytes(step, s, r, max_bytes);
    if (all[r] != expect) Fail(me, 3, absl::StrCat("step ", step, ": wrong count of rank ", r));
    want_sum += expect;
    want_max = std::max(want_max, expect);
  }
  int64_t sum = 0, most = 0;
  check(comm.AllReduce(&tokens, &sum, 1, ReduceOp::kSum), "AllReduce(sum)");
  check(comm.AllReduce(&tokens, &most, 1, ReduceOp::kMax), "AllReduce(max)");
  if (sum != want_sum || most != want_max) {
    Fail(me, 3,
         absl::StrCat("step ", step, ": sum ", sum, " max ", most, ", want ", want_sum, " and ",
                      want_max));
  }
  float loss = 0.5f * (me + 1), loss_sum = 0;
  check(comm.AllReduce(&loss, &loss_sum, 1, ReduceOp::kSum), "AllReduce(float)");
  if (loss_sum != 0.25f * n * (n + 1)) Fail(me, 3, "wrong float sum");  // exact: halves
  check(comm.Barrier(), "Barrier");
}

int Main(int argc, char** argv) {
  SelftestConfig config;
  int64_t rank = 0, world_size = 1, timeout_ms = 60000;
  std::string incarnation = "1";
  FlagSet flags("comm_selftest --rank R --world-size N --root HOST:PORT [flags]",
                "Joins a TCP communicator group and checks a fixed sequence of collectives.");
  flags.AddInt("rank", &rank, "This process's rank.");
  flags.AddInt("world-size", &world_size, "Number of ranks.");
  flags.AddString("root", &config.spec.root_address,
                  "Rank 0's rendezvous address; rank 0 may give port 0 with --port-file.");
  flags.AddString("port-file", &config.port_file,
                  "Rank 0 only: write the bound rendezvous port here.");
  flags.AddString("incarnation", &incarnation, "Group incarnation (decimal, non-zero).");
  flags.AddString("listen-host", &config.spec.listen_host, "Where to accept peers.");
  flags.AddInt("timeout-ms", &timeout_ms, "Timeout of every blocking step.");
  flags.AddInt("steps", &config.steps, "Steps to run; 0 runs until an error.");
  flags.AddInt("max-bytes", &config.max_bytes, "Largest all-to-all segment.");
  flags.AddInt("die-after-ms", &config.die_after_ms,
               "If >= 0, SIGKILL this process that long after joining (a crash\n"
               "in the middle of whatever collective is running).");
  absl::Status parsed = flags.Parse(std::vector<std::string>(argv + 1, argv + argc));
  if (flags.help_requested()) {
    std::cout << flags.Help();
    return 0;
  }
  uint64_t inc = 0;
  if (!parsed.ok() || !absl::SimpleAtoi(incarnation, &inc)) {
    std::cerr << "comm_selftest: " << (parsed.ok() ? "bad --incarnation" : parsed.message())
              << "\n";
    return 2;
  }
  InitDaemonLogging(argv[0], "", 0);
  config.spec.rank = static_cast<int>(rank);
  config.spec.world_size = static_cast<int>(world_size);
  config.spec.group_incarnation = inc;
  config.spec.timeout = absl::Milliseconds(timeout_ms);

  std::unique_ptr<TcpCommunicator::RootListener> root;
  if (rank == 0 && world_size > 1) {
    absl::StatusOr<TcpCommunicator::RootListener> bound =
        TcpCommunicator::ListenRoot(config.spec.root_address);
    if (!bound.ok()) Fail(0, 1, bound.status().ToString());
    config.spec.root_address = bound->address;
    root = std::make_unique<TcpCommunicator::RootListener>(std::move(*bound));
    if (!config.port_file.empty()) {
      absl::StatusOr<HostPort> hp = ParseHostPort(config.spec.root_address);
      if (absl::Status s = WritePortFile(config.port_file, hp->port); !s.ok()) {
        Fail(0, 1, s.ToString());
      }
    }
  }
  absl::StatusOr<std::unique_ptr<TcpCommunicator>> comm =
      TcpCommunicator::Create(config.spec, std::move(root));
  if (!comm.ok()) Fail(config.spec.rank, 1, comm.status().ToString());

  if (config.die_after_ms >= 0) {
    std::thread([ms = config.die_after_ms] {
      absl::SleepFor(absl::Milliseconds(ms));
      raise(SIGKILL);
    }).detach();
  }
  for (int64_t step = 1; config.steps == 0 || step <= config.steps; ++step) {
    RunStep(**comm, step, config.max_bytes);
  }
  std::cout << "rank " << rank << ": OK, " << (*comm)->collectives_run() << " collectives"
            << std::endl;
  return 0;
}

}  // namespace
}  // namespace deepinfer::comm

int main(int argc, char** argv) { return deepinfer::comm::Main(argc, argv); }
