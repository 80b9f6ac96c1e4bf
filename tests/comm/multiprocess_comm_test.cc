// The TCP communicator across real processes: N comm_selftest processes form a group on
// loopback and check every collective's data; a process SIGKILLed in the middle of the
// collectives makes the others fail with an error naming it (not hang, not time out);
// a process from another group incarnation is refused while the right one joins.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <regex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/subprocess.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::Runfile;
using ::deepinfer::testing::Subprocess;
using ::deepinfer::testing::TempPath;
using ::deepinfer::testing::WaitUntil;
using ::testing::HasSubstr;
using ::testing::Not;

// Liveness bounds only.
constexpr absl::Duration kStartup = absl::Seconds(30);
constexpr absl::Duration kFinish = absl::Seconds(120);

class MultiprocessCommTest : public ::testing::Test {
 protected:
  // Starts rank 0 on a free port and returns its rendezvous address.
  std::string StartRoot(int world_size, const std::vector<std::string>& extra) {
    // Named per test: TempPath does not make names unique, and a port file left by an
    // earlier test would send the ranks to a dead port (where they retry until their
    // timeout).
    const std::string port_file = TempPath(absl::StrCat(TestName(), ".root.port.", ++starts_));
    std::remove(port_file.c_str());
    std::vector<std::string> argv = {Runfile("worker/comm/comm_selftest"), "--rank=0",
                                     absl::StrCat("--world-size=", world_size),
                                     "--root=127.0.0.1:0", "--port-file=" + port_file};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p = Subprocess::Start(argv, TempPath(absl::StrCat(TestName(), ".rank0.", starts_)));
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return "";
    ranks_.push_back(std::move(*p));
    int port = 0;
    EXPECT_TRUE(WaitUntil(
        [&] {
          std::ifstream in(port_file);
          std::string text;
          return std::getline(in, text) && absl::SimpleAtoi(text, &port) && port > 0;
        },
        kStartup))
        << "rank 0 wrote no port; stderr:\n"
        << ranks_.back().ReadStderr();
    return absl::StrCat("127.0.0.1:", port);
  }

  Subprocess& StartRank(int rank, int world_size, const std::string& root,
                        const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {Runfile("worker/comm/comm_selftest"),
                                     absl::StrCat("--rank=", rank),
                                     absl::StrCat("--world-size=", world_size), "--root=" + root};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto p =
        Subprocess::Start(argv, TempPath(absl::StrCat(TestName(), ".rank", rank, ".", ++starts_)));
    EXPECT_TRUE(p.ok()) << p.status();
    ranks_.push_back(std::move(*p));
    return ranks_.back();
  }

  int ExitCode(Subprocess& p) {
    absl::StatusOr<int> code = p.Wait(kFinish);
    EXPECT_TRUE(code.ok()) << code.status() << "\nstderr:\n" << p.ReadStderr();
    return code.ok() ? *code : -1;
  }

  static std::string TestName() {
    return ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  std::vector<Subprocess> ranks_;
  int starts_ = 0;
};

TEST_F(MultiprocessCommTest, FourProcessesAgreeOnEveryCollective) {
  constexpr int kWorld = 4;
  ranks_.reserve(kWorld);
  const std::vector<std::string> flags = {"--incarnation=12345", "--steps=8"};
  const std::string root = StartRoot(kWorld, flags);
  ASSERT_FALSE(root.empty());
  for (int r = 1; r < kWorld; ++r) StartRank(r, kWorld, root, flags);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(ExitCode(ranks_[r]), 0) << "rank " << r << " stderr:\n" << ranks_[r].ReadStderr();
    // 8 steps of 7 collectives each.
    EXPECT_THAT(ranks_[r].ReadStdout(),
                HasSubstr(absl::StrCat("rank ", r, ": OK, 56 collectives")));
  }
}

TEST_F(MultiprocessCommTest, KilledRankIsReportedNotWaitedFor) {
  constexpr int kWorld = 3;
  ranks_.reserve(kWorld);
  // Runs until an error, with segments up to 4 MB so that most of the time is spent in
  // transfers: the SIGKILL lands in the middle of one. The 120 s timeout is far beyond
  // the test's wait, so the survivors must learn from the broken connections.
  const std::vector<std::string> flags = {"--incarnation=777", "--steps=0", "--max-bytes=4000000",
                                          "--timeout-ms=600000"};
  const std::string root = StartRoot(kWorld, flags);
  ASSERT_FALSE(root.empty());
  StartRank(1, kWorld, root, flags);
  std::vector<std::string> dying = flags;
  dying.push_back("--die-after-ms=1500");
  StartRank(2, kWorld, root, dying);

  EXPECT_EQ(ExitCode(ranks_[2]), 128 + SIGKILL);
  int named_rank2 = 0;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(ExitCode(ranks_[r]), 1) << "rank " << r;
    const std::string err = ranks_[r].ReadStderr();
    EXPECT_THAT(err, Not(HasSubstr("DEADLINE_EXCEEDED"))) << err;
    EXPECT_TRUE(std::regex_search(err, std::regex("(UNAVAILABLE|ABORTED)")))
        << "rank " << r << ":\n"
        << err;
    // Each names a lost peer; the first survivor to fail can only have seen rank 2 go.
    if (std::regex_search(err, std::regex("rank 2 (closed the connection|connection lost)"))) {
      ++named_rank2;
    }
  }
  EXPECT_GE(named_rank2, 1) << ranks_[0].ReadStderr() << "\n" << ranks_[1].ReadStderr();
}

TEST_F(MultiprocessCommTest, ProcessFromAnotherGroupIsRefused) {
  ranks_.reserve(3);
  const std::string root = StartRoot(2, {"--incarnation=5", "--steps=2"});
  ASSERT_FALSE(root.empty());
  Subprocess& stale = StartRank(1, 2, root, {"--incarnation=4", "--steps=2"});
  EXPECT_EQ(ExitCode(stale), 1);
  EXPECT_THAT(stale.ReadStderr(), HasSubstr("group incarnation mismatch"));
  Subprocess& fresh = StartRank(1, 2, root, {"--incarnation=5", "--steps=2"});
  EXPECT_EQ(ExitCode(fresh), 0) << fresh.ReadStderr();
  EXPECT_EQ(ExitCode(ranks_[0]), 0) << ranks_[0].ReadStderr();
}

}  // namespace
}  // namespace deepinfer
