// RmsNormF32 against CpuBackend::RmsNorm: strided rows, several widths, in place and not.
#include "kernels/norm/rms_norm.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/activation/elementwise.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

TEST(RmsNormKernelTest, MatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t dim : {7, 96, 512, 1536, 7168}) {
    for (int64_t rows : {1, 5, 33}) {
      for (bool in_place : {false, true}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << "dim " << dim << " rows " << rows << " in_place "
                                          << in_place << " seed " << seed);
        const int64_t ldx = dim + 3;  // a column slice of a wider matrix, as the model uses
        const int64_t ldout = in_place ? ldx : dim;
        auto x = testing::RandomFloats(rows * ldx, seed, 3.0f);
        auto w = testing::RandomFloats(dim, seed + 1);
        const float eps = 1e-6f;
        std::vector<float> want = in_place ? x : std::vector<float>(rows * ldout, 0.0f);
        cpu.RmsNorm(rows, dim, x.data(), ldx, w.data(), eps, want.data(), ldout);

        DeviceArray<float> dx(x), dw(w), dout(rows * ldout);
        float* out = dout.get();
        if (in_place) {
          out = dx.get();
        } else {
          dout.Poison();
        }
        DEEPINFER_CUDA_OK(
            kernels::RmsNormF32(rows, dim, dx.get(), ldx, dw.get(), eps, out, ldout, nullptr));
        std::vector<float> got;
        DEEPINFER_CUDA_OK(in_place ? dx.Download(&got) : dout.Download(&got));
        if (!in_place) {
          // Only the first dim columns of each output row belong to the op.
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t i = dim; i < ldout; ++i) got[r * ldout + i] = want[r * ldout + i];
          }
        }
        EXPECT_TRUE(AllClose(got, want, 1e-5, 1e-5));
      }
    }
  }
}

// AddRmsNormF32 against CpuBackend::AddRmsNorm, and bit for bit against the three kernels it
// replaces (AddF32, RmsNormF32, RoundF32ToBf16), with and without y and each output. The
// widths reach each register-held row size (up to 2048, 4096, 7168) and the loop beyond.
TEST(RmsNormKernelTest, AddRmsNormMatchesCpuBackendAndTheUnfusedKernels) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t dim : {7, 512, 2048, 2049, 4096, 7168, 7169}) {
    for (int64_t rows : {1, 5, 33}) {
      for (int variant = 0; variant < 4; ++variant) {
        const bool with_y = variant != 1, want_f32 = variant != 2, want_bf16 = variant != 3;
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << "dim " << dim << " rows " << rows << " variant "
                                          << variant << " seed " << seed);
        const int64_t n = rows * dim;
        auto x = testing::RandomFloats(n, seed, 3.0f);
        auto y = testing::RandomFloats(n, seed + 1, 2.0f);
        auto w = testing::RandomFloats(dim, seed + 2);
        const float eps = 1e-6f;
        std::vector<float> cpu_x = x, cpu_out(n);
        std::vector<uint16_t> cpu_bf16(n);
        cpu.AddRmsNorm(rows, dim, cpu_x.data(), with_y ? y.data() : nullptr, w.data(), eps,
                       cpu_out.data(), cpu_bf16.data());

        DeviceArray<float> dx(x), dy(y), dw(w), dout(n);
        DeviceArray<uint16_t> dbf16(n);
        dout.Poison();
        dbf16.Poison();
        DEEPINFER_CUDA_OK(kernels::AddRmsNormF32(rows, dim, dx.get(), with_y ? dy.get() : nullptr,
                                                 dw.get(), eps, want_f32 ? dout.get() : nullptr,
                                                 want_bf16 ? dbf16.get() : nullptr, nullptr));
        std::vector<float> got_x, got_out;
        std::vector<uint16_t> got_bf16;
        DEEPINFER_CUDA_OK(dx.Download(&got_x));
        DEEPINFER_CUDA_OK(dout.Download(&got_out));
        DEEPINFER_CUDA_OK(dbf16.Download(&got_bf16));
        EXPECT_TRUE(AllClose(got_x, cpu_x, 0, 0));  // one fp32 add per element

        // The unfused kernels on the original x.
        DeviceArray<float> ux(x), uout(n);
        DeviceArray<uint16_t> ubf16(n);
        if (with_y) DEEPINFER_CUDA_OK(kernels::AddF32(n, ux.get(), dy.get(), ux.get(), nullptr));
        DEEPINFER_CUDA_OK(
            kernels::RmsNormF32(rows, dim, ux.get(), dim, dw.get(), eps, uout.get(), dim, nullptr));
        DEEPINFER_CUDA_OK(kernels::RoundF32ToBf16(n, uout.get(), ubf16.get(), nullptr));
        std::vector<float> unfused_out;
        std::vector<uint16_t> unfused_bf16;
        DEEPINFER_CUDA_OK(uout.Download(&unfused_out));
        DEEPINFER_CUDA_OK(ubf16.Download(&unfused_bf16));
        if (want_f32) {
          EXPECT_TRUE(AllClose(got_out, cpu_out, 1e-5, 1e-5));
          EXPECT_TRUE(AllClose(got_out, unfused_out, 0, 0));
        } else {
          for (float v : got_out) ASSERT_TRUE(std::isnan(v)) << "out written though null";
        }
        if (want_bf16) {
          EXPECT_EQ(got_bf16, unfused_bf16);
          int64_t far = 0;  // the CPU's rounding of its own (1e-5-close) values
          for (int64_t i = 0; i < n; ++i) {
            far += std::abs(Bf16BitsToFloat(got_bf16[i]) - Bf16BitsToFloat(cpu_bf16[i])) >
                   1e-5f + std::abs(cpu_out[i]) * (1.0f / 128);
          }
          EXPECT_EQ(far, 0);
        } else {
          for (uint16_t v : got_bf16) ASSERT_EQ(v, 0xFFFF) << "out_bf16 written though null";
        }
      }
    }
  }
}

