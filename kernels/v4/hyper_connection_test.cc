// HcMixF32, HcHeadF32 and HcExpandF32 against CpuV4Ops on random inputs: V4-Flash's shape
// (hidden 4096, 4 streams, 20 Sinkhorn iterations) at decode and prefill row counts, the scalar
// path (hidden not a multiple of 4, a stream pointer off 16-byte alignment) and other stream
// counts (the runtime-count kernels). The expand has no transcendental function and rounds as
// the CPU does: bit for bit. The mix and the head go through expf (the GPU's may differ from
// glibc's by an ulp or two), so their outputs are compared within a tolerance.
#include "kernels/v4/hyper_connection.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/norm/rms_norm.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"
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

// bf16 bits as floats.
std::vector<float> Bf16ToFloats(const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) {
    const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
    std::memcpy(&out[i], &u, sizeof(float));
  }
  return out;
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

// HcMixFromStreamsF32 against the CPU backend's RmsNorm + Gemm + CpuV4Ops::HcMix (the model's
// ops where the backend has no fused kernel), and its optional output norm against the CPU's
// RmsNorm of the CPU's collapsed rows: V4-Flash's shape at decode and prefill row counts (1, 7,
// 64, 4097: the three partials kernels), row counts that leave a partials block's last rows
// empty (3 and 7 in HcMixChainsBody's tiles of 4 and 8, 65 and 300 in HcMixPairsBody's of 16,
// 4097 in the GEMM's of 256), widths only 128-float slices divide (one chain a group; also in the
// GEMM at 2050 rows), a width of 16 slices (2100 rows: 4 groups in the GEMM), every per-thread
// column count of the row kernel (hidden 96 and 160: 1, 2048: 2, 4096: 4, 7168: 8); with the
// norm, in fp32 and/or bf16, collapsed written or left out. Within a tolerance (the norm's scale
// multiplies the dot products instead of the elements, the dot products add in another order;
// bf16 outputs within a bf16 rounding). The fused norm is also bit for bit kernels::RmsNormF32
// (bf16: kernels::AddRmsNormF32's out_bf16) on the kernel's own collapsed rows, as the op's
// contract says.
TEST(HyperConnectionKernelTest, MixFromStreamsMatchesCpuNormGemmAndMix) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  // kWithCollapsed: collapsed, normed and normed_bf16; kWithoutCollapsed: normed; kBf16:
  // normed_bf16.
  enum class Norm { kNone, kWithCollapsed, kWithoutCollapsed, kBf16 };
  struct Case {
    int64_t rows, hidden;
    Norm norm;
  };
  for (const Case& c : {Case{1, 4096, Norm::kNone}, Case{1, 4096, Norm::kWithoutCollapsed},
                        Case{3, 4096, Norm::kBf16}, Case{7, 4096, Norm::kWithCollapsed},
                        Case{64, 4096, Norm::kNone}, Case{65, 4096, Norm::kWithoutCollapsed},
                        Case{300, 4096, Norm::kNone}, Case{4097, 4096, Norm::kWithCollapsed},
                        Case{4097, 4096, Norm::kBf16}, Case{1, 4096, Norm::kBf16},
                        Case{17, 96, Norm::kWithCollapsed}, Case{200, 160, Norm::kNone},
                        Case{33, 2048, Norm::kWithCollapsed}, Case{5, 7168, Norm::kWithCollapsed},
                        Case{2050, 160, Norm::kWithCollapsed}, Case{2100, 2048, Norm::kNone}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " hidden " << c.hidden << " norm "
                                      << static_cast<int>(c.norm) << " seed " << seed);
    constexpr int64_t hc = 4, M = (2 + hc) * hc;
    const int64_t S = hc * c.hidden;
    const auto streams = RandomFloats(c.rows * S, seed, 2.0f);
    const auto fn = RandomFloats(M * S, seed + 1, 0.02f);
    const auto base = RandomFloats(M, seed + 2);
    const auto scale = RandomFloats(3, seed + 3, 0.5f);
    const auto norm_weight = RandomFloats(c.hidden, seed + 4);
    const std::vector<float> ones(S, 1.0f);
    const float norm_eps = 1e-6f;
    std::vector<float> normed(c.rows * S), mixes(c.rows * M), post(c.rows * hc),
        comb(c.rows * hc * hc), collapsed(c.rows * c.hidden), out_normed(c.rows * c.hidden);
    cpu.RmsNorm(c.rows, S, streams.data(), S, ones.data(), norm_eps, normed.data(), S);
    cpu.Gemm(c.rows, M, S, normed.data(), S, WeightView(fn.data()), S, mixes.data(), M, false);
    HcMixArgs a;
    a.rows = c.rows;
    a.hc = hc;
    a.hidden = c.hidden;
    a.mixes = mixes.data();
    a.base = base.data();
    a.scale = scale.data();
    a.sinkhorn_iters = 20;
    a.eps = 1e-6f;
    a.streams = streams.data();
    a.post = post.data();
    a.comb = comb.data();
    a.collapsed = collapsed.data();
    cpu.v4_ops()->HcMix(a);
    cpu.RmsNorm(c.rows, c.hidden, collapsed.data(), c.hidden, norm_weight.data(), norm_eps,
                out_normed.data(), c.hidden);
    std::vector<uint16_t> out_bf16(c.rows * c.hidden);
    cpu.AddRmsNorm(c.rows, c.hidden, collapsed.data(), nullptr, norm_weight.data(), norm_eps,
                   nullptr, out_bf16.data());

    DeviceArray<float> ds(streams), dfn(fn), db(base), dsc(scale), dw(norm_weight),
        dpost(post.size()), dcomb(comb.size()), dcol(collapsed.size()), dnormed(out_normed.size());
    DeviceArray<uint16_t> dbf16(out_bf16.size());
    dpost.Poison();
    dcomb.Poison();
    dcol.Poison();
    dnormed.Poison();
    dbf16.Poison();
    HcMixArgs d = a;
    d.mixes = nullptr;
    d.fn = dfn.get();
    d.norm_eps = norm_eps;
    d.base = db.get();
    d.scale = dsc.get();
    d.streams = ds.get();
    d.post = dpost.get();
    d.comb = dcomb.get();
    const bool with_collapsed = c.norm == Norm::kNone || c.norm == Norm::kWithCollapsed;
    const bool with_normed = c.norm == Norm::kWithCollapsed || c.norm == Norm::kWithoutCollapsed;
    const bool with_bf16 = c.norm == Norm::kWithCollapsed || c.norm == Norm::kBf16;
    d.collapsed = with_collapsed ? dcol.get() : nullptr;
    if (c.norm != Norm::kNone) {
      d.out_norm_weight = dw.get();
      d.out_norm_eps = norm_eps;
      d.normed = with_normed ? dnormed.get() : nullptr;
      d.normed_bf16 = with_bf16 ? dbf16.get() : nullptr;
    }
    ASSERT_TRUE(kernels::HcMixFromStreamsSupported(d));
    DeviceArray<float> workspace(kernels::HcMixFromStreamsWorkspaceFloats(c.rows, hc, c.hidden));
    DEEPINFER_CUDA_OK(kernels::HcMixFromStreamsF32(d, workspace.get(), nullptr));
    std::vector<float> got_post, got_comb, got_col, got_normed;
    DEEPINFER_CUDA_OK(dpost.Download(&got_post));
    DEEPINFER_CUDA_OK(dcomb.Download(&got_comb));
    EXPECT_TRUE(AllClose(got_post, post, 1e-5, 1e-5)) << "post";
    EXPECT_TRUE(AllClose(got_comb, comb, 1e-5, 1e-4)) << "comb";
    if (with_collapsed) {
      DEEPINFER_CUDA_OK(dcol.Download(&got_col));
      // Sums of 4 terms of up to ~2 that may cancel to near 0, weighted by pre weights from dot
      // products of 4 x hidden fp32 terms that the kernel and the CPU add in other orders: the
      // absolute error follows the terms, not the result (measured on the H200: up to 1.6e-5 in
      // 5 of 16.8M values at 4097 rows x 4096).
      EXPECT_TRUE(AllClose(got_col, collapsed, 5e-5, 1e-4)) << "collapsed";
    }
    if (c.norm == Norm::kNone) continue;
    std::vector<uint16_t> got_bf16;
    if (with_normed) {
      DEEPINFER_CUDA_OK(dnormed.Download(&got_normed));
      EXPECT_TRUE(AllClose(got_normed, out_normed, 1e-4, 1e-4)) << "normed";
    }
    if (with_bf16) {
      DEEPINFER_CUDA_OK(dbf16.Download(&got_bf16));
      EXPECT_TRUE(AllClose(Bf16ToFloats(got_bf16), Bf16ToFloats(out_bf16), 1e-3, 1e-2))
          << "normed_bf16";
    }
    // The same norm by RmsNormF32 / AddRmsNormF32 on the kernel's collapsed rows (written by a
    // run with them).
    HcMixArgs e = d;
    e.collapsed = dcol.get();
    e.normed = nullptr;
    e.normed_bf16 = nullptr;
    DEEPINFER_CUDA_OK(kernels::HcMixFromStreamsF32(e, workspace.get(), nullptr));
    if (with_normed) {
      DeviceArray<float> renormed(out_normed.size());
      DEEPINFER_CUDA_OK(kernels::RmsNormF32(c.rows, c.hidden, dcol.get(), c.hidden, dw.get(),
                                            norm_eps, renormed.get(), c.hidden, nullptr));
      std::vector<float> want_normed;
      DEEPINFER_CUDA_OK(renormed.Download(&want_normed));
      EXPECT_TRUE(AllClose(got_normed, want_normed, 0, 0)) << "normed against RmsNormF32";
    }
    if (with_bf16) {
      DeviceArray<uint16_t> renormed(out_bf16.size());
      DEEPINFER_CUDA_OK(kernels::AddRmsNormF32(c.rows, c.hidden, dcol.get(), nullptr, dw.get(),
                                               norm_eps, nullptr, renormed.get(), nullptr));
      std::vector<uint16_t> want_bf16;
      DEEPINFER_CUDA_OK(renormed.Download(&want_bf16));
      ASSERT_EQ(got_bf16.size(), want_bf16.size());
      size_t differ = 0;
      for (size_t i = 0; i < got_bf16.size(); ++i) differ += got_bf16[i] != want_bf16[i];
      EXPECT_EQ(differ, 0u) << "normed_bf16 against AddRmsNormF32";
    }
  }
}

