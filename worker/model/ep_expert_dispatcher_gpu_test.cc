// EpExpertDispatcher with a device communicator (NCCL) on the CUDA backend, the fixture models
// end to end:
//  * one rank over NCCL (one GPU): logits bit-identical to LocalExpertDispatcher and to the
//    host-staged TCP path on the same GPU;
//  * two ranks over NCCL, one GPU each (skipped with fewer GPUs): logits bit-identical to the
//    same two ranks over TCP (the host-staged path), and equal to one rank hosting every expert
//    within fp32 tolerance (bit-identical on the CPU backend, see ep_expert_dispatcher_test;
//    on CUDA each rank's dense GEMMs see another batch size than the one rank's, and cuBLAS may
//    pick another kernel for it);
//  * two ranks with an EPLB placement with replicas (docs/eplb.md): NCCL bit-identical to TCP
//    with the same placement, and equal to no placement within fp32 tolerance;
//  * a device communicator with the CPU backend is refused.
// The device-exchange cases skip where this machine's NCCL gives no symmetric windows
// (nccl_test_util.h).
// fp32 weights: with bf16 ones a LocalExpertDispatcher model takes Backend::RoutedExperts (fp32
// activations into the grouped expert GEMM) while the expert-parallel path rounds activations
// to bf16 for cuBLAS, so "local" and "one rank over NCCL" would differ by bf16 rounding.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/comm/data_plane.h"
#include "worker/comm/nccl_communicator.h"
#include "worker/comm/nccl_test_util.h"
#include "worker/comm/tcp_test_group.h"
#include "worker/model/ep_device_dispatcher.h"
#include "worker/model/ep_expert_dispatcher.h"
#include "worker/model/ep_test_script.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

using ep_testing::FixtureDir;
using ep_testing::LogitsMap;
using ep_testing::MakeSeqs;
using ep_testing::MaxDiff;
using ep_testing::RunScript;
using ep_testing::SameBits;
using ep_testing::Script;
using ep_testing::ScriptedSeq;

int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// kDevice: NCCL forms the group and registers a symmetric window; EpDeviceDispatcher moves the
// rows through it (kernels/moe/ep_exchange.h) in `device_mode`.
enum class Plane { kTcp, kNccl, kDevice };
kernels::EpMode device_mode = kernels::EpMode::kLowLatency;

