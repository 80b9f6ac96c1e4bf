// ExpertGemmsCublas' argument checks, which run before any cuBLAS or CUDA call (so this test
// needs no GPU; the GEMMs themselves are checked against the CPU backend by
// worker/backend/cuda:cuda_backend_test, RoutedExpertsTest, for every algorithm).
#include "kernels/moe/expert_gemm_cublas.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using kernels::ExpertGemmCublasAlgo;

// Two slots of 3 and 0 rows; addresses that are never dereferenced on these paths.
struct Fixture {
  std::vector<int32_t> offsets{0, 3, 3};
  int dummy = 0;
  std::vector<const void*> weights{&dummy, nullptr};
  void* pointers[6] = {};
  kernels::ExpertGemmCublasParams Params() {
    kernels::ExpertGemmCublasParams p;
    p.num_slots = 2;
    p.host_offsets = offsets.data();
    p.host_weights = weights.data();
    p.weight_type = CUDA_R_16BF;
    p.n = 8;
    p.k = 8;
    p.x = &dummy;
    p.y = &dummy;
    p.chunk_rows = 1;
    p.device_pointers = pointers;
    p.device_pointers_size = 6;
    return p;
  }
};

TEST(ExpertGemmsCublasTest, Bf16OutputOnlyWithBf16Weights) {
  Fixture f;
  kernels::ExpertGemmCublasParams p = f.Params();
  p.weight_type = CUDA_R_32F;
  p.output_type = CUDA_R_16BF;
  for (auto algo : {ExpertGemmCublasAlgo::kChunked, ExpertGemmCublasAlgo::kPerExpert}) {
    EXPECT_EQ(kernels::ExpertGemmsCublas(nullptr, p, algo), CUBLAS_STATUS_INVALID_VALUE);
  }
  p.weight_type = CUDA_R_16BF;
  p.output_type = CUDA_R_16F;  // neither fp32 nor bf16
  EXPECT_EQ(kernels::ExpertGemmsCublas(nullptr, p, ExpertGemmCublasAlgo::kChunked),
            CUBLAS_STATUS_INVALID_VALUE);
}

TEST(ExpertGemmsCublasTest, ChunkedNeedsAPointerWorkspaceOfThreePerChunk) {
  Fixture f;
  kernels::ExpertGemmCublasParams p = f.Params();
  p.output_type = CUDA_R_16BF;
  p.device_pointers = nullptr;
  EXPECT_EQ(kernels::ExpertGemmsCublas(nullptr, p, ExpertGemmCublasAlgo::kChunked),
            CUBLAS_STATUS_INVALID_VALUE);
  p.device_pointers = f.pointers;
  p.device_pointers_size = 6;  // 3 chunks of 1 row need 9
  EXPECT_EQ(kernels::ExpertGemmsCublas(nullptr, p, ExpertGemmCublasAlgo::kChunked),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(kernels::ExpertGemmPointerCount(64, 16), 15);
}

TEST(ExpertGemmsCublasTest, NothingToDoIsSuccessWithoutTouchingCublas) {
  Fixture f;
  kernels::ExpertGemmCublasParams p = f.Params();
  f.offsets = {0, 0, 0};  // both slots empty
  p.host_offsets = f.offsets.data();
  p.output_type = CUDA_R_16BF;
  EXPECT_EQ(kernels::ExpertGemmsCublas(nullptr, p, ExpertGemmCublasAlgo::kChunked),
            CUBLAS_STATUS_SUCCESS);
}

}  // namespace
}  // namespace deepinfer
