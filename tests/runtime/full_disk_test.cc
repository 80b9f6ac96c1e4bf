// A coordinator whose --state-dir is a small tmpfs that fills mid-job, with real processes on
// loopback (fixture model, CPU backend): the job shows why it is stalled (`deepinfer status`,
// the cluster status), the coordinator restarted on the full disk starts and answers, and once
// the space is freed the job completes by itself with every line exactly once, in the results
// and in output.jsonl.
//
// Mounting needs root (CAP_SYS_ADMIN): the test makes a mount namespace of its own, so the
// tmpfs is seen only by it and the processes it starts and goes away with them, and skips,
// saying why, where that is not permitted.
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/batch_jobs.h"
#include "tests/testing/subprocess.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::MakeCompletionJob;
using ::deepinfer::testing::ReadFile;
using ::deepinfer::testing::RunCommand;
using ::deepinfer::testing::Runfile;
using ::deepinfer::testing::Subprocess;
using ::deepinfer::testing::TempPath;
using ::deepinfer::testing::WaitForPortFile;
using ::deepinfer::testing::WaitUntil;
using ::testing::HasSubstr;
using json = nlohmann::json;

const char kModel[] = "tests/fixtures/dsv3_qlora_rope";

// Output lines by custom_id; fails the test on a duplicate or an error line.
std::map<std::string, json> ByCustomId(const std::string& output) {
  std::map<std::string, json> out;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    json j = json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    if (j.is_discarded()) continue;
    EXPECT_TRUE(j["error"].is_null()) << line;
    const std::string id = j["custom_id"].is_string() ? j["custom_id"].get<std::string>() : "";
    EXPECT_TRUE(out.emplace(id, j).second) << "custom_id " << id << " appears twice";
  }
  return out;
}

// Writes zeros to `path` until the filesystem has no room left; the bytes written.
int64_t FillFilesystem(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) return -1;
  static const char zeros[1 << 16] = {0};
  int64_t written = 0;
  for (size_t chunk = sizeof(zeros); chunk > 0; chunk /= 2) {
    for (ssize_t n; (n = write(fd, zeros, chunk)) > 0;) written += n;
  }
  close(fd);
  return written;
}

class FullDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // A mount namespace of this thread's own; the processes it starts inherit it.
    if (unshare(CLONE_NEWNS) != 0) {
      GTEST_SKIP() << "cannot make a mount namespace (" << strerror(errno)
                   << "): mounting the small tmpfs this test fills needs root (CAP_SYS_ADMIN)";
    }
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) {
      GTEST_SKIP() << "cannot make the mounts private (" << strerror(errno) << ")";
    }
    fs_ = TempPath("state_fs");
    ASSERT_EQ(mkdir(fs_.c_str(), 0755), 0) << strerror(errno);
    if (mount("tmpfs", fs_.c_str(), "tmpfs", 0, "size=8m") != 0) {
      GTEST_SKIP() << "cannot mount a tmpfs (" << strerror(errno)
                   << "): this test needs root (CAP_SYS_ADMIN)";
    }
    mounted_ = true;
  }

  void TearDown() override {
    worker_.reset();
    coordinator_.reset();
    if (mounted_) umount2(fs_.c_str(), MNT_DETACH);
  }

  void StartCoordinator(int port) {
    const std::string port_file = TempPath(absl::StrCat("port.", ++starts_));
    auto p = Subprocess::Start(
        {Runfile("coordinator/deepinfer-coordinator"), absl::StrCat("--listen=127.0.0.1:", port),
         "--port-file=" + port_file, std::string("--model=") + kModel,
         "--state-dir=" + fs_ + "/state", "--min-workers=1", "--heartbeat-interval-ms=200",
         "--heartbeat-timeout-ms=5000"},
        TempPath(absl::StrCat("coordinator.", starts_)));
    ASSERT_TRUE(p.ok()) << p.status();
    coordinator_.emplace(std::move(*p));
    const int bound = WaitForPortFile(port_file, absl::Seconds(60));
    ASSERT_GT(bound, 0) << coordinator_->ReadStderr();
    port_ = bound;
    address_ = absl::StrCat("127.0.0.1:", bound);
    client_.emplace(CoordinatorClientOptions{address_, "", "test", absl::Seconds(10)});
  }

  void StartWorker() {
    auto p = Subprocess::Start(
        {Runfile("worker/deepinfer-worker"), "--coordinator=" + address_,
         std::string("--model=") + kModel, "--worker-id=w0", "--threads=1", "--max-running=8"},
        TempPath("worker"));
    ASSERT_TRUE(p.ok()) << p.status();
    worker_.emplace(std::move(*p));
  }

  Job WaitForJob(const std::string& id, const std::function<bool(const Job&)>& done) {
    return testing::WaitForJob(*client_, id, done, [&] {
      return "coordinator:\n" + coordinator_->ReadStderr().substr(0, 20000);
    });
  }

  std::string fs_;
  bool mounted_ = false;
  int starts_ = 0;
  int port_ = 0;
  std::string address_;
  std::optional<Subprocess> coordinator_;
  std::optional<Subprocess> worker_;
  std::optional<CoordinatorClient> client_;
};