// Runs the scripts' sequences on `world` expert-parallel ranks (rank r on GPU r, loading only
// its experts) over `plane`, with `placement` if set; got[r] = rank r's logits.
void RunEp(const std::string& fixture, int world, const std::vector<ScriptedSeq>& seqs, int steps,
           Plane plane, std::vector<LogitsMap>* got,
           std::shared_ptr<const ExpertPlacement> placement = nullptr) {
  const std::string dir = FixtureDir(fixture);
  auto config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  const int64_t per = config->n_routed_experts / world;
  comm::testing::TcpGroup tcp = comm::testing::MakeTcpGroup(world);
  ASSERT_EQ(tcp.size(), static_cast<size_t>(world));
  got->assign(world, {});
  std::vector<absl::Status> status(world);
  comm::testing::OnAllRanks(world, [&](int r) {
    // Destroyed in reverse: model, NCCL communicator, backend.
    auto backend = CudaBackend::Create(r, WeightDType::kFloat32);
    if (!backend.ok()) {
      status[r] = backend.status();
      tcp[r]->Abort(status[r]);
      return;
    }
    std::unique_ptr<comm::Communicator> nccl;
    comm::Communicator* c = tcp[r].get();
    if (plane == Plane::kNccl || plane == Plane::kDevice) {
      auto formed = comm::FormNcclCommunicator(tcp[r].get(), r, (*backend)->native_stream(),
                                               absl::Seconds(60));
      if (!formed.ok()) {
        status[r] = formed.status();
        return;
      }
      nccl = std::move(*formed);
      c = nccl.get();
    }
    LoadOptions load;
    std::vector<std::vector<int64_t>> placed;
    if (placement != nullptr) placed = EpExpertDispatcher::ExpertsOfRank(*placement, world, r);
    load.hosts_expert = [&](int64_t layer, int64_t e) {
      if (placement == nullptr) return e / per == r;
      const auto& mine = placed[layer - config->first_k_dense_replace];
      return std::find(mine.begin(), mine.end(), e) != mine.end();
    };
    ExpertDispatcherFactory make =
        [c, placement, plane](const ModelConfig& cfg, const ModelWeights&,
                              Backend* b) -> absl::StatusOr<std::unique_ptr<ExpertDispatcher>> {
      if (plane == Plane::kDevice) {
        EpDeviceOptions options;
        options.max_tokens = 256;
        options.top_k = static_cast<int32_t>(cfg.num_experts_per_tok);
        options.mode = device_mode;
        auto d = EpDeviceDispatcher::Create(c, b, cfg.n_routed_experts, cfg.hidden_size, options,
                                            placement);
        if (!d.ok()) return d.status();
        std::cout << "rank " << c->rank() << ": " << (*d)->Describe() << "\n";
        return std::unique_ptr<ExpertDispatcher>(std::move(*d));
      }
      auto d = EpExpertDispatcher::Create(c, b, cfg.n_routed_experts, cfg.hidden_size, placement);
      if (!d.ok()) return d.status();
      return std::unique_ptr<ExpertDispatcher>(std::move(*d));
    };
    auto model = LoadModel(dir, backend->get(), load, make);
    status[r] = model.status();
    if (!model.ok()) {
      c->Abort(model.status());
      return;
    }
    status[r] =
        RunScript(model->get(), backend->get(), seqs, world == 1 ? -1 : r, steps, &(*got)[r]);
    if (!status[r].ok()) c->Abort(status[r]);
  });
  for (int r = 0; r < world; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
}

// One CUDA rank hosting every expert (LocalExpertDispatcher).
void RunOneRank(const std::string& fixture, const std::vector<ScriptedSeq>& seqs, int steps,
                LogitsMap* out) {
  auto backend = CudaBackend::Create(0, WeightDType::kFloat32);
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto model = LoadModel(FixtureDir(fixture), backend->get());
  ASSERT_TRUE(model.ok()) << model.status();
  absl::Status st = RunScript(model->get(), backend->get(), seqs, -1, steps, out);
  ASSERT_TRUE(st.ok()) << st;
}

// Every (sequence, step) of `reference` in `got` (by the sequence's rank, or rank 0 when
// `one_rank`); bit for bit, or within `tolerance` relative to the logit range.
void Compare(const std::vector<ScriptedSeq>& seqs, const LogitsMap& reference,
             const std::vector<LogitsMap>& got, bool one_rank, bool bit_exact, const char* what) {
  size_t compared = 0, exact = 0;
  float worst = 0;
  for (const auto& [key, logits] : reference) {
    const int rank = one_rank ? 0 : seqs[key.first].s.rank;
    auto it = got[rank].find(key);
    ASSERT_NE(it, got[rank].end()) << what << ": sequence " << key.first << " step " << key.second;
    const bool same = SameBits(it->second, logits);
    exact += same;
    float scale = 1;
    for (float v : logits) scale = std::max(scale, std::abs(v));
    const float diff = MaxDiff(it->second, logits);
    worst = std::max(worst, diff / scale);
    if (bit_exact) {
      EXPECT_TRUE(same) << what << ": sequence " << key.first << " step " << key.second
                        << ": max diff " << diff;
    } else {
      EXPECT_LE(diff, 1e-4f * scale)
          << what << ": sequence " << key.first << " step " << key.second;
    }
    ++compared;
  }
  EXPECT_GT(compared, 0u);
  std::cout << what << ": " << compared << " logit rows compared, " << exact
            << " bit-identical, worst relative diff " << worst << "\n";
}

std::vector<Script> UnevenScripts() {
  // Rank 0 has three sequences (one prefilled in chunks, one starting late), rank 1 one short
  // sequence that finishes early, so its later steps are empty batches.
  return {
      {0, 0, 30, 7, 3}, {0, 2, 5, 64, 6}, {0, 0, 1, 64, 2}, {1, 1, 3, 64, 1}, {1, 0, 12, 64, 4}};
}

class EpGpuTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EpGpuTest, OneRankOverNcclIsBitIdenticalToLocalAndToTcp) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const std::vector<ScriptedSeq> seqs = MakeSeqs(UnevenScripts());
  LogitsMap local;
  RunOneRank(GetParam(), seqs, 9, &local);
  std::vector<LogitsMap> nccl, tcp;
  RunEp(GetParam(), 1, seqs, 9, Plane::kNccl, &nccl);
  RunEp(GetParam(), 1, seqs, 9, Plane::kTcp, &tcp);
  Compare(seqs, local, nccl, true, true, "1 rank NCCL vs local");
  Compare(seqs, tcp[0], nccl, true, true, "1 rank NCCL vs 1 rank TCP");
}

// The device exchange through a one-rank NCCL group's symmetric window, in both modes.
TEST_P(EpGpuTest, OneRankDeviceExchangeIsBitIdenticalToLocal) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  if (std::string why = comm::testing::NoSymmetricWindows(); !why.empty()) GTEST_SKIP() << why;
  const std::vector<ScriptedSeq> seqs = MakeSeqs(UnevenScripts());
  LogitsMap local;
  RunOneRank(GetParam(), seqs, 9, &local);
  for (kernels::EpMode mode : {kernels::EpMode::kLowLatency, kernels::EpMode::kThroughput}) {
    device_mode = mode;
    std::vector<LogitsMap> device;
    RunEp(GetParam(), 1, seqs, 9, Plane::kDevice, &device);
    Compare(seqs, local, device, true, true,
            mode == kernels::EpMode::kLowLatency ? "1 rank device (low latency) vs local"
                                                 : "1 rank device (throughput) vs local");
  }
}

