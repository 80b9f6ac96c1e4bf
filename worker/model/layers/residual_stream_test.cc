// PlainResidualStream: the fused form (adds deferred into the norm a block runs) gives the same
// x and normed rows as the op-by-op form, and the op-by-op form is x += block(RmsNorm(x)).
#include "worker/model/layers/residual_stream.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"

namespace deepinfer {
namespace {

constexpr int64_t kRows = 3, kHidden = 8, kBlocks = 3;
constexpr float kEps = 1e-6f;

std::vector<float> Random(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (float& x : v) x = d(gen);
  return v;
}

struct BlocksRun {
  std::vector<float> x;               // after every block's output was added
  std::vector<std::vector<float>> h;  // the normed rows each block read
};

// kBlocks blocks, block b writing its normed rows times (b + 2) as its output.
BlocksRun RunBlocks(bool fused) {
  CpuBackend be(1);
  const auto x0 = Random(kRows * kHidden, 1);
  auto x = be.Allocate(x0.size() * sizeof(float)), y = be.Allocate(x0.size() * sizeof(float));
  be.CopyToDevice(x0.data(), x0.size() * sizeof(float), x->data());
  std::vector<std::vector<float>> weights;
  for (int64_t b = 0; b < kBlocks; ++b) weights.push_back(Random(kHidden, 10 + b));
  PlainResidualStream stream(&be, kRows, kHidden, kEps, OpMode{fused, false}, x->as<float>(),
                             y->as<float>());
  BlocksRun run;
  for (int64_t b = 0; b < kBlocks; ++b) {
    const ResidualNorm* norm = stream.Norm(weights[b].data());
    EXPECT_EQ(norm != nullptr, fused);
    if (norm != nullptr) {
      EXPECT_EQ(norm->y == nullptr, b == 0) << "nothing is pending before the first block";
      be.AddRmsNorm(kRows, kHidden, norm->x, norm->y, norm->weight, norm->eps, norm->out,
                    norm->out_bf16);
    }
    std::vector<float> h(kRows * kHidden);
    be.CopyToHost(stream.h(), h.size() * sizeof(float), h.data());
    std::vector<float> out(h.size());
    for (size_t i = 0; i < h.size(); ++i) out[i] = h[i] * static_cast<float>(b + 2);
    be.CopyToDevice(out.data(), out.size() * sizeof(float), stream.block_out());
    stream.Add();
    run.h.push_back(h);
  }
  EXPECT_EQ(stream.pending(), fused);
  if (stream.pending()) be.Add(kRows * kHidden, x->as<float>(), y->as<float>(), x->as<float>());
  run.x.resize(x0.size());
  be.CopyToHost(x->data(), x0.size() * sizeof(float), run.x.data());
  return run;
}

TEST(PlainResidualStreamTest, FusedEqualsOpByOp) {
  const BlocksRun fused = RunBlocks(true), plain = RunBlocks(false);
  EXPECT_EQ(fused.x, plain.x);
  EXPECT_EQ(fused.h, plain.h);
}

TEST(PlainResidualStreamTest, OpByOpIsXPlusBlockOfNormedX) {
  const BlocksRun plain = RunBlocks(false);
  // Host: the same blocks over x0 in double.
  const auto x0 = Random(kRows * kHidden, 1);
  std::vector<double> x(x0.begin(), x0.end());
  for (int64_t b = 0; b < kBlocks; ++b) {
    const auto w = Random(kHidden, 10 + b);
    for (int64_t r = 0; r < kRows; ++r) {
      double ss = 0;
      for (int64_t j = 0; j < kHidden; ++j) ss += x[r * kHidden + j] * x[r * kHidden + j];
      const double inv = 1.0 / std::sqrt(ss / kHidden + kEps);
      std::vector<double> h(kHidden);
      for (int64_t j = 0; j < kHidden; ++j) {
        h[j] = x[r * kHidden + j] * inv * w[j];
        EXPECT_NEAR(plain.h[b][r * kHidden + j], h[j], 1e-5) << b << " " << r << " " << j;
      }
      for (int64_t j = 0; j < kHidden; ++j) x[r * kHidden + j] += h[j] * (b + 2);
    }
  }
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(plain.x[i], x[i], 1e-4) << i;
}

}  // namespace
}  // namespace deepinfer