// The vectorised AddRmsNormF32 (16-byte aligned rows) against the scalar kernel (the same rows at
// an address 4 bytes off 16-byte alignment), bit for bit, at prefill row counts, each row size
// the vectorised kernel handles and one it does not (dim % 4 != 0, scalar either way); and
// against the CPU backend.
TEST(RmsNormKernelTest, VectorisedAddRmsNormIsBitForBitTheScalarKernel) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  struct Case {
    int64_t rows, dim;
    bool with_y;
  };
  for (const Case& c :
       {Case{8192, 2048, true}, Case{8192, 2048, false}, Case{300, 1024, true},
        Case{64, 4096, true}, Case{64, 7168, true}, Case{64, 7164, true}, Case{64, 2046, true}}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "rows " << c.rows << " dim " << c.dim << " with_y "
                                      << c.with_y << " seed " << seed);
    const int64_t n = c.rows * c.dim;
    auto x = testing::RandomFloats(n, seed, 3.0f);
    auto y = testing::RandomFloats(n, seed + 1, 2.0f);
    auto w = testing::RandomFloats(c.dim, seed + 2);
    const float eps = 1e-6f;
    std::vector<float> got_x[2], got_out[2];
    std::vector<uint16_t> got_bf16[2];
    // offset 0: x as given (16-byte aligned); 1: x one float into the buffer (the scalar kernel).
    for (int offset = 0; offset < 2; ++offset) {
      std::vector<float> placed(offset, 0.0f);
      placed.insert(placed.end(), x.begin(), x.end());
      DeviceArray<float> dx(placed), dy(y), dw(w), dout(n);
      DeviceArray<uint16_t> dbf16(n);
      dout.Poison();
      dbf16.Poison();
      DEEPINFER_CUDA_OK(kernels::AddRmsNormF32(c.rows, c.dim, dx.get() + offset,
                                               c.with_y ? dy.get() : nullptr, dw.get(), eps,
                                               dout.get(), dbf16.get(), nullptr));
      std::vector<float> all_x;
      DEEPINFER_CUDA_OK(dx.Download(&all_x));
      got_x[offset].assign(all_x.begin() + offset, all_x.end());
      DEEPINFER_CUDA_OK(dout.Download(&got_out[offset]));
      DEEPINFER_CUDA_OK(dbf16.Download(&got_bf16[offset]));
    }
    EXPECT_TRUE(AllClose(got_x[0], got_x[1], 0, 0));
    EXPECT_TRUE(AllClose(got_out[0], got_out[1], 0, 0));
    EXPECT_EQ(got_bf16[0], got_bf16[1]);

    std::vector<float> cpu_x = x, cpu_out(n);
    std::vector<uint16_t> cpu_bf16(n);
    cpu.AddRmsNorm(c.rows, c.dim, cpu_x.data(), c.with_y ? y.data() : nullptr, w.data(), eps,
                   cpu_out.data(), cpu_bf16.data());
    EXPECT_TRUE(AllClose(got_out[0], cpu_out, 1e-5, 1e-5));
    EXPECT_TRUE(AllClose(got_x[0], cpu_x, 0, 0));
  }
}