TEST_P(EpGpuTest, TwoRanksDeviceExchangeEqualsTcpBitForBit) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs, have " << GpuCount();
  if (std::string why = comm::testing::NoSymmetricWindows(); !why.empty()) GTEST_SKIP() << why;
  const std::vector<ScriptedSeq> seqs = MakeSeqs(UnevenScripts());
  std::vector<LogitsMap> tcp;
  RunEp(GetParam(), 2, seqs, 9, Plane::kTcp, &tcp);
  LogitsMap tcp_all;
  for (const LogitsMap& m : tcp) tcp_all.insert(m.begin(), m.end());
  for (kernels::EpMode mode : {kernels::EpMode::kLowLatency, kernels::EpMode::kThroughput}) {
    device_mode = mode;
    std::vector<LogitsMap> device;
    RunEp(GetParam(), 2, seqs, 9, Plane::kDevice, &device);
    Compare(seqs, tcp_all, device, false, true, "2 ranks device vs 2 ranks TCP");
  }
}

TEST_P(EpGpuTest, TwoRanksOverNcclEqualTcpBitForBitAndOneRank) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs, have " << GpuCount();
  const std::vector<ScriptedSeq> seqs = MakeSeqs(UnevenScripts());
  std::vector<LogitsMap> nccl, tcp;
  RunEp(GetParam(), 2, seqs, 9, Plane::kNccl, &nccl);
  RunEp(GetParam(), 2, seqs, 9, Plane::kTcp, &tcp);
  LogitsMap tcp_all;
  for (const LogitsMap& m : tcp) tcp_all.insert(m.begin(), m.end());
  Compare(seqs, tcp_all, nccl, false, true, "2 ranks NCCL vs 2 ranks TCP");
  LogitsMap local;
  RunOneRank(GetParam(), seqs, 9, &local);
  Compare(seqs, local, nccl, false, false, "2 ranks NCCL vs one rank");
}

TEST_P(EpGpuTest, TwoRanksWithReplicaPlacementOverNcclEqualTcpBitForBit) {
  if (GpuCount() < 2) GTEST_SKIP() << "needs 2 GPUs, have " << GpuCount();
  auto config = ModelConfig::FromFile(FixtureDir(GetParam()) + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  // E + 2 slots per MoE layer; slot p hosts expert (3p + l) mod E, so two experts per layer
  // have a replica.
  const int E = static_cast<int>(config->n_routed_experts);
  const int layers = static_cast<int>(config->num_hidden_layers - config->first_k_dense_replace);
  std::vector<std::vector<int>> phy2log(layers, std::vector<int>(E + 2));
  for (int l = 0; l < layers; ++l) {
    for (int p = 0; p < E + 2; ++p) phy2log[l][p] = (3 * p + l) % E;
  }
  auto placement = ExpertPlacement::FromPhy2Log(phy2log, E);
  ASSERT_TRUE(placement.ok()) << placement.status();
  auto shared = std::make_shared<const ExpertPlacement>(std::move(*placement));
  const std::vector<ScriptedSeq> seqs = MakeSeqs(UnevenScripts());
  std::vector<LogitsMap> nccl, tcp, plain;
  RunEp(GetParam(), 2, seqs, 9, Plane::kNccl, &nccl, shared);
  RunEp(GetParam(), 2, seqs, 9, Plane::kTcp, &tcp, shared);
  RunEp(GetParam(), 2, seqs, 9, Plane::kTcp, &plain);
  LogitsMap tcp_all, plain_all;
  for (const LogitsMap& m : tcp) tcp_all.insert(m.begin(), m.end());
  for (const LogitsMap& m : plain) plain_all.insert(m.begin(), m.end());
  Compare(seqs, tcp_all, nccl, false, true, "2 ranks + placement: NCCL vs TCP");
  Compare(seqs, plain_all, nccl, false, false, "2 ranks + placement vs no placement");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EpGpuTest,
                         ::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora"));

TEST(EpGpuCreateTest, DeviceCommunicatorWithTheCpuBackendIsRefused) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto id = comm::NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  comm::NcclCommunicatorSpec spec;
  spec.unique_id = *id;
  auto c = comm::NcclCommunicator::Create(spec);
  ASSERT_TRUE(c.ok()) << c.status();
  CpuBackend cpu(1);
  auto d = EpExpertDispatcher::Create(c->get(), &cpu, 8, 16);
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  EXPECT_THAT(std::string(d.status().message()), ::testing::HasSubstr("'cpu'"));
}

}  // namespace
}  // namespace deepinfer
