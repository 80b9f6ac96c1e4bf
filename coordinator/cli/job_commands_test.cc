// GpuSetsPerWorker: the CUDA_VISIBLE_DEVICES each worker of `deepinfer run --split-gpus` gets;
// LocalWorkerArgv: the engine options `deepinfer run` hands its workers; RunCommand's refusal of
// a backend that is only a design; CheckRunLayout: the layouts `deepinfer run` refuses at once;
// ResultsCommand: an unreachable coordinator leaves the output file as it was.
#include "coordinator/cli/job_commands.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(GpuSetsPerWorkerTest, NothingVisibleMeansGpusFromZero) {
  auto sets = GpuSetsPerWorker(nullptr, 2, 1);
  ASSERT_TRUE(sets.ok()) << sets.status();
  EXPECT_THAT(*sets, ElementsAre("0", "1"));
  sets = GpuSetsPerWorker("", 2, 2);
  ASSERT_TRUE(sets.ok()) << sets.status();
  EXPECT_THAT(*sets, ElementsAre("0,1", "2,3"));
}

TEST(GpuSetsPerWorkerTest, SlicesTheVisibleList) {
  auto sets = GpuSetsPerWorker("3,5,6,7,2", 2, 2);
  ASSERT_TRUE(sets.ok()) << sets.status();
  EXPECT_THAT(*sets, ElementsAre("3,5", "6,7"));
}

TEST(GpuSetsPerWorkerTest, TooFewGpusIsAnError) {
  auto sets = GpuSetsPerWorker("0", 2, 1);
  EXPECT_TRUE(absl::IsInvalidArgument(sets.status())) << sets.status();
  EXPECT_THAT(std::string(sets.status().message()), HasSubstr("need 2 GPUs"));
}

TEST(LocalWorkerArgvTest, DefaultsLeaveTheWorkersTheirOwn) {
  RunOptions o;
  o.model = "/m";
  const std::vector<std::string> argv = LocalWorkerArgv(o, 1, "/bin/w", "127.0.0.1:9", "/t", "");
  EXPECT_THAT(argv,
              ElementsAre("/bin/w", "--coordinator=127.0.0.1:9", "--model=/m", "--backend=cpu",
                          "--ranks=1", "--worker-id=worker-1", "--auth-token-file=/t",
                          "--cuda-graphs=true", "--cuda-graph-max-batch=256"));
}

TEST(LocalWorkerArgvTest, PassesEveryEngineOptionThenTheExtraArgs) {
  RunOptions o;
  o.model = "/m";
  o.backend = "cuda";
  o.ranks_per_worker = 2;
  o.dtype = "float32";
  o.cuda_graphs = false;
  o.cuda_graph_max_batch = 64;
  o.kv_cache_dtype = "bfloat16";
  o.prefix_caching = false;
  o.async_scheduling = false;
  o.batch_invariant = true;
  o.kv_cache_dir = "/kv";
  o.kv_cache_dir_gb = 2.5;
  o.kv_host_cache_gb = 0;
  o.worker_args = " --kv-cache-tokens=4096  --communicator=nccl";
  const std::vector<std::string> argv = LocalWorkerArgv(o, 0, "/bin/w", "a:1", "/t", "2,3");
  EXPECT_THAT(argv,
              ElementsAre("/usr/bin/env", "CUDA_VISIBLE_DEVICES=2,3", "/bin/w", "--coordinator=a:1",
                          "--model=/m", "--backend=cuda", "--ranks=2", "--worker-id=worker-0",
                          "--auth-token-file=/t", "--dtype=float32", "--cuda-graphs=false",
                          "--cuda-graph-max-batch=64", "--kv-cache-dtype=bfloat16",
                          "--no-prefix-caching", "--no-async-scheduling", "--batch-invariant",
                          "--kv-cache-dir=/kv", "--kv-cache-dir-gb=2.5", "--kv-host-cache-gb=0",
                          "--kv-cache-tokens=4096", "--communicator=nccl"));
}

// The HF-made fixture: 8 routed experts.
RunOptions FixtureRun(int64_t workers, int64_t ranks) {
  RunOptions o;
  o.model = "tests/fixtures/dsv3_qlora_rope";
  o.workers = workers;
  o.ranks_per_worker = ranks;
  return o;
}