// StridedRmsNormF32 (rows of a wider matrix, as the query half of a stacked q_a and kv_a GEMM's
// output) bit for bit against AddRmsNormF32 without y on a contiguous copy of the rows, both
// outputs, the 16-byte-access kernel (ldx % 4 == 0) and the scalar one; x unchanged; and
// against the CPU backend.
TEST(RmsNormKernelTest, StridedRowsAreBitForBitAddRmsNormOfTheirCopy) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t dim : {7, 512, 1536, 2049, 7169}) {
    for (int64_t pad : {0, 3, 576}) {
      for (int64_t rows : {1, 5, 130}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message()
                     << "dim " << dim << " pad " << pad << " rows " << rows << " seed " << seed);
        const int64_t ldx = dim + pad, n = rows * dim;
        auto x = testing::RandomFloats(rows * ldx, seed, 3.0f);
        auto w = testing::RandomFloats(dim, seed + 1);
        const float eps = 1e-6f;
        std::vector<float> packed(n);
        for (int64_t r = 0; r < rows; ++r) {
          std::copy(x.begin() + r * ldx, x.begin() + r * ldx + dim, packed.begin() + r * dim);
        }
        DeviceArray<float> dx(x), dpacked(packed), dw(w), dout(n), wout(n);
        DeviceArray<uint16_t> dbf16(n), wbf16(n);
        dout.Poison();
        dbf16.Poison();
        DEEPINFER_CUDA_OK(kernels::StridedRmsNormF32(rows, dim, dx.get(), ldx, dw.get(), eps,
                                                     dout.get(), dbf16.get(), nullptr));
        DEEPINFER_CUDA_OK(kernels::AddRmsNormF32(rows, dim, dpacked.get(), nullptr, dw.get(), eps,
                                                 wout.get(), wbf16.get(), nullptr));
        std::vector<float> got_x, got_out, want_out;
        std::vector<uint16_t> got_bf16, want_bf16;
        DEEPINFER_CUDA_OK(dx.Download(&got_x));
        DEEPINFER_CUDA_OK(dout.Download(&got_out));
        DEEPINFER_CUDA_OK(wout.Download(&want_out));
        DEEPINFER_CUDA_OK(dbf16.Download(&got_bf16));
        DEEPINFER_CUDA_OK(wbf16.Download(&want_bf16));
        EXPECT_TRUE(AllClose(got_x, x, 0, 0));
        EXPECT_TRUE(AllClose(got_out, want_out, 0, 0));
        EXPECT_EQ(got_bf16, want_bf16);
        std::vector<float> cpu_out(n);
        cpu.RmsNorm(rows, dim, x.data(), ldx, w.data(), eps, cpu_out.data(), dim);
        EXPECT_TRUE(AllClose(got_out, cpu_out, 1e-5, 1e-5));
      }
    }
  }
}