// HcMixFromStreamsF32 from kTileMinRows rows (4100 rows at V4-Flash's shape), each GEMM, against
// a double reference for the mixes (the unweighted norm and the dot products in double, rounded
// to float once) followed by CpuV4Ops::HcMix: the outputs within the tolerances of the fp32
// comparison above.
TEST(HyperConnectionKernelTest, MixFromStreamsGemmsMatchDoubleMixes) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(1);
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int64_t hc = 4, hidden = 4096, M = (2 + hc) * hc, S = hc * hidden, rows = 4100;
  const float norm_eps = 1e-6f;
  const auto streams = RandomFloats(rows * S, seed, 2.0f);
  const auto fn = RandomFloats(M * S, seed + 1, 0.02f);
  const auto base = RandomFloats(M, seed + 2);
  const auto scale = RandomFloats(3, seed + 3, 0.5f);
  std::vector<float> mixes(rows * M), post(rows * hc), comb(rows * hc * hc),
      collapsed(rows * hidden);
  for (int64_t r = 0; r < rows; ++r) {
    const float* x = streams.data() + r * S;
    double ss = 0.0;
    for (int64_t k = 0; k < S; ++k) ss += double{x[k]} * x[k];
    const double inv = 1.0 / std::sqrt(ss / S + norm_eps);
    for (int64_t m = 0; m < M; ++m) {
      const float* f = fn.data() + m * S;
      double dot = 0.0;
      for (int64_t k = 0; k < S; ++k) dot += double{x[k]} * f[k];
      mixes[r * M + m] = static_cast<float>(dot * inv);
    }
  }
  HcMixArgs a;
  a.rows = rows, a.hc = hc, a.hidden = hidden;
  a.mixes = mixes.data(), a.base = base.data(), a.scale = scale.data();
  a.sinkhorn_iters = 20, a.eps = 1e-6f;
  a.streams = streams.data(), a.post = post.data(), a.comb = comb.data();
  a.collapsed = collapsed.data();
  cpu.v4_ops()->HcMix(a);

  DeviceArray<float> ds(streams), dfn(fn), db(base), dsc(scale), dpost(post.size()),
      dcomb(comb.size()), dcol(collapsed.size());
  DeviceArray<float> workspace(kernels::HcMixFromStreamsWorkspaceFloats(rows, hc, hidden));
  HcMixArgs d = a;
  d.mixes = nullptr, d.fn = dfn.get(), d.norm_eps = norm_eps;
  d.base = db.get(), d.scale = dsc.get(), d.streams = ds.get();
  d.post = dpost.get(), d.comb = dcomb.get(), d.collapsed = dcol.get();
  for (const kernels::HcMixGemm gemm : {kernels::HcMixGemm::kTensorCores,
                                        kernels::HcMixGemm::kFp32}) {
    SCOPED_TRACE(::testing::Message() << "gemm " << static_cast<int>(gemm));
    dpost.Poison();
    dcomb.Poison();
    dcol.Poison();
    DEEPINFER_CUDA_OK(kernels::HcMixFromStreamsF32(d, workspace.get(), nullptr, gemm));
    ExpectMatchesCpu(dpost, post, 1e-5, 1e-5, "post");
    ExpectMatchesCpu(dcomb, comb, 1e-5, 1e-4, "comb");
    ExpectMatchesCpu(dcol, collapsed, 5e-5, 1e-4, "collapsed");
  }
}

