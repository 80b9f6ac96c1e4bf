// MakeBackend: names, errors, and the CUDA backend where the build and machine have it.
#include "worker/backend/backend_factory.h"

#include "gtest/gtest.h"
#ifdef DEEPINFER_WITH_CUDA
#include <cuda_runtime_api.h>

#include "worker/backend/cuda/cuda_backend.h"
#endif

namespace deepinfer {
namespace {

TEST(BackendFactoryTest, MakesCpuBackend) {
  auto b = MakeBackend({"cpu", 1, 0, ""});
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "cpu");
  EXPECT_TRUE((*b)->status().ok());
}

TEST(BackendFactoryTest, WeightDTypeDefaultsPerKindAndCanBeChosen) {
  EXPECT_EQ(DefaultWeightDType("cpu"), WeightDType::kFloat32);
  EXPECT_EQ(DefaultWeightDType("cuda"), WeightDType::kBFloat16);
  auto fp32 = MakeBackend({"cpu", 1, 0, ""});
  ASSERT_TRUE(fp32.ok()) << fp32.status();
  EXPECT_EQ((*fp32)->weight_dtype(), WeightDType::kFloat32);
  auto bf16 = MakeBackend({"cpu", 1, 0, "bfloat16"});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ((*bf16)->weight_dtype(), WeightDType::kBFloat16);
  // A bf16 weight takes two bytes per element.
  const float w[3] = {1.0f, 3.0f, -2.5f};
  EXPECT_EQ((*bf16)->UploadWeight(w, 3)->size_bytes(), 6u);
  EXPECT_EQ((*fp32)->UploadWeight(w, 3)->size_bytes(), 12u);
}

TEST(BackendFactoryTest, RejectsUnknownDType) {
  auto b = MakeBackend({"cpu", 1, 0, "float8"});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("'float8'"), absl::string_view::npos) << b.status();
}

TEST(BackendFactoryTest, Mxfp4KeepsExpertsOnCudaOnly) {
  BackendOptions cuda;
  cuda.kind = "cuda";
  cuda.dtype = kMxfp4ExpertsDType;
  auto d = ResolveWeightDType(cuda);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(*d, WeightDType::kBFloat16);  // the matrices not kept FP8 or MXFP4
  EXPECT_TRUE(KeepsExpertsMxfp4(cuda));
  EXPECT_TRUE(KeepsCheckpointFp8(cuda));  // the rest as --dtype auto
  cuda.dtype = kStoredPrecisionDType;
  EXPECT_FALSE(KeepsExpertsMxfp4(cuda));
  BackendOptions cpu;
  cpu.dtype = kMxfp4ExpertsDType;
  EXPECT_FALSE(KeepsExpertsMxfp4(cpu));
  auto refused = ResolveWeightDType(cpu);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("cuda"), std::string::npos) << refused.status();
}

TEST(BackendFactoryTest, RejectsUnknownKind) {
  auto b = MakeBackend({"tpu", 0, 0, ""});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("available: cpu"), absl::string_view::npos) << b.status();
}

TEST(BackendFactoryTest, AscendIsRefusedAsNotBuilt) {
  auto b = MakeBackend({"ascend", 0, 0, ""});
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_NE(b.status().message().find("see ascend/README.md"), absl::string_view::npos)
      << b.status();
}

TEST(BackendFactoryTest, CudaDependsOnBuildAndMachine) {
  auto b = MakeBackend({"cuda", 0, 0, ""});
#ifdef DEEPINFER_WITH_CUDA
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    EXPECT_EQ(b.status().code(), absl::StatusCode::kFailedPrecondition) << b.status();
    return;
  }
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->name(), "cuda");
  EXPECT_EQ(MakeBackend({"cuda", 0, n, ""}).status().code(), absl::StatusCode::kFailedPrecondition);
#else
  EXPECT_EQ(b.status().code(), absl::StatusCode::kUnimplemented) << b.status();
#endif
}

#ifdef DEEPINFER_WITH_CUDA
// BackendOptions::gemm_autotune reaches the CUDA backend (on by default, off when asked).
TEST(BackendFactoryTest, GemmAutotuneReachesTheCudaBackend) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  for (bool on : {true, false}) {
    BackendOptions o;
    o.kind = "cuda";
    o.gemm_autotune = on;
    auto b = MakeBackend(o);
    ASSERT_TRUE(b.ok()) << b.status();
    auto* cuda = dynamic_cast<CudaBackend*>(b->get());
    ASSERT_NE(cuda, nullptr);
    EXPECT_EQ(cuda->tuning().gemm_autotune, on);
  }
  EXPECT_TRUE(BackendOptions().gemm_autotune);
}

// BackendOptions::batch_invariant reaches the CUDA backend (off by default).
TEST(BackendFactoryTest, BatchInvariantReachesTheCudaBackend) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  for (bool on : {true, false}) {
    BackendOptions o;
    o.kind = "cuda";
    o.batch_invariant = on;
    auto b = MakeBackend(o);
    ASSERT_TRUE(b.ok()) << b.status();
    auto* cuda = dynamic_cast<CudaBackend*>(b->get());
    ASSERT_NE(cuda, nullptr);
    EXPECT_EQ(cuda->tuning().batch_invariant, on);
  }
  EXPECT_FALSE(BackendOptions().batch_invariant);
  EXPECT_FALSE(CudaTuning().batch_invariant);
}
#endif

// DEEPINFER_BATCH_INVARIANT's values: unset, 0 / false / empty off, 1 / true on, others refused
// with the variable and the value named.
TEST(BackendFactoryTest, ParsesTheBatchInvariantEnvironmentVariable) {
  EXPECT_FALSE(*ParseBatchInvariantEnv(nullptr));
  for (const char* off : {"", "0", "false"}) {
    auto v = ParseBatchInvariantEnv(off);
    ASSERT_TRUE(v.ok()) << off;
    EXPECT_FALSE(*v) << off;
  }
  for (const char* on : {"1", "true"}) {
    auto v = ParseBatchInvariantEnv(on);
    ASSERT_TRUE(v.ok()) << on;
    EXPECT_TRUE(*v) << on;
  }
  auto bad = ParseBatchInvariantEnv("yes");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("DEEPINFER_BATCH_INVARIANT='yes'"), std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace deepinfer
