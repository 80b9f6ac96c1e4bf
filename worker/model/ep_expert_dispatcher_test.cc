// EpExpertDispatcher with every rank as a thread of this process over TcpCommunicator (loopback):
//  * dispatch groups rows by local expert, then source rank, then source token order, and a rank
//    without tokens takes part;
//  * combine adds each token's contributions in ascending expert id, bit for bit as
//    LocalExpertDispatcher (on data where another order gives other bits);
//  * the HF-made fixture models over 2 and 4 ranks (experts partitioned, each rank loading only
//    its own) give logits bit-identical to one rank hosting every expert, also with uneven
//    token counts and ranks that step with an empty batch;
//  * the same over 2 and 4 ranks with two micro-batches per step (their exchanges on the model's
//    exchange thread), and one rank with two micro-batches against one;
//  * experts that do not divide over the ranks, and a bad expert id, are errors (not hangs).
#include "worker/model/ep_expert_dispatcher.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/comm/tcp_communicator.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/ep_test_script.h"
#include "worker/model/local_expert_dispatcher.h"
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
using ::testing::HasSubstr;
using Group = std::vector<std::unique_ptr<comm::TcpCommunicator>>;

// Forms a group of `n` ranks, one thread each; empty (and a test failure) on error.
Group MakeGroup(int n) {
  Group group(n);
  auto root = comm::TcpCommunicator::ListenRoot("127.0.0.1:0");
  EXPECT_TRUE(root.ok()) << root.status();
  if (!root.ok()) return {};
  const std::string address = root->address;
  auto root_ptr = std::make_unique<comm::TcpCommunicator::RootListener>(std::move(*root));
  std::vector<absl::Status> status(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      comm::TcpCommunicatorSpec spec;
      spec.rank = r;
      spec.world_size = n;
      spec.root_address = address;
      spec.group_incarnation = 42;
      spec.timeout = absl::Seconds(60);  // liveness bound only
      auto c = comm::TcpCommunicator::Create(spec, r == 0 ? std::move(root_ptr) : nullptr);
      status[r] = c.status();
      if (c.ok()) group[r] = std::move(*c);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    if (!status[r].ok()) return {};
  }
  return group;
}

// Forwards to a rank's communicator and counts the exchange calls (AllToAllSizes, AllToAllV) made
// on the thread that built it, the rank's model thread, and on any other (the model's
// ExchangeThread with two micro-batches).
class ThreadCountingComm final : public comm::Communicator {
 public:
  explicit ThreadCountingComm(comm::Communicator* inner)
      : inner_(inner), owner_(std::this_thread::get_id()) {}
  int rank() const override { return inner_->rank(); }
  int world_size() const override { return inner_->world_size(); }
  comm::MemoryKind memory_kind() const override { return inner_->memory_kind(); }
  void Abort(const absl::Status& reason) override { inner_->Abort(reason); }
  int64_t on_model_thread() const { return on_owner_.load(); }
  int64_t elsewhere() const { return elsewhere_.load(); }

 private:
  void Count() { (std::this_thread::get_id() == owner_ ? on_owner_ : elsewhere_).fetch_add(1); }
  absl::Status DoAllToAllV(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                           const std::vector<size_t>& recv_bytes,
                           comm::StreamHandle stream) override {
    Count();
    return inner_->AllToAllV(send, send_bytes, recv, recv_bytes, stream);
  }
  absl::StatusOr<std::vector<size_t>> DoAllToAllSizes(
      const std::vector<size_t>& send_bytes) override {
    Count();
    return inner_->AllToAllSizes(send_bytes);
  }
  absl::Status DoAllGather(const void* send, size_t bytes_per_rank, void* recv,
                           comm::StreamHandle stream) override {
    return inner_->AllGather(send, bytes_per_rank, recv, stream);
  }
  absl::Status DoAllReduce(const void* send, void* recv, size_t count, comm::DataType type,
                           comm::ReduceOp op, comm::StreamHandle stream) override {
    return inner_->AllReduce(send, recv, count, type, op, stream);
  }
  absl::Status DoBarrier(comm::StreamHandle stream) override { return inner_->Barrier(stream); }

