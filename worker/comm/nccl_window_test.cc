// A one-rank NCCL group's symmetric window (ncclCommWindowRegister, pointers from the NCCL
// device API) carrying the device expert-parallel exchange (kernels/moe/ep_exchange.h): the
// combine equals a host sum written from the definition (out0 + fmaf(w, row) over each
// token's choices in ascending expert id; the stand-in experts return their input rows), and
// the exchange captured in a CUDA graph and replayed equals the eager run bit for bit. Skips
// without a GPU, and where NCCL gives no symmetric windows (RegisterSymmetricWindow's
// UNIMPLEMENTED, printed).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/moe/ep_exchange.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/comm/nccl_communicator.h"

namespace deepinfer::comm {
namespace {

using deepinfer::testing::DeviceArray;
using kernels::EpMode;

class NcclWindowTest : public ::testing::TestWithParam<EpMode> {};

TEST_P(NcclWindowTest, OneRankExchangeInAGraphMatchesEagerAndTheDefinition) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const EpMode mode = GetParam();
  absl::StatusOr<std::string> id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclCommunicatorSpec spec;
  spec.unique_id = *id;
  spec.timeout = absl::Seconds(30);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> comm = NcclCommunicator::Create(spec);
  ASSERT_TRUE(comm.ok()) << comm.status();

  kernels::EpExchangeConfig cfg;
  cfg.world = 1;
  cfg.slots_per_rank = 64;
  cfg.top_k = 6;
  cfg.max_tokens = 48;
  cfg.hidden = 512;
  cfg.ll_capacity = cfg.max_tokens * cfg.top_k;
  cfg.tp_capacity = cfg.max_tokens * cfg.top_k;
  const kernels::EpLayout layout = kernels::EpLayoutOf(cfg);
  absl::StatusOr<SymmetricWindow> window = (*comm)->RegisterSymmetricWindow(layout.window_bytes);
  // The machine's NCCL gives no symmetric memory (nccl_window_refused_test checks that refusal).
  if (absl::IsUnimplemented(window.status())) GTEST_SKIP() << window.status();
  ASSERT_TRUE(window.ok()) << window.status();
  ASSERT_EQ(window->peers.size(), 1u);
  ASSERT_NE(window->peers[0], nullptr);
  DeviceArray<char> scratch(layout.scratch_bytes);
  kernels::EpRankView view;
  view.rank = 0;
  view.window[0] = static_cast<char*>(window->peers[0]);
  view.scratch = scratch.get();

  const uint32_t seed = deepinfer::testing::FreshSeed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 gen(seed);
  const int32_t T = 37, K = cfg.top_k, H = cfg.hidden;
  const std::vector<float> hidden = deepinfer::testing::RandomFloats(T * H, gen());
  const std::vector<float> out0 = deepinfer::testing::RandomFloats(T * H, gen());
  std::vector<int32_t> ids;
  std::vector<float> weights;
  std::uniform_real_distribution<float> wdist(0.05f, 1.0f);
  for (int32_t t = 0; t < T; ++t) {
    std::vector<int32_t> pool(cfg.slots_per_rank);
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), gen);
    for (int32_t k = 0; k < K; ++k) {
      ids.push_back(pool[k]);
      weights.push_back(wdist(gen));
    }
  }
  std::vector<float> want = out0;
  for (int32_t t = 0; t < T; ++t) {
    std::vector<int32_t> order(K);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return ids[t * K + a] < ids[t * K + b]; });
    for (int32_t k : order) {
      for (int32_t h = 0; h < H; ++h) {
        want[t * H + h] = std::fma(weights[t * K + k], hidden[t * H + h], want[t * H + h]);
      }
    }
  }

  DeviceArray<float> d_hidden(hidden), d_out0(out0), d_out(out0.size()), d_weights(weights);
  DeviceArray<int32_t> d_ids(ids);
  DeviceArray<float> expert_out(layout.max_received * H);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto exchange = [&]() {
    cudaMemcpyAsync(d_out.get(), d_out0.get(), out0.size() * 4, cudaMemcpyDeviceToDevice, stream);
    ASSERT_EQ(
        kernels::EpDispatchSend(cfg, mode, view, T, d_hidden.get(), d_ids.get(), nullptr, stream),
        cudaSuccess);
    ASSERT_EQ(kernels::EpDispatchRows(cfg, mode, view, T, d_hidden.get(), stream), cudaSuccess);
    ASSERT_EQ(kernels::EpDispatchRecv(cfg, mode, view, stream), cudaSuccess);
    cudaMemcpyAsync(expert_out.get(), kernels::EpReceivedRows(cfg, mode, view),
                    layout.max_received * H * 4, cudaMemcpyDeviceToDevice, stream);
    ASSERT_EQ(kernels::EpCombineSend(cfg, view, expert_out.get(), stream), cudaSuccess);
    ASSERT_EQ(
        kernels::EpCombineRecv(cfg, view, T, d_ids.get(), d_weights.get(), d_out.get(), stream),
        cudaSuccess);
  };
  ASSERT_EQ(cudaMemset(scratch.get(), 0, layout.scratch_bytes), cudaSuccess);
  exchange();
  std::vector<float> eager;
  ASSERT_EQ(d_out.Download(&eager), cudaSuccess);
  EXPECT_TRUE(std::memcmp(eager.data(), want.data(), want.size() * 4) == 0)
      << deepinfer::testing::AllClose(eager, want, 0, 0).message();

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  exchange();
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    d_out.Poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    std::vector<float> got;
    ASSERT_EQ(d_out.Download(&got), cudaSuccess);
    EXPECT_TRUE(std::memcmp(got.data(), eager.data(), got.size() * 4) == 0) << "replay " << replay;
  }
  int32_t error = -1;
  cudaMemcpy(&error, kernels::EpErrorWord(cfg, view), 4, cudaMemcpyDeviceToHost);
  EXPECT_EQ(error, 0);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Modes, NcclWindowTest,
                         ::testing::Values(EpMode::kLowLatency, EpMode::kThroughput),
                         [](const ::testing::TestParamInfo<EpMode>& info) {
                           return info.param == EpMode::kLowLatency ? std::string("LowLatency")
                                                                    : std::string("Throughput");
                         });

}  // namespace
}  // namespace deepinfer::comm