TEST(CheckRunLayoutTest, RanksThatSplitTheRoutedExpertsPass) {
  for (auto [workers, ranks] : std::vector<std::pair<int, int>>{{1, 1}, {1, 2}, {2, 2}, {4, 2}}) {
    EXPECT_TRUE(CheckRunLayout(FixtureRun(workers, ranks)).ok()) << workers << " x " << ranks;
  }
}

TEST(CheckRunLayoutTest, RefusesALayoutThatCannotFormAGroupAndSaysWhy) {
  absl::Status s = CheckRunLayout(FixtureRun(1, 3));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_EQ(s.message(),
            "--workers=1 x --ranks-per-worker=3 cannot form one expert-parallel group: 8 routed "
            "experts cannot be split over 3 ranks; rank counts that divide 8: 1, 2, 4, 8");
}

TEST(CheckRunLayoutTest, RefusesALayoutThatWouldLeaveWorkersIdle) {
  absl::Status s = CheckRunLayout(FixtureRun(3, 1));
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("8 routed experts cannot be split over 3 ranks; rank counts that divide "
                        "8: 1, 2, 4, 8 (the coordinator would leave 1 of the workers idle)"));
}

TEST(CheckRunLayoutTest, AnUnreadableModelNamesTheFlag) {
  RunOptions o = FixtureRun(1, 1);
  o.model = "/no/such/model";
  absl::Status s = CheckRunLayout(o);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("--model=/no/such/model: "));
}

// A loopback port nobody listens on: bound, then closed.
int ClosedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

TEST(ResultsCommandTest, UnreachableCoordinatorLeavesTheOutputFileByteIdentical) {
  const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/results-unreachable");
  mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/out.jsonl";
  const std::string old = "{\"custom_id\": \"kept\"}\n\x01\xff no newline at the end";
  std::ofstream(path, std::ios::binary) << old;
  ConnectionOptions connection;
  connection.coordinator = absl::StrCat("127.0.0.1:", ClosedPort());
  connection.timeout_ms = 5000;
  ::testing::internal::CaptureStderr();
  const int code = ResultsCommand(connection, "job-1", path);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 1);
  EXPECT_THAT(err, HasSubstr("deepinfer results: reading the results of job job-1 from " +
                             connection.coordinator));
  EXPECT_THAT(err, HasSubstr("'" + path + "' was left as it was"));
  std::ifstream in(path, std::ios::binary);
  std::stringstream now;
  now << in.rdbuf();
  EXPECT_EQ(now.str(), old);
  // And no temporary file is left beside it.
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  while (dirent* e = readdir(d)) names.push_back(e->d_name);
  closedir(d);
  EXPECT_THAT(names, ::testing::UnorderedElementsAre(".", "..", "out.jsonl"));
}

// `deepinfer run --backend ascend` answers with one line and exit code 2 before it reads the
// input or starts any process (the input file here does not exist).
TEST(RunCommandTest, AscendBackendIsRefusedWithOneLine) {
  RunOptions o;
  o.model = "/m";
  o.input = "/nonexistent/input.jsonl";
  o.output = "/nonexistent/output.jsonl";
  o.backend = "ascend";
  ::testing::internal::CaptureStderr();
  const int code = RunCommand(o);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(code, 2);
  EXPECT_EQ(err,
            "deepinfer run: backend 'ascend' is not built into this binary: the Ascend NPU backend "
            "is a design only, never built or tested (it needs the CANN toolkit and an NPU); see "
            "ascend/README.md\n");
}

TEST(DefaultIdempotencyKeyTest, SameInputAndOptionsSameKey) {
  const std::string a(32, 'a'), b(32, 'b');
  const std::string key = DefaultIdempotencyKey(a, {"name"});
  EXPECT_EQ(key.size(), 5u + 64u);
  EXPECT_EQ(key.substr(0, 5), "auto:");
  EXPECT_EQ(DefaultIdempotencyKey(a, {"name"}), key);
  EXPECT_NE(DefaultIdempotencyKey(b, {"name"}), key);
  EXPECT_NE(DefaultIdempotencyKey(a, {"other"}), key);
  EXPECT_NE(DefaultIdempotencyKey(a, {}), key);
  // The options are told apart, not just concatenated.
  EXPECT_NE(DefaultIdempotencyKey(a, {"ab", "c"}), DefaultIdempotencyKey(a, {"a", "bc"}));
}

}  // namespace
}  // namespace deepinfer