  comm::Communicator* const inner_;
  const std::thread::id owner_;
  std::atomic<int64_t> on_owner_{0}, elsewhere_{0};
};

void OnAllRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

// One rank's routing input for the dispatcher-level tests.
struct RankInput {
  int64_t tokens = 0;
  std::vector<float> hidden;  // [tokens, H]
  std::vector<int32_t> ids;   // [tokens, K]
  std::vector<float> weights;
};

// `tokens[r]` tokens on rank r, each choosing K distinct experts in random (not ascending)
// order; hidden values from `value(rank, token, column)`.
std::vector<RankInput> RandomInputs(const std::vector<int64_t>& tokens, int64_t E, int64_t K,
                                    int64_t H, uint32_t seed,
                                    const std::function<float(int, int64_t, int64_t)>& value) {
  std::mt19937 rng(seed);
  std::vector<RankInput> in(tokens.size());
  for (size_t r = 0; r < tokens.size(); ++r) {
    RankInput& x = in[r];
    x.tokens = tokens[r];
    for (int64_t t = 0; t < x.tokens; ++t) {
      for (int64_t c = 0; c < H; ++c) x.hidden.push_back(value(r, t, c));
      std::vector<int32_t> all(E);
      for (int32_t e = 0; e < E; ++e) all[e] = e;
      std::shuffle(all.begin(), all.end(), rng);
      for (int64_t k = 0; k < K; ++k) {
        x.ids.push_back(all[k]);
        x.weights.push_back(0.25f + static_cast<float>(rng() % 1000) / 997.0f);
      }
    }
  }
  return in;
}

TEST(EpExpertDispatcherTest, DispatchGroupsByLocalExpertThenSourceRankThenToken) {
  for (int world : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("world ", world));
    const int64_t E = 8, K = 3, H = 2;
    // Rank 1 has no tokens; hidden row = (rank, token).
    std::vector<int64_t> tokens = {5, 0, 7, 3};
    tokens.resize(world);
    auto in = RandomInputs(tokens, E, K, H, 7 + world,
                           [](int r, int64_t t, int64_t c) { return c == 0 ? r : t; });
    Group group = MakeGroup(world);
    ASSERT_EQ(group.size(), static_cast<size_t>(world));
    std::vector<std::vector<float>> rows(world);
    std::vector<std::vector<int64_t>> offsets(world), local(world);
    std::vector<absl::Status> status(world);
    OnAllRanks(world, [&](int r) {
      CpuBackend be(1);
      auto d = EpExpertDispatcher::Create(group[r].get(), &be, E, H);
      status[r] = d.status();
      if (!d.ok()) return;
      local[r] = (*d)->local_experts(0);
      DispatchedTokens dt;
      status[r] = (*d)->Dispatch(0, in[r].tokens, K, in[r].hidden.data(), in[r].ids.data(),
                                 in[r].weights.data(), &dt);
      if (!status[r].ok()) return;
      const float* h = dt.hidden->as<float>();
      rows[r].assign(h, h + dt.num_rows * H);
      offsets[r] = dt.group_offsets;
    });
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
      const int64_t per = E / world;
      std::vector<int64_t> want_local;
      for (int64_t e = r * per; e < (r + 1) * per; ++e) want_local.push_back(e);
      EXPECT_EQ(local[r], want_local);
      // Expected rows: local expert ascending, then source rank, then source token.
      std::vector<float> want;
      std::vector<int64_t> want_offsets = {0};
      for (int64_t e : want_local) {
        for (int s = 0; s < world; ++s) {
          for (int64_t i = 0; i < in[s].tokens * K; ++i) {
            if (in[s].ids[i] == e) want.insert(want.end(), {float(s), float(i / K)});
          }
        }
        want_offsets.push_back(static_cast<int64_t>(want.size()) / H);
      }
      EXPECT_EQ(offsets[r], want_offsets) << "rank " << r;
      EXPECT_EQ(rows[r], want) << "rank " << r;
    }
  }
}

// Terms of very different magnitudes, so that the order in which a token's contributions are
// added changes the float result.
float ExpertScale(int64_t e) {
  static const float kScale[8] = {3e7f, 1.0f, -3e7f, 3.0f, 7e7f, 0.5f, -7e7f, 5.0f};
  return kScale[e];
}

// The "experts" of the combine test: output row = input row * ExpertScale(global expert).
std::vector<float> ScaledExperts(const DispatchedTokens& d, const std::vector<int64_t>& experts,
                                 int64_t H) {
  std::vector<float> out(d.num_rows * H);
  const float* rows = d.hidden->as<float>();
  for (size_t g = 0; g < experts.size(); ++g) {
    for (int64_t i = d.group_offsets[g] * H; i < d.group_offsets[g + 1] * H; ++i) {
      out[i] = rows[i] * ExpertScale(experts[g]);
    }
  }
  return out;
}

TEST(EpExpertDispatcherTest, CombineAddsInAscendingExpertOrderLikeLocal) {
  for (int world : {2, 4}) {
    SCOPED_TRACE(absl::StrCat("world ", world));
    const int64_t E = 8, K = 4, H = 3;
    std::vector<int64_t> tokens = {40, 0, 25, 33};
    tokens.resize(world);
    auto in = RandomInputs(tokens, E, K, H, 11 + world, [](int r, int64_t t, int64_t c) {
      return 1.0f + static_cast<float>((r * 131 + t * 17 + c * 7) % 23) / 8.0f;
    });
    Group group = MakeGroup(world);
    ASSERT_EQ(group.size(), static_cast<size_t>(world));
    std::vector<std::vector<float>> ep(world), local(world);
    std::vector<absl::Status> status(world);
    OnAllRanks(world, [&](int r) {
      CpuBackend be(1);
      const RankInput& x = in[r];
      auto d = EpExpertDispatcher::Create(group[r].get(), &be, E, H);
      status[r] = d.status();
      if (!d.ok()) return;
      DispatchedTokens dt;
      status[r] =
          (*d)->Dispatch(0, x.tokens, K, x.hidden.data(), x.ids.data(), x.weights.data(), &dt);
      if (!status[r].ok()) return;
      std::vector<float> expert_out = ScaledExperts(dt, (*d)->local_experts(0), H);
      ep[r].assign(x.tokens * H, 0.0f);
      status[r] = (*d)->Combine(dt, expert_out.data(), ep[r].data());
      // The single-rank reference on the same tokens.
      LocalExpertDispatcher ld(&be, E, H, {0, 1, 2, 3, 4, 5, 6, 7});
      DispatchedTokens lt;
      EXPECT_TRUE(
          ld.Dispatch(0, x.tokens, K, x.hidden.data(), x.ids.data(), x.weights.data(), &lt).ok());
      std::vector<float> local_out = ScaledExperts(lt, ld.local_experts(0), H);
      local[r].assign(x.tokens * H, 0.0f);
      EXPECT_TRUE(ld.Combine(lt, local_out.data(), local[r].data()).ok());
    });
    int order_sensitive = 0;
    for (int r = 0; r < world; ++r) {
      ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
      EXPECT_TRUE(SameBits(ep[r], local[r]))
          << "rank " << r << " max diff " << MaxDiff(ep[r], local[r]);
      // Explicitly: ascending expert id per token; and the test data is such that the
      // router's k order would give other bits.
      const RankInput& x = in[r];
      for (int64_t t = 0; t < x.tokens; ++t) {
        std::map<int32_t, float> by_expert;
        for (int64_t k = 0; k < K; ++k) by_expert[x.ids[t * K + k]] = x.weights[t * K + k];
        for (int64_t c = 0; c < H; ++c) {
          const float v = x.hidden[t * H + c];
          float ascending = 0.0f, k_order = 0.0f;
          for (const auto& [e, w] : by_expert) ascending += w * (v * ExpertScale(e));
          for (int64_t k = 0; k < K; ++k) {
            k_order += x.weights[t * K + k] * (v * ExpertScale(x.ids[t * K + k]));
          }
          EXPECT_EQ(std::memcmp(&ep[r][t * H + c], &ascending, sizeof(float)), 0)
              << "rank " << r << " token " << t << ": " << ep[r][t * H + c] << " vs " << ascending;
          if (std::memcmp(&k_order, &ascending, sizeof(float)) != 0) ++order_sensitive;
        }
      }
    }
    EXPECT_GT(order_sensitive, 10) << "test data does not depend on the summation order";
  }
}

