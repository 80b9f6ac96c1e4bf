// HcMixF32, HcHeadF32 and HcExpandF32 against CpuV4Ops on random inputs: V4-Flash's shape
// (hidden 4096, 4 streams, 20 Sinkhorn iterations) at decode and prefill row counts, the scalar
// path (hidden not a multiple of 4, a stream pointer off 16-byte alignment) and other stream
// counts (the runtime-count kernels). The expand has no transcendental function and rounds as
// the CPU does: bit for bit. The mix and the head go through expf (the GPU's may differ from
// glibc's by an ulp or two), so their outputs are compared within a tolerance.
#include "kernels/v4/hyper_connection.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
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
  int64_t rows, hc, hidden;
  int32_t iters;
  int64_t offset = 0;  // floats the streams start past a 16-byte boundary
};

// The case, for SCOPED_TRACE.
std::string Describe(const Shape& s, uint32_t seed) {
  return absl::StrCat("rows ", s.rows, " hc ", s.hc, " hidden ", s.hidden, " iters ", s.iters,
                      " offset ", s.offset, " seed ", seed);
}

// Expects the kernel's output `got` within atol + rtol * |want| of the CPU's `want`, element-wise.
void ExpectMatchesCpu(const DeviceArray<float>& got, const std::vector<float>& want, double atol,
                      double rtol, const char* what) {
  std::vector<float> host;
  DEEPINFER_CUDA_OK(got.Download(&host));
  EXPECT_TRUE(AllClose(host, want, atol, rtol)) << what;
}

std::vector<Shape> Shapes() {
  return {{1, 4, 4096, 20},   {64, 4, 4096, 20}, {300, 4, 4096, 20}, {3, 4, 130, 20},
          {5, 4, 512, 20, 1}, {7, 2, 64, 1},     {9, 8, 96, 3},      {2, 3, 33, 20},
          {4, 1, 8, 2},       {70000, 4, 8, 20}};
}

TEST(HyperConnectionKernelTest, MixMatchesCpu) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ThreadPool pool(2);
  CpuV4Ops cpu(&pool);
  for (const Shape& s : Shapes()) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(Describe(s, seed));
    const int64_t M = (2 + s.hc) * s.hc;
    const auto mixes = RandomFloats(s.rows * M, seed, 2.0f);
    const auto base = RandomFloats(M, seed + 1);
    const auto scale = RandomFloats(3, seed + 2, 0.5f);
    const auto streams = RandomFloats(s.offset + s.rows * s.hc * s.hidden, seed + 3);
    std::vector<float> post(s.rows * s.hc), comb(s.rows * s.hc * s.hc),
        collapsed(s.rows * s.hidden);
    HcMixArgs a;
    a.rows = s.rows;
    a.hc = s.hc;
    a.hidden = s.hidden;
    a.mixes = mixes.data();
    a.base = base.data();
    a.scale = scale.data();
    a.sinkhorn_iters = s.iters;
    a.eps = 1e-6f;
    a.streams = streams.data() + s.offset;
    a.post = post.data();
    a.comb = comb.data();
    a.collapsed = collapsed.data();
    cpu.HcMix(a);

    DeviceArray<float> dm(mixes), db(base), dsc(scale), ds(streams), dpost(post.size()),
        dcomb(comb.size()), dcol(collapsed.size());
    dpost.Poison();
    dcomb.Poison();
    dcol.Poison();
    HcMixArgs d = a;
    d.mixes = dm.get();
    d.base = db.get();
    d.scale = dsc.get();
    d.streams = ds.get() + s.offset;
    d.post = dpost.get();
    d.comb = dcomb.get();
    d.collapsed = dcol.get();
    DEEPINFER_CUDA_OK(kernels::HcMixF32(d, nullptr));
    ExpectMatchesCpu(dpost, post, 1e-6, 1e-6, "post");
    // Sinkhorn's 20 normalisations carry an ulp of expf through divisions: a few ulp.
    ExpectMatchesCpu(dcomb, comb, 1e-6, 1e-5, "comb");
    ExpectMatchesCpu(dcol, collapsed, 1e-5, 1e-5, "collapsed");
  }
}

