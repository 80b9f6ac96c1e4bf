// Expert parallelism over the device exchange (EpDeviceDispatcher on a one-rank NCCL group's
// symmetric window) with bf16 weights, where MoeBlock runs each MoE layer fully on the device
// (dispatch, Backend::RoutedExperts on the received rows, combine) and decode steps replay CUDA
// graphs, on the dummy DeepSeek-V3 shape of decode_graph_gpu_test and its batch schedule:
//  * the decode steps take graphs (one per bucket), and the replayed steps equal the same padded
//    steps run eagerly (replay off) bit for bit, EPLB counts included;
//  * against one rank hosting every expert (LocalExpertDispatcher, its own fused device path,
//    graphs on) on the same inputs: >= 99% of the tokens equal and logprobs within 1e-3 (the two
//    paths group and round the expert GEMMs differently);
//  * the exchange's error word stays clear.
// Skips without a GPU, and where this machine's NCCL gives no symmetric windows.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/nccl_test_util.h"
#include "worker/model/decode_graph_test_driver.h"
#include "worker/model/ep_device_dispatcher.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

testing::TinyMoeShape Shape() {
  testing::TinyMoeShape s;
  s.hidden = 1024;
  s.heads = 8;
  s.kv_lora = 512;
  s.nope = 128;
  s.rope = 64;
  s.v = 128;
  s.layers = 4;
  s.experts = 64;
  s.top_k = 6;
  s.moe_inter = 256;
  s.inter = 2048;
  s.vocab = 16384;
  return s;
}

TEST(EpDeviceGraphGpuTest, DecodeGraphsReplayTheDeviceExchange) {
  if (!deepinfer::testing::HasCudaDevice()) GTEST_SKIP() << "no CUDA device";
  if (std::string why = comm::testing::NoSymmetricWindows(); !why.empty()) GTEST_SKIP() << why;
  auto backend = CudaBackend::Create(0, WeightDType::kBFloat16);
  ASSERT_TRUE(backend.ok()) << backend.status();
  absl::StatusOr<std::string> id = comm::NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  comm::NcclCommunicatorSpec spec;
  spec.unique_id = *id;
  spec.default_stream = (*backend)->native_stream();
  spec.timeout = absl::Seconds(60);
  auto nccl = comm::NcclCommunicator::Create(spec);
  ASSERT_TRUE(nccl.ok()) << nccl.status();
  comm::Communicator* c = nccl->get();

  const std::string model = testing::WriteDummyModelSpec(Shape(), "ep_device_graph", 9);
  std::vector<EpDeviceDispatcher*> dispatchers;
  ExpertDispatcherFactory make =
      [&](const ModelConfig& cfg, const ModelWeights&,
          Backend* b) -> absl::StatusOr<std::unique_ptr<ExpertDispatcher>> {
    EpDeviceOptions options;
    options.max_tokens = 1024;  // prefill chunks of 16 prompts of <= 61 tokens
    options.top_k = static_cast<int32_t>(cfg.num_experts_per_tok);
    auto d = EpDeviceDispatcher::Create(c, b, cfg.n_routed_experts, cfg.hidden_size, options);
    if (!d.ok()) return d.status();
    std::printf("[ep-device] %s\n", (*d)->Describe().c_str());
    dispatchers.push_back(d->get());
    return std::unique_ptr<ExpertDispatcher>(std::move(*d));
  };
  auto load = [&](const DecodeGraphOptions& options, bool device) -> std::unique_ptr<CausalLm> {
    auto m = device ? LoadModel(model, backend->get(), LoadOptions{}, make)
                    : LoadModel(model, backend->get());
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return nullptr;
    (*m)->SetDecodeGraphOptions(options);
    return std::move(*m);
  };
  DecodeGraphOptions on, padded_eager;
  padded_eager.replay = false;
  std::unique_ptr<CausalLm> graphs = load(on, true);
  std::unique_ptr<CausalLm> eager = load(padded_eager, true);
  std::unique_ptr<CausalLm> local = load(on, false);
  ASSERT_TRUE(graphs && eager && local);

  const std::vector<int64_t>& schedule = testing::DecodeSchedule();
  auto a = testing::RunDecodeSchedule(graphs.get(), backend->get(), schedule, 100);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = testing::RunDecodeSchedule(eager.get(), backend->get(), schedule, 100);
  ASSERT_TRUE(b.ok()) << b.status();
  auto l = testing::RunDecodeSchedule(local.get(), backend->get(), schedule, 100, &*a);
  ASSERT_TRUE(l.ok()) << l.status();

  EXPECT_EQ(graphs->decode_graph_steps(), static_cast<int64_t>(schedule.size()));
  EXPECT_EQ(graphs->decode_graphs_recorded(), 6);  // buckets 1 4 8 64 128 2
  EXPECT_EQ(eager->decode_graphs_recorded(), 0);
  testing::ExpectBitIdentical(*a, *b);
  const testing::TokenAgreement agree = testing::CompareTokens(*a, *l);
  std::printf(
      "[ep-device] device exchange vs one rank with every expert: %lld / %lld tokens "
      "equal, max |logprob diff| %.3g\n",
      static_cast<long long>(agree.same), static_cast<long long>(agree.all),
      agree.worst_logprob_diff);
  EXPECT_GE(agree.same * 100, agree.all * 99);
  EXPECT_LE(agree.worst_logprob_diff, 1e-3);
  for (EpDeviceDispatcher* d : dispatchers) EXPECT_TRUE(d->CheckErrors().ok());
}

}  // namespace
}  // namespace deepinfer
