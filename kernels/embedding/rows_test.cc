// GatherRowsF32 and ScatterAddRowsF32 against CpuBackend, with repeated indices (every token
// appears top_k times in the expert permutation).
#include "kernels/embedding/rows.h"

#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

std::vector<int32_t> RandomIndices(size_t n, int32_t bound, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> d(0, bound - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = d(gen);
  return v;
}

TEST(RowsKernelTest, GatherMatchesCpuBackendExactly) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t dim : {5, 96, 7168}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "dim " << dim << " seed " << seed);
    const int64_t src_rows = 300, rows = 77;
    auto src = testing::RandomFloats(src_rows * dim, seed);
    auto idx = RandomIndices(rows, src_rows, seed + 1);
    std::vector<float> want(rows * dim);
    cpu.GatherRows(rows, dim, src.data(), idx.data(), want.data());
    DeviceArray<float> dsrc(src), dout(rows * dim);
    DeviceArray<int32_t> didx(idx);
    dout.Poison();
    DEEPINFER_CUDA_OK(
        kernels::GatherRowsF32(rows, dim, dsrc.get(), didx.get(), dout.get(), nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dout.Download(&got));
    EXPECT_TRUE(AllClose(got, want, 0, 0));
  }
}

// The 16-byte gather at an embedding lookup's size (8192 rows of 2048 from 20000) and the scalar
// fallbacks (dim % 4 != 0; a source 4 bytes off 16-byte alignment, also at the lookup's size),
// each exactly the CPU backend's rows.
TEST(RowsKernelTest, VectorisedGatherAtPrefillSizes) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  struct Case {
    int64_t dim, src_rows, rows, src_shift;
  };
  for (const Case c : {Case{2048, 20000, 8192, 0}, Case{2048, 20000, 8192, 1},
                       Case{2048, 500, 1001, 1}, Case{6, 50, 999, 0}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "dim " << c.dim << " rows " << c.rows << " shift "
                                      << c.src_shift << " seed " << seed);
    auto src = testing::RandomFloats(c.src_rows * c.dim + c.src_shift, seed);
    auto idx = RandomIndices(c.rows, static_cast<int32_t>(c.src_rows), seed + 1);
    std::vector<float> want(c.rows * c.dim);
    cpu.GatherRows(c.rows, c.dim, src.data() + c.src_shift, idx.data(), want.data());
    DeviceArray<float> dsrc(src), dout(c.rows * c.dim);
    DeviceArray<int32_t> didx(idx);
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::GatherRowsF32(c.rows, c.dim, dsrc.get() + c.src_shift, didx.get(),
                                             dout.get(), nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dout.Download(&got));
    EXPECT_TRUE(AllClose(got, want, 0, 0));
  }
}

TEST(RowsKernelTest, ScatterAddMatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t dim : {5, 96, 2048}) {
    for (bool with_weight : {true, false}) {
      const uint32_t seed = testing::FreshSeed();
      SCOPED_TRACE(::testing::Message()
                   << "dim " << dim << " weights " << with_weight << " seed " << seed);
      const int64_t dst_rows = 40, rows = 8 * dst_rows;  // ~8 contributions per destination
      auto src = testing::RandomFloats(rows * dim, seed);
      auto idx = RandomIndices(rows, dst_rows, seed + 1);
      auto weight = testing::RandomFloats(rows, seed + 2);
      auto dst = testing::RandomFloats(dst_rows * dim, seed + 3);
      std::vector<float> want = dst;
      cpu.ScatterAddRows(rows, dim, src.data(), idx.data(), with_weight ? weight.data() : nullptr,
                         want.data());
      DeviceArray<float> dsrc(src), dweight(weight), ddst(dst);
      DeviceArray<int32_t> didx(idx);
      DEEPINFER_CUDA_OK(kernels::ScatterAddRowsF32(rows, dim, dsrc.get(), didx.get(),
                                                   with_weight ? dweight.get() : nullptr,
                                                   ddst.get(), nullptr));
      std::vector<float> got;
      DEEPINFER_CUDA_OK(ddst.Download(&got));
      // Same order of additions; only FMA contraction (w*s+d in one rounding) may differ.
      EXPECT_TRUE(AllClose(got, want, 1e-5, 1e-5));
    }
  }
}

}  // namespace
}  // namespace deepinfer
