// GpuSetsPerWorker: the CUDA_VISIBLE_DEVICES each worker of `deepinfer run --split-gpus` gets;
// LocalWorkerArgv: the engine options `deepinfer run` hands its workers; RunCommand's refusal of
// a backend that is only a design.
#include "coordinator/cli/job_commands.h"

#include <string>
#include <vector>

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
  EXPECT_THAT(argv, ElementsAre("/bin/w", "--coordinator=127.0.0.1:9", "--model=/m",
                                "--backend=cpu", "--ranks=1", "--worker-id=worker-1",
                                "--auth-token-file=/t", "--cuda-graphs=true",
                                "--cuda-graph-max-batch=256"));
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
  o.worker_args = " --kv-cache-tokens=4096  --communicator=nccl";
  const std::vector<std::string> argv = LocalWorkerArgv(o, 0, "/bin/w", "a:1", "/t", "2,3");
  EXPECT_THAT(argv, ElementsAre("/usr/bin/env", "CUDA_VISIBLE_DEVICES=2,3", "/bin/w",
                                "--coordinator=a:1", "--model=/m", "--backend=cuda", "--ranks=2",
                                "--worker-id=worker-0", "--auth-token-file=/t", "--dtype=float32",
                                "--cuda-graphs=false", "--cuda-graph-max-batch=64",
                                "--kv-cache-dtype=bfloat16", "--kv-cache-tokens=4096",
                                "--communicator=nccl"));
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

}  // namespace
}  // namespace deepinfer