TEST_F(FullDiskTest, JobStallsOnAFullDiskAndCompletesExactlyOnceWhenSpaceIsFreed) {
  StartCoordinator(0);
  StartWorker();
  const int n = 300;
  auto id = client_->SubmitJob("fills-the-disk", MakeCompletionJob(n, 32, 21));
  ASSERT_TRUE(id.ok()) << id.status();
  Job job = WaitForJob(*id, [](const Job& j) { return j.completed_requests() >= 3; });
  const std::string filler = fs_ + "/filler";
  ASSERT_GT(FillFilesystem(filler), 0) << strerror(errno);
  job = WaitForJob(
      *id, [](const Job& j) { return !j.stalled_reason().empty() || j.state() == Job::COMPLETED; });
  ASSERT_NE(job.state(), Job::COMPLETED) << "the job finished before the disk filled";
  EXPECT_EQ(job.state(), Job::RUNNING);
  EXPECT_THAT(job.stalled_reason(), HasSubstr("database or disk is full"));
  auto cluster = client_->ClusterStatus();
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  EXPECT_THAT(cluster->storage_error(), HasSubstr("held in memory"));
  auto status =
      RunCommand({Runfile("coordinator/cli/deepinfer"), "status", "--coordinator=" + address_, *id},
                 TempPath("status"));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->exit_code, 0) << status->err;
  EXPECT_THAT(status->out, HasSubstr("stalled: writes to the state directory fail"));

  // Restarted on the still full disk, the coordinator starts and answers.
  coordinator_->Signal(SIGKILL);
  ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  StartCoordinator(port_);
  auto resumed = client_->GetJob(*id);
  ASSERT_TRUE(resumed.ok()) << resumed.status() << "\n" << coordinator_->ReadStderr();
  EXPECT_LT(resumed->completed_requests(), n);
  job = WaitForJob(*id, [](const Job& j) { return !j.stalled_reason().empty(); });
  EXPECT_THAT(job.stalled_reason(), HasSubstr("database or disk is full"));

  ASSERT_EQ(std::remove(filler.c_str()), 0) << strerror(errno);
  job = WaitForJob(*id, [](const Job& j) { return j.state() == Job::COMPLETED; });
  EXPECT_EQ(job.completed_requests(), n);
  EXPECT_EQ(job.failed_requests(), 0);
  EXPECT_EQ(job.stalled_reason(), "");
  std::string results;
  ASSERT_TRUE(client_->ReadResults(*id, [&](const std::string& l) { results += l + "\n"; }).ok());
  std::map<std::string, json> lines = ByCustomId(results);
  EXPECT_EQ(lines.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) EXPECT_TRUE(lines.count(absl::StrCat("req-", i))) << i;
  // The output file catches up with the database: the same lines, each once.
  const std::string output = absl::StrCat(fs_, "/state/jobs/", *id, "/output.jsonl");
  auto complete_lines = [&] {
    const std::string text = ReadFile(output);
    return std::count(text.begin(), text.end(), '\n');
  };
  EXPECT_TRUE(WaitUntil([&] { return complete_lines() >= n; }, absl::Seconds(60)))
      << coordinator_->ReadStderr();
  EXPECT_EQ(ByCustomId(ReadFile(output)).size(), static_cast<size_t>(n));
  EXPECT_THAT(coordinator_->ReadStderr(), HasSubstr("the state directory takes writes again"));
}

}  // namespace
}  // namespace deepinfer
