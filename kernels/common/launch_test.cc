// A chain of dependent kernels launched with programmatic dependent launch: each step reads
// elements the previous step wrote in other blocks, so a step that ran ahead of its predecessor
// would read stale values. Checked against the host's values eagerly and replayed from a CUDA
// graph (whose kernel-to-kernel edges must be programmatic), with a memset and stream-ordered
// allocations (non-kernel graph nodes) inside the chain, also captured beside the chain
// (capture_deps.h), and with PDL switched off.
#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/common/capture_deps.h"
#include "kernels/common/pdl.h"
#include "kernels/common/pdl_chain.h"
#include "kernels/testing/gpu_test_util.h"

namespace deepinfer {
namespace kernels {
namespace {

using ::deepinfer::testing::DeviceArray;

constexpr int64_t kN = 1 << 18;
constexpr int kSteps = 40;

std::vector<float> HostChain(const std::vector<float>& x0, const std::vector<float>& w, int steps) {
  std::vector<float> x = x0, y(x0.size());
  const int64_t n = static_cast<int64_t>(x0.size());
  for (int s = 0; s < steps; ++s) {
    for (int64_t i = 0; i < n; ++i) y[i] = std::fma(x[(i * 7919) % n], w[i % 256], 1.0f);
    x.swap(y);
  }
  return x;
}

struct Mode {
  bool pdl;
  bool aside;  // the chain's allocations through MallocAsideAsync / FreeAsideAsync
};

class PdlChainTest : public ::testing::TestWithParam<Mode> {
 protected:
  void SetUp() override {
    DEEPINFER_SKIP_WITHOUT_GPU();
    SetProgrammaticDependentLaunch(GetParam().pdl);
  }
  void TearDown() override { SetProgrammaticDependentLaunch(true); }
};

// Values that stay bounded: w in [-1, 1) halves, x in [-1, 1).
std::vector<float> Inputs(size_t n, uint32_t seed, float scale) {
  std::vector<float> v = ::deepinfer::testing::RandomFloats(n, seed, 1.0f);
  for (float& f : v) f = scale * (f > 1.0f ? 1.0f : (f < -1.0f ? -1.0f : f));
  return v;
}

// Enqueues kSteps steps ping-ponging between a and b (the result in a, kSteps even); every
// eighth step goes through a buffer allocated on the stream just before it and freed after it,
// and a memset of an unrelated buffer sits in the middle, so the chain has non-kernel nodes.
cudaError_t Enqueue(float* a, float* b, const float* w, float* unrelated, bool aside,
                    cudaStream_t st) {
  for (int s = 0; s < kSteps; ++s) {
    float* x = s % 2 == 0 ? a : b;
    float* y = s % 2 == 0 ? b : a;
    cudaError_t e;
    if (s % 8 == 3) {
      void* tmp = nullptr;
      e = aside ? MallocAsideAsync(&tmp, kN * sizeof(float), st)
                : cudaMallocAsync(&tmp, kN * sizeof(float), st);
      if (e != cudaSuccess) return e;
      if ((e = ChainStep(kN, x, w, static_cast<float*>(tmp), st)) != cudaSuccess) return e;
      // A memcpy node between two kernels.
      if ((e = cudaMemcpyAsync(y, tmp, kN * sizeof(float), cudaMemcpyDeviceToDevice, st)) !=
          cudaSuccess)
        return e;
      e = aside ? FreeAsideAsync(tmp, st) : cudaFreeAsync(tmp, st);
      if (e != cudaSuccess) return e;
    } else {
      if ((e = ChainStep(kN, x, w, y, st)) != cudaSuccess) return e;
    }
    if (s == kSteps / 2) {
      if ((e = cudaMemsetAsync(unrelated, 0, 1024, st)) != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

TEST_P(PdlChainTest, EagerChainMatchesHost) {
  const uint32_t seed = ::deepinfer::testing::FreshSeed();
  SCOPED_TRACE(seed);
  const std::vector<float> x0 = Inputs(kN, seed, 1.0f), w = Inputs(256, seed + 1, 0.5f);
  DeviceArray<float> a(x0), b(kN), dw(w), unrelated(256);
  cudaStream_t st;
  DEEPINFER_CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  b.Poison();
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
  DEEPINFER_CUDA_OK(Enqueue(a.get(), b.get(), dw.get(), unrelated.get(), GetParam().aside, st));
  std::vector<float> got;
  DEEPINFER_CUDA_OK(a.Download(&got));
  EXPECT_EQ(got, HostChain(x0, w, kSteps));
  DEEPINFER_CUDA_OK(cudaStreamDestroy(st));
}

TEST_P(PdlChainTest, GraphReplayMatchesHostWithProgrammaticEdges) {
  const uint32_t seed = ::deepinfer::testing::FreshSeed();
  SCOPED_TRACE(seed);
  const std::vector<float> x0 = Inputs(kN, seed, 1.0f), w = Inputs(256, seed + 1, 0.5f);
  DeviceArray<float> a(x0), b(kN), dw(w), unrelated(256);
  cudaStream_t st;
  DEEPINFER_CUDA_OK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
  cudaGraph_t graph;
  DEEPINFER_CUDA_OK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  DEEPINFER_CUDA_OK(Enqueue(a.get(), b.get(), dw.get(), unrelated.get(), GetParam().aside, st));
  DEEPINFER_CUDA_OK(cudaStreamEndCapture(st, &graph));

  size_t edges = 0;
  DEEPINFER_CUDA_OK(cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &edges));
  std::vector<cudaGraphNode_t> from(edges), to(edges);
  std::vector<cudaGraphEdgeData> data(edges);
  DEEPINFER_CUDA_OK(cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &edges));
  int programmatic = 0;
  for (const cudaGraphEdgeData& d : data) {
    if (d.type == cudaGraphDependencyTypeProgrammatic) ++programmatic;
  }
  int major = 0;
  DEEPINFER_CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
  if (GetParam().pdl && major >= 9) {
    // Most steps follow a kernel directly (all but those after a copy or the memset).
    EXPECT_GE(programmatic, kSteps / 2) << "of " << edges << " edges";
  } else if (!GetParam().pdl) {
    EXPECT_EQ(programmatic, 0);
  }
  std::printf("%zu edges, %d programmatic (PDL %s)\n", edges, programmatic,
              GetParam().pdl ? "on" : "off");

  cudaGraphExec_t exec;
  DEEPINFER_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  const std::vector<float> want = HostChain(x0, w, kSteps);
  for (int replay = 0; replay < 3; ++replay) {
    a.Upload(x0);
    b.Poison();
    DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
    DEEPINFER_CUDA_OK(cudaGraphLaunch(exec, st));
    std::vector<float> got;
    DEEPINFER_CUDA_OK(a.Download(&got));
    EXPECT_EQ(got, want) << "replay " << replay;
  }
  DEEPINFER_CUDA_OK(cudaGraphExecDestroy(exec));
  DEEPINFER_CUDA_OK(cudaGraphDestroy(graph));
  DEEPINFER_CUDA_OK(cudaStreamDestroy(st));
}

INSTANTIATE_TEST_SUITE_P(PdlOnOff, PdlChainTest,
                         ::testing::Values(Mode{false, false}, Mode{true, false}, Mode{true, true},
                                           Mode{false, true}),
                         [](const ::testing::TestParamInfo<Mode>& info) {
                           return std::string(info.param.pdl ? "pdl_on" : "pdl_off") +
                                  (info.param.aside ? "_aside" : "");
                         });

}  // namespace
}  // namespace kernels
}  // namespace deepinfer