TEST(EpExpertDispatcherTest, ExpertsThatDoNotDivideOverTheRanksAreAnError) {
  Group group = MakeGroup(3);
  ASSERT_EQ(group.size(), 3u);
  CpuBackend be(1);
  auto d = EpExpertDispatcher::Create(group[1].get(), &be, 8, 96);
  EXPECT_TRUE(absl::IsInvalidArgument(d.status())) << d.status();
  EXPECT_THAT(std::string(d.status().message()),
              HasSubstr("8 routed experts do not divide over 3 ranks"));
}

TEST(EpExpertDispatcherTest, BadExpertIdFailsEveryRankInsteadOfHanging) {
  Group group = MakeGroup(2);
  ASSERT_EQ(group.size(), 2u);
  std::vector<absl::Status> status(2);
  OnAllRanks(2, [&](int r) {
    CpuBackend be(1);
    auto d = EpExpertDispatcher::Create(group[r].get(), &be, 4, 1);
    ASSERT_TRUE(d.ok()) << d.status();
    std::vector<float> hidden = {1.0f}, w = {1.0f};
    std::vector<int32_t> ids = {r == 0 ? 9 : 1};
    DispatchedTokens dt;
    status[r] = (*d)->Dispatch(0, 1, 1, hidden.data(), ids.data(), w.data(), &dt);
  });
  EXPECT_TRUE(absl::IsFailedPrecondition(status[0])) << status[0];
  EXPECT_THAT(std::string(status[0].message()), HasSubstr("expert 9"));
  EXPECT_FALSE(status[1].ok());  // told by rank 0's abort (or its closed connection)
}

// ---- The fixture models end to end ---------------------------------------------------------

// An EPLB placement with replicas for `layers` MoE layers of E experts over `world` ranks:
// E + world slots, slot p of layer l hosting expert (3p + l) mod E, so every expert has a slot
// and `world` experts per layer have two (sometimes both on one rank).
std::shared_ptr<const ExpertPlacement> ReplicaPlacement(int E, int world, int layers) {
  std::vector<std::vector<int>> phy2log(layers, std::vector<int>(E + world));
  for (int l = 0; l < layers; ++l) {
    for (int p = 0; p < E + world; ++p) phy2log[l][p] = (3 * p + l) % E;
  }
  auto placement = ExpertPlacement::FromPhy2Log(phy2log, E);
  EXPECT_TRUE(placement.ok()) << placement.status();
  return std::make_shared<const ExpertPlacement>(std::move(*placement));
}

enum class PlacementMode {
  kNone,         // contiguous experts, no placement
  kFromStart,    // the replica placement from the first step
  kSwitchLater,  // contiguous, then switched live to the replica placement before step 2
};

// Runs `scripts` once on a single rank hosting every expert (LocalExpertDispatcher, one
// micro-batch per step) and once over `world` expert-parallel ranks, each loading only its own
// experts, with `micro_batches` per step, and compares every logit bit for bit. With two
// micro-batches every exchange call must come from another thread than the rank's model thread
// (the model's ExchangeThread), with one from the model thread.
void ExpectEpEqualsOneRank(const std::string& fixture, int world,
                           const std::vector<Script>& scripts, int steps,
                           PlacementMode mode = PlacementMode::kNone, int micro_batches = 1) {
  const std::vector<ScriptedSeq> seqs = MakeSeqs(scripts);
  const std::string dir = FixtureDir(fixture);
  auto config = ModelConfig::FromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  const int64_t per = config->n_routed_experts / world;
  LogitsMap reference;
  {
    CpuBackend be(2);
    auto model = LoadModel(dir, &be);
    ASSERT_TRUE(model.ok()) << model.status();
    absl::Status st = RunScript(model->get(), &be, seqs, -1, steps, &reference);
    ASSERT_TRUE(st.ok()) << st;
  }
  Group group = MakeGroup(world);
  ASSERT_EQ(group.size(), static_cast<size_t>(world));
  std::vector<LogitsMap> got(world);
  std::vector<absl::Status> status(world);
  const int64_t moe_layers = config->num_hidden_layers - config->first_k_dense_replace;
  std::shared_ptr<const ExpertPlacement> placement =
      mode == PlacementMode::kNone ? nullptr
                                   : ReplicaPlacement(static_cast<int>(config->n_routed_experts),
                                                      world, static_cast<int>(moe_layers));
  OnAllRanks(world, [&](int r) {
    CpuBackend be(1);
    ThreadCountingComm counting(group[r].get());
    comm::Communicator* c = &counting;
    LoadOptions load;
    std::vector<std::vector<int64_t>> placed;
    if (placement != nullptr) placed = EpExpertDispatcher::ExpertsOfRank(*placement, world, r);
    load.hosts_expert = [&](int64_t layer, int64_t e) {
      if (mode != PlacementMode::kFromStart) return e / per == r;
      const auto& mine = placed[layer - config->first_k_dense_replace];
      return std::find(mine.begin(), mine.end(), e) != mine.end();
    };
    ExpertDispatcherFactory make =
        [&, c](const ModelConfig& cfg, const ModelWeights& w,
               Backend* b) -> absl::StatusOr<std::unique_ptr<ExpertDispatcher>> {
      auto d = EpExpertDispatcher::Create(c, b, cfg.n_routed_experts, cfg.hidden_size,
                                          mode == PlacementMode::kFromStart ? placement : nullptr);
      if (!d.ok()) return d.status();
      return std::unique_ptr<ExpertDispatcher>(std::move(*d));
    };
    auto model = LoadModel(dir, &be, load, make);
    status[r] = model.status();
    if (!model.ok()) {
      c->Abort(model.status());
      return;
    }
    CausalLm* m = model->get();
    status[r] = m->SetMicroBatches(micro_batches);
    if (!status[r].ok()) {
      c->Abort(status[r]);
      return;
    }
    auto switch_to_placement = [&]() -> absl::Status {
      std::vector<std::vector<int64_t>> missing = m->MissingExperts(placed);
      ModelConfig cfg;
      auto source = OpenWeightSource(dir, &cfg);
      if (!source.ok()) return source.status();
      auto loaded = ModelWeights::LoadRoutedExperts(cfg, source->get(), &be, missing);
      if (!loaded.ok()) return loaded.status();
      return m->SwitchPlacement(placement, placed, std::move(*loaded));
    };
    status[r] = RunScript(m, &be, seqs, r, steps, &got[r], [&](int step) {
      return mode == PlacementMode::kSwitchLater && step == 2 ? switch_to_placement()
                                                              : absl::OkStatus();
    });
    if (micro_batches == 2) {
      EXPECT_EQ(counting.on_model_thread(), 0) << "rank " << r;
      EXPECT_GT(counting.elsewhere(), 0) << "rank " << r;
    } else {
      EXPECT_GT(counting.on_model_thread(), 0) << "rank " << r;
      EXPECT_EQ(counting.elsewhere(), 0) << "rank " << r;
    }
  });
  for (int r = 0; r < world; ++r) ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  size_t compared = 0;
  for (const auto& [key, logits] : reference) {
    const int rank = seqs[key.first].s.rank;
    auto it = got[rank].find(key);
    ASSERT_NE(it, got[rank].end()) << "sequence " << key.first << " step " << key.second;
    EXPECT_TRUE(SameBits(it->second, logits))
        << "sequence " << key.first << " (rank " << rank << ") step " << key.second
        << ": max |ep - one rank| = " << MaxDiff(it->second, logits);
    ++compared;
  }
  size_t produced = 0;
  for (const LogitsMap& m : got) produced += m.size();
  EXPECT_EQ(produced, compared);
  EXPECT_GT(compared, 0u);
}

class EpModelTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(EpModelTest, EvenBatchesGiveLogitsBitIdenticalToOneRank) {
  const auto& [fixture, world] = GetParam();
  // Two sequences per rank: a prompt of 9-20 tokens, then 4 decode steps.
  std::vector<Script> scripts;
  for (int r = 0; r < world; ++r) {
    scripts.push_back({r, 0, 9 + 3 * r, 64, 4});
    scripts.push_back({r, 0, 20 - 2 * r, 64, 4});
  }
  ExpectEpEqualsOneRank(fixture, world, scripts, 5);
}

TEST_P(EpModelTest, UnevenTokensAndIdleRanksGiveLogitsBitIdenticalToOneRank) {
  const auto& [fixture, world] = GetParam();
  // Rank 1 never has a sequence; rank 0 has three (one prefilled in chunks, one starting late),
  // the last rank one short sequence that finishes early, so later steps are empty batches.
  std::vector<Script> scripts = {
      {0, 0, 30, 7, 3},  // chunked prefill: 5 steps, then 3 decodes
      {0, 2, 5, 64, 6},
      {0, 0, 1, 64, 2},
      {world - 1, 1, 3, 64, 1},
  };
  if (world > 2) scripts.push_back({2, 3, 12, 5, 2});
  ExpectEpEqualsOneRank(fixture, world, scripts, 9);
}

TEST_P(EpModelTest, ReplicaPlacementGivesLogitsBitIdenticalToOneRank) {
  const auto& [fixture, world] = GetParam();
  std::vector<Script> scripts = {{0, 0, 30, 7, 3}, {0, 2, 5, 64, 6}, {world - 1, 1, 9, 64, 4}};
  for (int r = 1; r < world - 1; ++r) scripts.push_back({r, 0, 13, 64, 3});
  ExpectEpEqualsOneRank(fixture, world, scripts, 9, PlacementMode::kFromStart);
}

TEST_P(EpModelTest, LivePlacementSwitchMidRunGivesLogitsBitIdenticalToOneRank) {
  const auto& [fixture, world] = GetParam();
  std::vector<Script> scripts = {{0, 0, 30, 7, 3}, {0, 2, 5, 64, 6}, {world - 1, 1, 9, 64, 4}};
  for (int r = 1; r < world - 1; ++r) scripts.push_back({r, 0, 13, 64, 3});
  ExpectEpEqualsOneRank(fixture, world, scripts, 9, PlacementMode::kSwitchLater);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EpModelTest,
                         ::testing::Combine(::testing::Values("dsv3_qlora_rope", "dsv3_yarn_nolora",
                                                              "dsv4_mix", "dsv4_bf16"),
                                            ::testing::Values(2, 4)),
                         [](const ::testing::TestParamInfo<EpModelTest::ParamType>& info) {
                           return absl::StrCat(std::get<0>(info.param), "_world",
                                               std::get<1>(info.param));
                         });

// Two micro-batches per step (CausalLm::SetMicroBatches): each rank's sequences in two halves
// whose exchanges run on the model's ExchangeThread while the other half computes; logits (so
// tokens) bit-identical to one rank with one micro-batch, with uneven and idle ranks, chunked
// prefill and a replica placement switched in mid-run.
class EpMicroBatchTest : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(EpMicroBatchTest, TwoMicroBatchesGiveLogitsBitIdenticalToOneRank) {
  const auto& [fixture, world] = GetParam();
  std::vector<Script> scripts = {
      {0, 0, 30, 7, 3},  // chunked prefill: 5 steps, then 3 decodes
      {0, 2, 5, 64, 6}, {0, 0, 1, 64, 2}, {0, 1, 9, 64, 5}, {world - 1, 1, 3, 64, 1},
  };
  for (int r = 2; r < world; ++r) scripts.push_back({r, r, 12, 5, 2});
  ExpectEpEqualsOneRank(fixture, world, scripts, 9, PlacementMode::kNone, 2);
}

