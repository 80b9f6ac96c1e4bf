// CopyRowsF32 against CpuV4Ops::CopyRows: gathers and scatters by offset lists (the V4 model's
// cache moves), skipped rows, null offset lists, rows whose addresses allow 16-byte moves and
// rows that do not, more rows than the grid has blocks. A copy: the bits must be equal.
#include "kernels/v4/copy_rows.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_v4_ops.h"
#include "worker/backend/cpu/thread_pool.h"

namespace deepinfer {
namespace {

using testing::DeviceArray;
using testing::RandomFloats;

TEST(CopyRowsKernelTest, MatchesCpu) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ThreadPool pool(2);
  CpuV4Ops cpu(&pool);
  struct Case {
    int64_t rows, width;
    bool src_list, dst_list;
    int64_t misalign;  // added to every offset: 16-byte moves off
  };
  for (const Case& c :
       {Case{3, 512, true, true, 0}, Case{70000, 8, true, true, 0}, Case{64, 2048, false, true, 0},
        Case{64, 2048, true, false, 0}, Case{17, 64, true, true, 1}, Case{9, 35, true, true, 0}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message()
                 << "rows " << c.rows << " width " << c.width << " seed " << seed);
    // Source and destination: 2 * rows slots of width floats; rows go to a random permutation
    // of the slots, every fifth skipped.
    const int64_t slots = 2 * c.rows, floats = slots * c.width + c.misalign;
    const auto src = RandomFloats(floats, seed, 1.0f);
    std::vector<int64_t> perm(slots);
    std::iota(perm.begin(), perm.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<int64_t> from(c.rows), to(c.rows);
    for (int64_t r = 0; r < c.rows; ++r) {
      from[r] = perm[r] * c.width + c.misalign;
      to[r] = r % 5 == 4 ? -1 : perm[c.rows + r] * c.width + c.misalign;
    }
    std::vector<float> want(floats, -7.0f);
    CopyRowsArgs a{c.rows,      c.width,
                   src.data(),  c.src_list ? from.data() : nullptr,
                   want.data(), c.dst_list ? to.data() : nullptr};
    cpu.CopyRows(a);
    DeviceArray<float> dsrc(src), ddst(std::vector<float>(floats, -7.0f));
    DeviceArray<int64_t> dfrom(from), dto(to);
    a.src = dsrc.get();
    a.src_offsets = c.src_list ? dfrom.get() : nullptr;
    a.dst = ddst.get();
    a.dst_offsets = c.dst_list ? dto.get() : nullptr;
    DEEPINFER_CUDA_OK(kernels::CopyRowsF32(a, nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(ddst.Download(&got));
    EXPECT_EQ(got, want);
  }
}

TEST(CopyRowsKernelTest, BadShapesAreRefusedAndEmptyIsANoOp) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CopyRowsArgs a;
  a.rows = -1;
  EXPECT_EQ(kernels::CopyRowsF32(a, nullptr), cudaErrorInvalidValue);
  a.rows = 0;
  a.width = 4;
  EXPECT_EQ(kernels::CopyRowsF32(a, nullptr), cudaSuccess);
  a.rows = 1;
  EXPECT_EQ(kernels::CopyRowsF32(a, nullptr), cudaErrorInvalidValue);  // no pointers
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace deepinfer