// RmsNormF32's kernels (one warp per row up to 2048 wide, register-held rows up to 16384, the
// loop beyond) against AddRmsNormF32 without y on a contiguous copy of the rows, whose reduction
// is the same order (the test above ties it to the unfused kernel), bit for bit: strided rows,
// in place and not, row counts that leave a block's last warps without a row; and against the
// CPU backend.
TEST(RmsNormKernelTest, EveryRowWidthIsBitForBitTheAddRmsNormReduction) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t dim : {1, 33, 256, 257, 512, 1000, 1024, 2048, 2049, 4096, 8192, 16384, 16385}) {
    for (int64_t rows : {1, 9, 300}) {
      for (bool in_place : {false, true}) {
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << "dim " << dim << " rows " << rows << " in_place "
                                          << in_place << " seed " << seed);
        const int64_t ldx = dim + 5;
        const int64_t ldout = in_place ? ldx : dim;
        auto x = testing::RandomFloats(rows * ldx, seed, 3.0f);
        auto w = testing::RandomFloats(dim, seed + 1);
        const float eps = 1e-6f;
        std::vector<float> packed(rows * dim);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < dim; ++i) packed[r * dim + i] = x[r * ldx + i];
        }
        DeviceArray<float> px(packed), pw(w), pout(rows * dim);
        DEEPINFER_CUDA_OK(kernels::AddRmsNormF32(rows, dim, px.get(), nullptr, pw.get(), eps,
                                                 pout.get(), nullptr, nullptr));
        std::vector<float> want;
        DEEPINFER_CUDA_OK(pout.Download(&want));
        std::vector<float> cpu_out(rows * dim);
        cpu.RmsNorm(rows, dim, packed.data(), dim, w.data(), eps, cpu_out.data(), dim);

        DeviceArray<float> dx(x), dw(w), dout(rows * ldout);
        dout.Poison();
        float* out = in_place ? dx.get() : dout.get();
        DEEPINFER_CUDA_OK(
            kernels::RmsNormF32(rows, dim, dx.get(), ldx, dw.get(), eps, out, ldout, nullptr));
        std::vector<float> all;
        DEEPINFER_CUDA_OK(in_place ? dx.Download(&all) : dout.Download(&all));
        std::vector<float> got(rows * dim);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = 0; i < dim; ++i) got[r * dim + i] = all[r * ldout + i];
          // The columns past dim of a strided row are not the op's: untouched in place.
          for (int64_t i = dim; in_place && i < ldout; ++i) {
            ASSERT_EQ(all[r * ldout + i], x[r * ldx + i]) << "row " << r << " column " << i;
          }
        }
        EXPECT_TRUE(AllClose(got, want, 0, 0));
        EXPECT_TRUE(AllClose(got, cpu_out, 1e-5, 1e-5));
      }
    }
  }
}

}  // namespace
// AddRmsNormFp8: x, out and out_bf16 bit for bit AddRmsNormF32's (and out close to the CPU
// backend's), and q / scales what the block scheme of kernels::Fp8QuantizeRows gives on the host
// for the normed rows (out_bf16's values with from_bf16, out's without): s = max(amax / 448,
// FLT_MIN), q = e4m3(v / s) by the loader's encoder, padding rows zeros with scale 1. Widths of
// one partial block (48), a partial last block (1040), each vectorised row size (2048, 4096,
// 7168); rows padded to 4 or not.
TEST(RmsNormKernelTest, AddRmsNormFp8QuantisesTheNormedRows) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  CpuBackend cpu(2);
  for (int64_t dim : {48, 1040, 2048, 4096, 7168}) {
    for (int64_t rows : {1, 6, 128}) {
      for (int variant = 0; variant < 3; ++variant) {
        const bool from_bf16 = variant != 1, with_y = variant != 2;
        const uint32_t seed = testing::FreshSeed();
        SCOPED_TRACE(::testing::Message() << "dim " << dim << " rows " << rows << " from_bf16 "
                                          << from_bf16 << " y " << with_y << " seed " << seed);
        const int64_t n = rows * dim, m_pad = (rows + 3) / 4 * 4, ldq = dim + 16;
        const int64_t blocks = (dim + 127) / 128;
        auto x = testing::RandomFloats(n, seed, 3.0f);
        auto y = testing::RandomFloats(n, seed + 1, 2.0f);
        auto w = testing::RandomFloats(dim, seed + 2);
        // A row with a wide range of block magnitudes (e4m3 subnormals in the small blocks).
        for (int64_t i = 0; i < dim && rows > 1; ++i)
          w[i] *= std::ldexp(1.0f, (i / 128) % 5 * 4 - 8);
        const float eps = 1e-6f;
        std::vector<float> cpu_x = x, cpu_out(n);
        cpu.AddRmsNorm(rows, dim, cpu_x.data(), with_y ? y.data() : nullptr, w.data(), eps,
                       cpu_out.data(), nullptr);

        DeviceArray<float> dx(x), dy(y), dw(w), dout(n), ux(x), uout(n), ds(blocks * m_pad);
        DeviceArray<uint16_t> dbf16(n), ubf16(n);
        DeviceArray<uint8_t> dq(m_pad * ldq);
        dq.Poison();
        ds.Poison();
        kernels::RmsNormFp8Out fp8;
        fp8.q = dq.get(), fp8.ldq = ldq, fp8.scales = ds.get(), fp8.m_pad = m_pad;
        fp8.from_bf16 = from_bf16;
        ASSERT_TRUE(kernels::AddRmsNormFp8Supports(rows, dim, dx.get(), dy.get(), dw.get(),
                                                   dout.get(), dbf16.get(), fp8));
        DEEPINFER_CUDA_OK(kernels::AddRmsNormFp8(rows, dim, dx.get(), with_y ? dy.get() : nullptr,
                                                 dw.get(), eps, dout.get(), dbf16.get(), fp8,
                                                 nullptr));
        DEEPINFER_CUDA_OK(kernels::AddRmsNormF32(rows, dim, ux.get(), with_y ? dy.get() : nullptr,
                                                 dw.get(), eps, uout.get(), ubf16.get(), nullptr));
        std::vector<float> got_x, got_out, want_x, want_out, s;
        std::vector<uint16_t> got_bf16, want_bf16;
        std::vector<uint8_t> q;
        DEEPINFER_CUDA_OK(dx.Download(&got_x));
        DEEPINFER_CUDA_OK(dout.Download(&got_out));
        DEEPINFER_CUDA_OK(dbf16.Download(&got_bf16));
        DEEPINFER_CUDA_OK(ux.Download(&want_x));
        DEEPINFER_CUDA_OK(uout.Download(&want_out));
        DEEPINFER_CUDA_OK(ubf16.Download(&want_bf16));
        DEEPINFER_CUDA_OK(dq.Download(&q));
        DEEPINFER_CUDA_OK(ds.Download(&s));
        EXPECT_TRUE(AllClose(got_x, cpu_x, 0, 0));
        EXPECT_TRUE(AllClose(got_out, cpu_out, 1e-5, 1e-5));
        EXPECT_TRUE(AllClose(got_out, want_out, 0, 0));
        EXPECT_EQ(got_bf16, want_bf16);
        for (int64_t r = 0; r < m_pad; ++r) {
          for (int64_t b = 0; b < blocks; ++b) {
            const int64_t p0 = b * 128, p1 = std::min(dim, p0 + 128);
            float v[128] = {}, amax = 0.0f, want_s = 1.0f;
            if (r < rows) {
              for (int64_t c = p0; c < p1; ++c) {
                v[c - p0] =
                    from_bf16 ? Bf16BitsToFloat(got_bf16[r * dim + c]) : got_out[r * dim + c];
                amax = std::max(amax, std::fabs(v[c - p0]));
              }
              want_s = std::max(amax / 448.0f, FLT_MIN);
            }
            ASSERT_EQ(s[b * m_pad + r], want_s) << "scale of row " << r << " block " << b;
            for (int64_t c = p0; c < p1; ++c) {
              const uint8_t want = r < rows ? FloatToF8E4M3(v[c - p0] / want_s) : uint8_t{0};
              ASSERT_EQ(q[r * ldq + c], want) << "row " << r << " column " << c;
            }
          }
          for (int64_t c = dim; c < ldq; ++c) {
            ASSERT_EQ(q[r * ldq + c], 0xFF) << "column " << c << " of row " << r << " written";
          }
        }
      }
    }
  }
}