TEST(HyperConnectionKernelTest, HeadMatchesCpu) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ThreadPool pool(2);
  CpuV4Ops cpu(&pool);
  for (const Shape& s : Shapes()) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(Describe(s, seed));
    const auto mixes = RandomFloats(s.rows * s.hc, seed, 2.0f);
    const auto base = RandomFloats(s.hc, seed + 1);
    const auto scale = RandomFloats(1, seed + 2, 0.5f);
    const auto streams = RandomFloats(s.offset + s.rows * s.hc * s.hidden, seed + 3);
    std::vector<float> out(s.rows * s.hidden);
    HcHeadArgs a;
    a.rows = s.rows;
    a.hc = s.hc;
    a.hidden = s.hidden;
    a.mixes = mixes.data();
    a.base = base.data();
    a.scale = scale.data();
    a.eps = 1e-6f;
    a.streams = streams.data() + s.offset;
    a.out = out.data();
    cpu.HcHead(a);

    DeviceArray<float> dm(mixes), db(base), dsc(scale), ds(streams), dout(out.size());
    dout.Poison();
    HcHeadArgs d = a;
    d.mixes = dm.get();
    d.base = db.get();
    d.scale = dsc.get();
    d.streams = ds.get() + s.offset;
    d.out = dout.get();
    DEEPINFER_CUDA_OK(kernels::HcHeadF32(d, nullptr));
    ExpectMatchesCpu(dout, out, 1e-5, 1e-5, "out");
  }
}

TEST(HyperConnectionKernelTest, ExpandMatchesCpuBitForBit) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ThreadPool pool(2);
  CpuV4Ops cpu(&pool);
  for (const Shape& s : Shapes()) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(Describe(s, seed));
    const auto block_out = RandomFloats(s.rows * s.hidden, seed);
    const auto post = RandomFloats(s.rows * s.hc, seed + 1);
    const auto comb = RandomFloats(s.rows * s.hc * s.hc, seed + 2, 0.5f);
    const auto in = RandomFloats(s.offset + s.rows * s.hc * s.hidden, seed + 3);
    std::vector<float> out(s.rows * s.hc * s.hidden);
    HcExpandArgs a;
    a.rows = s.rows;
    a.hc = s.hc;
    a.hidden = s.hidden;
    a.block_out = block_out.data();
    a.post = post.data();
    a.comb = comb.data();
    a.streams_in = in.data() + s.offset;
    a.streams_out = out.data();
    cpu.HcExpand(a);

    DeviceArray<float> df(block_out), dp(post), dc(comb), din(in), dout(out.size());
    dout.Poison();
    HcExpandArgs d = a;
    d.block_out = df.get();
    d.post = dp.get();
    d.comb = dc.get();
    d.streams_in = din.get() + s.offset;
    d.streams_out = dout.get();
    DEEPINFER_CUDA_OK(kernels::HcExpandF32(d, nullptr));
    ExpectMatchesCpu(dout, out, 0, 0, "streams_out");
  }
}

TEST(HyperConnectionKernelTest, BadShapesAreRefusedAndEmptyIsANoOp) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  HcMixArgs m;
  m.rows = 1;
  m.hidden = 8;
  m.hc = kernels::kMaxHcStreams + 1;
  EXPECT_EQ(kernels::HcMixF32(m, nullptr), cudaErrorInvalidValue);
  m.hc = 4;
  m.sinkhorn_iters = 0;
  EXPECT_EQ(kernels::HcMixF32(m, nullptr), cudaErrorInvalidValue);
  m.sinkhorn_iters = 1;
  m.rows = 0;
  EXPECT_EQ(kernels::HcMixF32(m, nullptr), cudaSuccess);
  HcHeadArgs h;
  h.rows = -1;
  h.hc = 4;
  EXPECT_EQ(kernels::HcHeadF32(h, nullptr), cudaErrorInvalidValue);
  HcExpandArgs e;
  e.rows = 2;
  e.hc = 0;
  e.hidden = 8;
  EXPECT_EQ(kernels::HcExpandF32(e, nullptr), cudaErrorInvalidValue);
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
}

}  // namespace
}  // namespace deepinfer