// A row's outputs do not depend on the batch around it within each way of computing the
// partials: the first rows of a 40-row call (HcMixPairsBody) and of a 2100-row call with the fp32
// GEMM (its chains added in registers) are bit for bit those rows alone (HcMixChainsBody, its
// chains added in groups by the row kernel), as the row's sums run in the same order in all
// three; and the first rows of a 2100-row and a 2300-row call on tensor cores are the same bits
// (a fixed slice length along the row; their rounding differs from the fp32 kernels').
TEST(HyperConnectionKernelTest, MixFromStreamsRowsDoNotDependOnTheBatch) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int64_t hc = 4, hidden = 4096, M = (2 + hc) * hc, S = hc * hidden;
  constexpr int64_t kMost = 2300, kMany = 2100, kSome = 40, kFew = 5;
  const auto streams = RandomFloats(kMost * S, seed, 2.0f);
  DeviceArray<float> ds(streams), dfn(RandomFloats(M * S, seed + 1, 0.02f)),
      db(RandomFloats(M, seed + 2)), dsc(RandomFloats(3, seed + 3, 0.5f)),
      dw(RandomFloats(hidden, seed + 4));
  struct Out {
    std::vector<float> post, comb, collapsed;
    std::vector<uint16_t> normed;
  };
  auto run = [&](int64_t rows, kernels::HcMixGemm gemm, Out* o) {
    DeviceArray<float> dpost(rows * hc), dcomb(rows * hc * hc), dcol(rows * hidden);
    DeviceArray<uint16_t> dnormed(rows * hidden);
    HcMixArgs a;
    a.rows = rows, a.hc = hc, a.hidden = hidden;
    a.base = db.get(), a.scale = dsc.get(), a.sinkhorn_iters = 20, a.eps = 1e-6f;
    a.streams = ds.get(), a.fn = dfn.get(), a.norm_eps = 1e-6f;
    a.post = dpost.get(), a.comb = dcomb.get(), a.collapsed = dcol.get();
    a.out_norm_weight = dw.get(), a.out_norm_eps = 1e-6f, a.normed_bf16 = dnormed.get();
    DeviceArray<float> workspace(kernels::HcMixFromStreamsWorkspaceFloats(rows, hc, hidden));
    DEEPINFER_CUDA_OK(kernels::HcMixFromStreamsF32(a, workspace.get(), nullptr, gemm));
    DEEPINFER_CUDA_OK(dpost.Download(&o->post));
    DEEPINFER_CUDA_OK(dcomb.Download(&o->comb));
    DEEPINFER_CUDA_OK(dcol.Download(&o->collapsed));
    DEEPINFER_CUDA_OK(dnormed.Download(&o->normed));
  };
  auto expect_same_first_rows = [&](const Out& got, const Out& want, const char* what) {
    SCOPED_TRACE(what);
    auto first = [](const auto& v, int64_t n) { return std::vector(v.begin(), v.begin() + n); };
    EXPECT_TRUE(first(got.post, kFew * hc) == first(want.post, kFew * hc)) << "post";
    EXPECT_TRUE(first(got.comb, kFew * hc * hc) == first(want.comb, kFew * hc * hc)) << "comb";
    EXPECT_TRUE(first(got.collapsed, kFew * hidden) == first(want.collapsed, kFew * hidden))
        << "collapsed";
    EXPECT_TRUE(first(got.normed, kFew * hidden) == first(want.normed, kFew * hidden))
        << "normed_bf16";
  };
  Out few, some, many_fp32, many_tc, most_tc;
  run(kFew, kernels::HcMixGemm::kAuto, &few);
  run(kSome, kernels::HcMixGemm::kAuto, &some);
  run(kMany, kernels::HcMixGemm::kFp32, &many_fp32);
  run(kMany, kernels::HcMixGemm::kTensorCores, &many_tc);
  run(kMost, kernels::HcMixGemm::kTensorCores, &most_tc);
  expect_same_first_rows(some, few, "40 rows");
  expect_same_first_rows(many_fp32, few, "2100 rows, fp32 GEMM");
  expect_same_first_rows(most_tc, many_tc, "tensor cores");
}

