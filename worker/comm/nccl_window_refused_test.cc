// A symmetric window refused safely: with NCCL's symmetric memory switched off
// (NCCL_WIN_ENABLE=0) ncclCommWindowRegister still succeeds but gives a handle that is not
// device memory (NCCL 2.28: the local registration, a host pointer; 2.29 on: null), and a kernel
// reading it would fault and break every later CUDA call of the process. RegisterSymmetricWindow
// must refuse it with UNIMPLEMENTED (what --ep-exchange auto falls back on) before any kernel
// reads it, leave the communicator usable for collectives and the CUDA context healthy, and
// refuse the next window the same way. NCCL reads the variable when it first initialises, so
// this is a binary of its own with one test. Skips without a GPU.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/comm/nccl_communicator.h"

namespace deepinfer::comm {
namespace {

TEST(NcclWindowRefusedTest, NoSymmetricMemoryIsRefusedAndTheGroupStaysUsable) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ASSERT_EQ(setenv("NCCL_WIN_ENABLE", "0", 1), 0);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  absl::StatusOr<std::string> id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclCommunicatorSpec spec;
  spec.unique_id = *id;
  spec.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm = NcclCommunicator::Create(spec);
  ASSERT_TRUE(comm.ok()) << comm.status();

  for (int attempt = 0; attempt < 2; ++attempt) {
    absl::StatusOr<SymmetricWindow> window = (*comm)->RegisterSymmetricWindow(1 << 20);
    ASSERT_TRUE(absl::IsUnimplemented(window.status())) << window.status();
    EXPECT_THAT(std::string(window.status().message()),
                ::testing::HasSubstr("gave no device window handle"));
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << "attempt " << attempt;
  }

  int64_t* value = nullptr;
  ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&value), sizeof(int64_t)), cudaSuccess);
  const int64_t seven = 7;
  ASSERT_EQ(cudaMemcpy(value, &seven, sizeof(seven), cudaMemcpyHostToDevice), cudaSuccess);
  absl::Status reduced = (*comm)->AllReduce(value, value, 1, ReduceOp::kMax);
  ASSERT_TRUE(reduced.ok()) << reduced;
  ASSERT_TRUE((*comm)->Barrier().ok());
  int64_t back = 0;
  ASSERT_EQ(cudaMemcpy(&back, value, sizeof(back), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back, seven);
  cudaFree(value);
  comm->reset();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace
}  // namespace deepinfer::comm
