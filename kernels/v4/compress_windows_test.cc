// CompressWindowsF32 against CpuV4Ops on random inputs: V4-Flash's compressors (CSA: ratio 4
// with overlap at head_dim 512 and the indexer's 128; HCA: ratio 128 without, at 512), with
// kv and gate interleaved in one row as the model lays them out (row_stride = 2 * width) or in
// separate buffers (row_stride 0), first windows without a previous one, and column counts that
// leave a partial block, at window counts of both launches; 200 slots (ratio 100 with overlap)
// staged in several chunks. Only expf can make the bits differ: compared within a tolerance.
#include "kernels/v4/compress_windows.h"

#include <cstdint>
#include <random>
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

struct Shape {
  int64_t windows, ratio, dim;
  bool overlap, interleaved;
};

TEST(CompressWindowsKernelTest, MatchesCpu) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ThreadPool pool(2);
  CpuV4Ops cpu(&pool);
  for (const Shape& s : {Shape{1, 4, 512, true, true}, Shape{64, 4, 512, true, true},
                         Shape{1024, 4, 512, true, true}, Shape{64, 4, 128, true, true},
                         Shape{1, 128, 512, false, true}, Shape{32, 128, 512, false, true},
                         Shape{5, 4, 512, true, false}, Shape{7, 16, 64, false, false},
                         Shape{9, 3, 200, true, true}, Shape{3, 100, 40, true, true},
                         Shape{300, 128, 64, false, true},
                         Shape{70000, 1, 4, true, false}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "windows " << s.windows << " ratio " << s.ratio << " dim "
                                      << s.dim << " overlap " << s.overlap << " interleaved "
                                      << s.interleaved << " seed " << seed);
    const int64_t slots = s.overlap ? 2 * s.ratio : s.ratio;
    const int64_t width = s.overlap ? 2 * s.dim : s.dim;
    const int64_t stride = s.interleaved ? 2 * width : width;
    const int64_t rows = s.windows * slots;
    // Interleaved: one buffer, each row kv then gate; otherwise two buffers.
    const auto kv = RandomFloats(rows * stride, seed);
    const auto gate = s.interleaved ? std::vector<float>() : RandomFloats(rows * stride, seed + 1);
    const auto bias = RandomFloats(s.ratio * width, seed + 2, 0.5f);
    std::vector<int32_t> has_prev(s.windows);
    std::mt19937 gen(seed + 3);
    for (int64_t w = 0; w < s.windows; ++w)
      has_prev[w] = w == 0 ? 0 : static_cast<int32_t>(gen() % 4 != 0);
    std::vector<float> out(s.windows * s.dim);
    CompressWindowsArgs a;
    a.windows = s.windows;
    a.ratio = s.ratio;
    a.dim = s.dim;
    a.overlap = s.overlap;
    a.kv = kv.data();
    a.gate = s.interleaved ? kv.data() + width : gate.data();
    a.row_stride = s.interleaved ? stride : 0;
    a.bias = bias.data();
    a.has_prev = has_prev.data();
    a.out = out.data();
    cpu.CompressWindows(a);

    DeviceArray<float> dkv(kv), dgate(gate), dbias(bias), dout(out.size());
    DeviceArray<int32_t> dprev(has_prev);
    dout.Poison();
    CompressWindowsArgs d = a;
    d.kv = dkv.get();
    d.gate = s.interleaved ? dkv.get() + width : dgate.get();
    d.bias = dbias.get();
    d.has_prev = dprev.get();
    d.out = dout.get();
    DEEPINFER_CUDA_OK(kernels::CompressWindowsF32(d, nullptr));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(dout.Download(&got));
    EXPECT_TRUE(AllClose(got, out, 1e-6, 1e-5));
  }
}

TEST(CompressWindowsKernelTest, BadShapesAreRefusedAndEmptyIsANoOp) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CompressWindowsArgs a;
  a.windows = 2;
  a.ratio = 0;
  a.dim = 8;
  EXPECT_EQ(kernels::CompressWindowsF32(a, nullptr), cudaErrorInvalidValue);
  a.ratio = 4;
  a.overlap = true;
  a.row_stride = 8;  // below the row's 16 floats
  EXPECT_EQ(kernels::CompressWindowsF32(a, nullptr), cudaErrorInvalidValue);
  a.row_stride = 0;
  a.windows = 0;
  EXPECT_EQ(kernels::CompressWindowsF32(a, nullptr), cudaSuccess);
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace deepinfer