TEST(HyperConnectionKernelTest, MixFromStreamsRefusesWhatItDoesNotTake) {
  HcMixArgs a;
  a.rows = 2;
  a.hc = 4;
  a.hidden = 64;
  a.sinkhorn_iters = 1;
  a.streams = reinterpret_cast<const float*>(uintptr_t{256});
  a.fn = reinterpret_cast<const float*>(uintptr_t{512});
  EXPECT_TRUE(kernels::HcMixFromStreamsSupported(a));
  HcMixArgs b = a;
  b.hc = 3;
  EXPECT_FALSE(kernels::HcMixFromStreamsSupported(b));
  b = a;
  b.hidden = 48;
  EXPECT_FALSE(kernels::HcMixFromStreamsSupported(b));
  b = a;
  b.fn = nullptr;
  EXPECT_FALSE(kernels::HcMixFromStreamsSupported(b));
  b = a;
  b.hidden = 8192 + 32;
  EXPECT_FALSE(kernels::HcMixFromStreamsSupported(b));
  b = a;
  b.normed = reinterpret_cast<float*>(uintptr_t{1024});
  EXPECT_FALSE(kernels::HcMixFromStreamsSupported(b));  // no norm weight
  b.out_norm_weight = reinterpret_cast<const float*>(uintptr_t{2048});
  EXPECT_TRUE(kernels::HcMixFromStreamsSupported(b));
  b.normed = reinterpret_cast<float*>(uintptr_t{1028});
  EXPECT_FALSE(kernels::HcMixFromStreamsSupported(b));
  b.normed = nullptr;
  b.normed_bf16 = reinterpret_cast<uint16_t*>(uintptr_t{1032});
  EXPECT_TRUE(kernels::HcMixFromStreamsSupported(b));
  b.normed_bf16 = reinterpret_cast<uint16_t*>(uintptr_t{1036});
  EXPECT_FALSE(kernels::HcMixFromStreamsSupported(b));
  b.out_norm_weight = nullptr;
  b.normed_bf16 = reinterpret_cast<uint16_t*>(uintptr_t{1032});
  EXPECT_FALSE(kernels::HcMixFromStreamsSupported(b));  // no norm weight
  b = a;
  b.collapsed = reinterpret_cast<float*>(uintptr_t{1028});
  EXPECT_FALSE(kernels::HcMixFromStreamsSupported(b));
  b = a;
  b.streams = reinterpret_cast<const float*>(uintptr_t{260});
  EXPECT_FALSE(kernels::HcMixFromStreamsSupported(b));
  EXPECT_EQ(kernels::HcMixFromStreamsF32(b, nullptr, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepinfer
