// SwiGluClampedF32 against CpuV4Ops::SwiGluClamped: V4-Flash's expert width (2048) and others,
// values far beyond the clamp (V4's swiglu_limit is 10), no clamp (limit 0), the vectorised and
// the scalar path (a width not a multiple of 4, an input off 16-byte alignment). Only expf can
// make the bits differ: compared within a tolerance.
#include "kernels/v4/swiglu_clamped.h"

#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_v4_ops.h"
#include "worker/backend/cpu/thread_pool.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;
using testing::RandomFloats;

TEST(SwiGluClampedKernelTest, MatchesCpu) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ThreadPool pool(2);
  CpuV4Ops cpu(&pool);
  struct Case {
    int64_t rows, inter;
    float limit;
    int64_t offset;  // floats the input starts past a 16-byte boundary
  };
  for (const Case& c : {Case{1, 2048, 10.0f, 0}, Case{768, 2048, 10.0f, 0}, Case{6, 64, 2.0f, 0},
                        Case{33, 2048, 0.0f, 0}, Case{5, 35, 10.0f, 0}, Case{7, 64, 10.0f, 1}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " inter " << c.inter << " limit "
                                      << c.limit << " offset " << c.offset << " seed " << seed);
    // stddev 8: many values beyond the clamp on both sides.
    const auto x = RandomFloats(c.offset + c.rows * 2 * c.inter, seed, 8.0f);
    std::vector<float> want(c.rows * c.inter);
    cpu.SwiGluClamped(c.rows, c.inter, x.data() + c.offset, c.limit, want.data());
    DeviceArray<float> dx(x), dout(want.size());
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::SwiGluClampedF32(c.rows, c.inter, dx.get() + c.offset, c.limit,
                                                dout.get(), nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dout.Download(&got));
    EXPECT_TRUE(AllClose(got, want, 1e-6, 1e-6));
  }
}

TEST(SwiGluClampedKernelTest, BadShapesAreRefusedAndEmptyIsANoOp) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  EXPECT_EQ(kernels::SwiGluClampedF32(-1, 4, nullptr, 1.0f, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::SwiGluClampedF32(0, 4, nullptr, 1.0f, nullptr, nullptr), cudaSuccess);
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace deepinfer