TEST(RmsNormKernelTest, AddRmsNormFp8RefusesRowsItDoesNotTake) {
  float* const p = reinterpret_cast<float*>(uintptr_t{256});
  kernels::RmsNormFp8Out fp8;
  fp8.q = reinterpret_cast<uint8_t*>(uintptr_t{512});
  fp8.ldq = 7168, fp8.scales = p, fp8.m_pad = 4;
  EXPECT_TRUE(kernels::AddRmsNormFp8Supports(4, 7168, p, nullptr, p, nullptr, nullptr, fp8));
  EXPECT_FALSE(kernels::AddRmsNormFp8Supports(4, 7184, p, nullptr, p, nullptr, nullptr, fp8));
  EXPECT_FALSE(kernels::AddRmsNormFp8Supports(4, 1000, p, nullptr, p, nullptr, nullptr, fp8));
  EXPECT_FALSE(kernels::AddRmsNormFp8Supports(5, 7168, p, nullptr, p, nullptr, nullptr, fp8));
  EXPECT_FALSE(kernels::AddRmsNormFp8Supports(4, 7168, p + 1, nullptr, p, nullptr, nullptr, fp8));
  fp8.ldq = 7160;
  EXPECT_FALSE(kernels::AddRmsNormFp8Supports(4, 7168, p, nullptr, p, nullptr, nullptr, fp8));
  EXPECT_EQ(kernels::AddRmsNormFp8(4, 7168, p, nullptr, p, 1e-6f, nullptr, nullptr, fp8, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace deepinfer