TEST_P(EpMicroBatchTest, TwoMicroBatchesWithALivePlacementSwitchGiveLogitsBitIdenticalToOneRank) {
  const auto& [fixture, world] = GetParam();
  std::vector<Script> scripts = {{0, 0, 30, 7, 3}, {0, 2, 5, 64, 6}, {world - 1, 1, 9, 64, 4}};
  for (int r = 1; r < world - 1; ++r) scripts.push_back({r, 0, 13, 64, 3});
  ExpectEpEqualsOneRank(fixture, world, scripts, 9, PlacementMode::kSwitchLater, 2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, EpMicroBatchTest,
                         ::testing::Combine(::testing::Values("dsv3_qlora_rope",
                                                              "dsv3_yarn_nolora"),
                                            ::testing::Values(2, 4)),
                         [](const ::testing::TestParamInfo<EpMicroBatchTest::ParamType>& info) {
                           return absl::StrCat(std::get<0>(info.param), "_world",
                                               std::get<1>(info.param));
                         });

// One rank (LocalExpertDispatcher: no exchange to overlap) with two micro-batches: the split and
// the merge of the step's sequences alone, against one micro-batch.
TEST(EpMicroBatchTest, OneRankWithTwoMicroBatchesIsBitIdenticalToOne) {
  const std::vector<ScriptedSeq> seqs =
      MakeSeqs({{0, 0, 30, 7, 3}, {0, 2, 5, 64, 6}, {0, 0, 1, 64, 2}, {0, 1, 9, 64, 5}});
  LogitsMap runs[2];
  for (int mb : {1, 2}) {
    CpuBackend be(2);
    auto model = LoadModel(FixtureDir("dsv3_qlora_rope"), &be);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_TRUE((*model)->SetMicroBatches(mb).ok());
    EXPECT_EQ((*model)->micro_batches(), mb);
    absl::Status st = RunScript(model->get(), &be, seqs, -1, 9, &runs[mb - 1]);
    ASSERT_TRUE(st.ok()) << st;
  }
  ASSERT_EQ(runs[0].size(), runs[1].size());
  for (const auto& [key, logits] : runs[0]) {
    auto it = runs[1].find(key);
    ASSERT_NE(it, runs[1].end());
    EXPECT_TRUE(SameBits(it->second, logits)) << "sequence " << key.first << " step " << key.second;
  }
}

TEST(EpMicroBatchTest, OtherCountsAndModelsWithoutThePathAreRefused) {
  CpuBackend be(1);
  auto v3 = LoadModel(FixtureDir("dsv3_qlora_rope"), &be);
  ASSERT_TRUE(v3.ok()) << v3.status();
  EXPECT_TRUE(absl::IsInvalidArgument((*v3)->SetMicroBatches(3)));
  EXPECT_TRUE(absl::IsInvalidArgument((*v3)->SetMicroBatches(0)));
  EXPECT_EQ((*v3)->micro_batches(), 1);
  auto v4 = LoadModel(FixtureDir("dsv4_bf16"), &be);
  ASSERT_TRUE(v4.ok()) << v4.status();
  EXPECT_TRUE(absl::IsUnimplemented((*v4)->SetMicroBatches(2)));
  EXPECT_TRUE((*v4)->SetMicroBatches(1).ok());
}

TEST(EpModelLoadTest, ExpertsThatDoNotDivideOverTheRanksFailTheLoad) {
  Group group = MakeGroup(3);
  ASSERT_EQ(group.size(), 3u);
  CpuBackend be(1);
  comm::Communicator* c = group[0].get();
  ExpertDispatcherFactory make =
      [c](const ModelConfig& cfg, const ModelWeights&,
          Backend* b) -> absl::StatusOr<std::unique_ptr<ExpertDispatcher>> {
    auto d = EpExpertDispatcher::Create(c, b, cfg.n_routed_experts, cfg.hidden_size);
    if (!d.ok()) return d.status();
    return std::unique_ptr<ExpertDispatcher>(std::move(*d));
  };
  auto model = LoadModel(FixtureDir("dsv3_qlora_rope"), &be, LoadOptions{}, make);
  EXPECT_TRUE(absl::IsInvalidArgument(model.status())) << model.status();
  EXPECT_THAT(std::string(model.status().message()),
              HasSubstr("8 routed experts do not divide over 3 ranks"));
}

}  // namespace
}  // namespace deepinfer
