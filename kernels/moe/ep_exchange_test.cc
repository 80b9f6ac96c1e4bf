// The device expert-parallel exchange (ep_exchange.h) with several ranks simulated on one GPU:
// each rank's window is its own device buffer and every rank's view points at all of them, and
// the phases run rank by rank on one stream (a phase never waits for a later phase of a peer).
// Checked against a host reference of the exchange written from the protocol's definition
// (grouping by (local slot, source rank, token); low latency keeps the first ll_capacity rows
// of a destination per source in (slot, token) order, throughput the first tp_capacity rows of
// a receiver): the received rows and slot offsets exactly, and the combine, bit for bit, against
// a host fmaf sum in ascending expert id of stand-in expert outputs (row * a per-slot scale,
// computed on the host from the rows the device received). Routing: random, empty experts and
// an empty rank, skewed onto one rank, EPLB replicas, bad ids, and overflow in both modes (the
// error word must say so and the combine must leave the dropped choices out). Last, the whole
// exchange of every rank captured in one CUDA graph and replayed: bit identical to eager.
#include "kernels/moe/ep_exchange.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"

namespace deepinfer {
namespace {

using kernels::EpExchangeConfig;
using kernels::EpMode;
using kernels::EpRankView;
using testing::DeviceArray;

enum class Routing { kRandom, kEmpty, kSkewed, kReplicas };

struct RankData {
  int32_t tokens = 0;
  std::vector<float> hidden;   // [tokens, H]
  std::vector<int32_t> ids;    // [tokens, K] logical (combine order)
  std::vector<int32_t> slots;  // [tokens, K] physical; empty: slot = id
  std::vector<float> weights;  // [tokens, K]
  std::vector<float> out0;     // [tokens, H]: what combine adds into
  int32_t SlotOf(int64_t i) const { return slots.empty() ? ids[i] : slots[i]; }
};

float Scale(int32_t slot) { return 1.0f + 0.125f * static_cast<float>(slot % 7); }

RankData MakeRank(const EpExchangeConfig& cfg, int32_t tokens, Routing routing, std::mt19937& gen) {
  RankData d;
  d.tokens = tokens;
  const int32_t H = cfg.hidden, K = cfg.top_k, P = cfg.world * cfg.slots_per_rank;
  d.hidden = testing::RandomFloats(static_cast<size_t>(tokens) * H, gen());
  d.out0 = testing::RandomFloats(static_cast<size_t>(tokens) * H, gen());
  std::uniform_real_distribution<float> wdist(0.05f, 1.0f);
  for (int32_t t = 0; t < tokens; ++t) {
    std::vector<int32_t> pool;
    if (routing == Routing::kReplicas) {
      for (int32_t e = 0; e < P / 2; ++e) pool.push_back(e);  // logical e: slots 2e, 2e+1
    } else if (routing == Routing::kEmpty) {
      // Only even slots, none on the last rank: empty experts and a rank that receives nothing.
      for (int32_t s = 0; s < P - cfg.slots_per_rank; s += 2) pool.push_back(s);
    } else if (routing == Routing::kSkewed && std::bernoulli_distribution(0.8)(gen)) {
      // Rank 0's slots first (at least K + 1 slots, so a token's choices stay distinct).
      for (int32_t s = 0; s < std::min(P, std::max(cfg.slots_per_rank, K + 1)); ++s) {
        pool.push_back(s);
      }
    } else {
      for (int32_t s = 0; s < P; ++s) pool.push_back(s);
    }
    std::shuffle(pool.begin(), pool.end(), gen);
    for (int32_t k = 0; k < K; ++k) {
      const int32_t e = pool[k % pool.size()];  // pools are larger than K
      d.ids.push_back(e);
      if (routing == Routing::kReplicas) d.slots.push_back(2 * e + (gen() & 1));
      d.weights.push_back(wdist(gen));
    }
  }
  return d;
}

// One received row: its source rank and the source's pair index (token * K + k).
struct Arrival {
  int32_t src, pair;
};

// The host reference of the exchange: for each rank, the rows it receives in grouped order,
// the offsets of its local slots; and which pairs of each source were delivered.
struct Reference {
  std::vector<std::vector<Arrival>> received;
  std::vector<std::vector<int32_t>> offsets;
  std::vector<std::vector<bool>> delivered;
  bool overflow = false;
};

Reference Exchange(const EpExchangeConfig& cfg, EpMode mode, const std::vector<RankData>& ranks) {
  const int32_t W = cfg.world, per = cfg.slots_per_rank;
  Reference ref;
  ref.delivered.resize(W);
  // Per destination: (slot, src, token-order pair) of every valid pair.
  std::vector<std::vector<std::tuple<int32_t, int32_t, int32_t>>> to(W);
  for (int32_t s = 0; s < W; ++s) {
    const RankData& d = ranks[s];
    const int64_t n = static_cast<int64_t>(d.tokens) * cfg.top_k;
    ref.delivered[s].assign(n, false);
    std::vector<std::vector<std::pair<int32_t, int32_t>>> mine(W);  // (slot, pair) per dest
    for (int64_t i = 0; i < n; ++i) {
      const int32_t slot = d.SlotOf(i);
      if (slot < 0 || slot >= W * per) continue;
      mine[slot / per].push_back({slot, static_cast<int32_t>(i)});
    }
    for (int32_t dst = 0; dst < W; ++dst) {
      std::stable_sort(mine[dst].begin(), mine[dst].end(),
                       [](auto a, auto b) { return a.first < b.first; });
      for (size_t j = 0; j < mine[dst].size(); ++j) {
        if (mode == EpMode::kLowLatency && static_cast<int32_t>(j) >= cfg.ll_capacity) {
          ref.overflow = true;
          break;
        }
        to[dst].push_back({mine[dst][j].first, s, mine[dst][j].second});
      }
    }
  }
  ref.received.resize(W);
  ref.offsets.resize(W);
  for (int32_t dst = 0; dst < W; ++dst) {
    std::stable_sort(to[dst].begin(), to[dst].end(), [](auto a, auto b) {
      return std::tie(std::get<0>(a), std::get<1>(a)) < std::tie(std::get<0>(b), std::get<1>(b));
    });
    if (mode == EpMode::kThroughput && static_cast<int32_t>(to[dst].size()) > cfg.tp_capacity) {
      ref.overflow = true;
      to[dst].resize(cfg.tp_capacity);
    }
    ref.offsets[dst].assign(per + 1, 0);
    for (const auto& [slot, src, pair] : to[dst]) {
      ref.received[dst].push_back({src, pair});
      ++ref.offsets[dst][slot - dst * per + 1];
      ref.delivered[src][pair] = true;
    }
    for (int32_t l = 0; l < per; ++l) ref.offsets[dst][l + 1] += ref.offsets[dst][l];
  }
  return ref;
}

// out0 plus each delivered choice's fmaf(w, hidden * Scale(slot)), in ascending logical id.
std::vector<float> ReferenceCombine(const EpExchangeConfig& cfg, const RankData& d,
                                    const std::vector<bool>& delivered) {
  const int32_t H = cfg.hidden, K = cfg.top_k;
  std::vector<float> out = d.out0;
  for (int32_t t = 0; t < d.tokens; ++t) {
    std::vector<int32_t> order(K);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return d.ids[t * K + a] < d.ids[t * K + b]; });
    for (int32_t k : order) {
      const int64_t i = static_cast<int64_t>(t) * K + k;
      if (!delivered[i]) continue;
      const float scale = Scale(d.SlotOf(i));
      for (int32_t h = 0; h < H; ++h) {
        const float expert = d.hidden[static_cast<int64_t>(t) * H + h] * scale;
        float& o = out[static_cast<int64_t>(t) * H + h];
        o = std::fma(d.weights[i], expert, o);
      }
    }
  }
  return out;
}

// Device buffers of the simulated ranks.
class Group {
 public:
  explicit Group(const EpExchangeConfig& cfg) : cfg_(cfg), layout_(kernels::EpLayoutOf(cfg)) {
    for (int32_t r = 0; r < cfg.world; ++r) {
      windows_.emplace_back(new DeviceArray<char>(layout_.window_bytes));
      scratch_.emplace_back(new DeviceArray<char>(layout_.scratch_bytes));
    }
    for (int32_t r = 0; r < cfg.world; ++r) {
      EpRankView v;
      v.rank = r;
      for (int32_t p = 0; p < cfg.world; ++p) v.window[p] = windows_[p]->get();
      v.scratch = scratch_[r]->get();
      views_.push_back(v);
    }
  }
  const EpRankView& view(int32_t r) const { return views_[r]; }
  const kernels::EpLayout& layout() const { return layout_; }

 private:
  EpExchangeConfig cfg_;
  kernels::EpLayout layout_;
  std::vector<std::unique_ptr<DeviceArray<char>>> windows_, scratch_;
  std::vector<EpRankView> views_;
};

// Device inputs of one rank.
struct RankDevice {
  explicit RankDevice(const RankData& d)
      : hidden(d.hidden),
        ids(d.ids),
        slots(d.slots),
        weights(d.weights),
        out(d.out0),
        out0(d.out0),
        expert_out(new DeviceArray<float>(1)) {}
  DeviceArray<float> hidden;
  DeviceArray<int32_t> ids, slots;
  DeviceArray<float> weights, out, out0;
  std::unique_ptr<DeviceArray<float>> expert_out;
};

class EpExchangeTest : public ::testing::TestWithParam<EpMode> {
 protected:
  void SetUp() override {
    DEEPINFER_SKIP_WITHOUT_GPU();
    seed_ = testing::FreshSeed();
    gen_.seed(seed_);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Runs dispatch for every rank, checks what each received against `ref`, computes the
  // stand-in expert outputs, then combine; checks the outputs bit for bit. Returns the error
  // words of the ranks.
  std::vector<int32_t> RunAndCheck(const EpExchangeConfig& cfg, EpMode mode,
                                   const std::vector<RankData>& ranks) {
    SCOPED_TRACE("seed " + std::to_string(seed_));
    const Reference ref = Exchange(cfg, mode, ranks);
    Group group(cfg);
    std::vector<std::unique_ptr<RankDevice>> dev;
    for (const RankData& d : ranks) dev.emplace_back(new RankDevice(d));
    const int32_t W = cfg.world, H = cfg.hidden, per = cfg.slots_per_rank;
    for (int32_t r = 0; r < W; ++r) {
      EXPECT_EQ(kernels::EpInitBuffers(cfg, group.view(r), stream_), cudaSuccess);
    }
    for (int32_t r = 0; r < W; ++r) {
      const int32_t* slots = ranks[r].slots.empty() ? nullptr : dev[r]->slots.get();
      EXPECT_EQ(kernels::EpDispatchSend(cfg, mode, group.view(r), ranks[r].tokens,
                                        dev[r]->hidden.get(), dev[r]->ids.get(), slots, stream_),
                cudaSuccess);
    }
    for (int32_t r = 0; r < W; ++r) {
      EXPECT_EQ(kernels::EpDispatchRows(cfg, mode, group.view(r), ranks[r].tokens,
                                        dev[r]->hidden.get(), stream_),
                cudaSuccess);
    }
    for (int32_t r = 0; r < W; ++r) {
      EXPECT_EQ(kernels::EpDispatchRecv(cfg, mode, group.view(r), stream_), cudaSuccess);
    }
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    for (int32_t r = 0; r < W; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      std::vector<int32_t> offsets(per + 1);
      cudaMemcpy(offsets.data(), kernels::EpSlotOffsets(cfg, group.view(r)),
                 offsets.size() * sizeof(int32_t), cudaMemcpyDeviceToHost);
      EXPECT_EQ(offsets, ref.offsets[r]);
      const int64_t n = ref.received[r].size();
      std::vector<float> rows(n * H);
      cudaMemcpy(rows.data(), kernels::EpReceivedRows(cfg, mode, group.view(r)),
                 rows.size() * sizeof(float), cudaMemcpyDeviceToHost);
      std::vector<float> expert(std::max<int64_t>(n, 1) * H);
      int64_t mismatched = 0;
      for (int64_t g = 0; g < n; ++g) {
        const Arrival a = ref.received[r][g];
        const float* want = ranks[a.src].hidden.data() + (a.pair / cfg.top_k) * int64_t{H};
        if (std::memcmp(rows.data() + g * H, want, H * sizeof(float)) != 0) ++mismatched;
        const float scale = Scale(ranks[a.src].SlotOf(a.pair));
        for (int32_t h = 0; h < H; ++h) expert[g * H + h] = rows[g * H + h] * scale;
      }
      EXPECT_EQ(mismatched, 0) << "of " << n << " received rows";
      dev[r]->expert_out.reset(new DeviceArray<float>(expert));
    }
    for (int32_t r = 0; r < W; ++r) {
      EXPECT_EQ(kernels::EpCombineSend(cfg, group.view(r), dev[r]->expert_out->get(), stream_),
                cudaSuccess);
    }
    for (int32_t r = 0; r < W; ++r) {
      EXPECT_EQ(kernels::EpCombineRecv(cfg, group.view(r), ranks[r].tokens, dev[r]->ids.get(),
                                       dev[r]->weights.get(), dev[r]->out.get(), stream_),
                cudaSuccess);
    }
    std::vector<int32_t> errors(W);
    for (int32_t r = 0; r < W; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r));
      std::vector<float> out;
      EXPECT_EQ(dev[r]->out.Download(&out), cudaSuccess);
      const std::vector<float> want = ReferenceCombine(cfg, ranks[r], ref.delivered[r]);
      EXPECT_EQ(out.size(), want.size());
      EXPECT_TRUE(std::memcmp(out.data(), want.data(), want.size() * sizeof(float)) == 0)
          << testing::AllClose(out, want, 0, 0).message();
      cudaMemcpy(&errors[r], kernels::EpErrorWord(cfg, group.view(r)), sizeof(int32_t),
                 cudaMemcpyDeviceToHost);
    }
    EXPECT_EQ(ref.overflow, std::any_of(errors.begin(), errors.end(), [](int32_t e) {
                return (e & kernels::kEpErrorOverflow) != 0;
              }));
    return errors;
  }

  EpExchangeConfig Config(int32_t world, int32_t per, int32_t top_k, int32_t max_tokens,
                          int32_t hidden) {
    EpExchangeConfig cfg;
    cfg.world = world;
    cfg.slots_per_rank = per;
    cfg.top_k = top_k;
    cfg.max_tokens = max_tokens;
    cfg.hidden = hidden;
    cfg.ll_capacity = max_tokens * top_k;
    cfg.tp_capacity = world * max_tokens * top_k;
    return cfg;
  }

  std::vector<RankData> Ranks(const EpExchangeConfig& cfg, Routing routing,
                              std::vector<int32_t> tokens) {
    std::vector<RankData> ranks;
    for (int32_t t : tokens) ranks.push_back(MakeRank(cfg, t, routing, gen_));
    return ranks;
  }

  uint32_t seed_ = 0;
  std::mt19937 gen_;
  cudaStream_t stream_ = nullptr;
};

TEST_P(EpExchangeTest, RandomRoutingFourRanks) {
  const EpExchangeConfig cfg = Config(4, 8, 4, 40, 128);
  for (int32_t e : RunAndCheck(cfg, GetParam(), Ranks(cfg, Routing::kRandom, {40, 17, 1, 33}))) {
    EXPECT_EQ(e, 0);
  }
}

TEST_P(EpExchangeTest, DeepSeekShapeTwoRanks) {
  // 256 experts over 2 ranks, top-8, hidden 7168, a full decode bucket on each rank.
  const EpExchangeConfig cfg = Config(2, 128, 8, 64, 7168);
  for (int32_t e : RunAndCheck(cfg, GetParam(), Ranks(cfg, Routing::kRandom, {64, 64}))) {
    EXPECT_EQ(e, 0);
  }
}

TEST_P(EpExchangeTest, EmptyExpertsAndEmptyRanks) {
  // Rank 3 hosts no routed expert and rank 1 sends nothing; odd slots receive nothing.
  const EpExchangeConfig cfg = Config(4, 6, 3, 24, 64);
  for (int32_t e : RunAndCheck(cfg, GetParam(), Ranks(cfg, Routing::kEmpty, {24, 0, 9, 24}))) {
    EXPECT_EQ(e, 0);
  }
}

TEST_P(EpExchangeTest, SkewedOntoOneRankEightRanks) {
  const EpExchangeConfig cfg = Config(8, 4, 6, 32, 96);
  for (int32_t e :
       RunAndCheck(cfg, GetParam(), Ranks(cfg, Routing::kSkewed, {32, 32, 5, 32, 0, 31, 32, 32}))) {
    EXPECT_EQ(e, 0);
  }
}

TEST_P(EpExchangeTest, ReplicaSlotsOrderByLogicalExpert) {
  const EpExchangeConfig cfg = Config(2, 16, 4, 20, 64);
  for (int32_t e : RunAndCheck(cfg, GetParam(), Ranks(cfg, Routing::kReplicas, {20, 13}))) {
    EXPECT_EQ(e, 0);
  }
}

TEST_P(EpExchangeTest, OverflowIsReportedAndDroppedChoicesLeftOut) {
  EpExchangeConfig cfg = Config(4, 4, 4, 32, 64);
  cfg.ll_capacity = 10;  // skewed routing sends far more to rank 0
  cfg.tp_capacity = 40;
  const std::vector<int32_t> errors =
      RunAndCheck(cfg, GetParam(), Ranks(cfg, Routing::kSkewed, {32, 32, 32, 32}));
  EXPECT_NE(errors[0] & kernels::kEpErrorOverflow, 0) << "the overfull receiver knows";
}

TEST_P(EpExchangeTest, BadIdsAreDroppedAndReported) {
  const EpExchangeConfig cfg = Config(2, 4, 2, 8, 32);
  std::vector<RankData> ranks = Ranks(cfg, Routing::kRandom, {8, 8});
  ranks[0].ids[3] = -1;
  ranks[1].ids[5] = cfg.world * cfg.slots_per_rank;
  const std::vector<int32_t> errors = RunAndCheck(cfg, GetParam(), ranks);
  EXPECT_NE(errors[0] & kernels::kEpErrorBadId, 0);
  EXPECT_NE(errors[1] & kernels::kEpErrorBadId, 0);
}

TEST_P(EpExchangeTest, TooManyTokensIsRejected) {
  const EpExchangeConfig cfg = Config(2, 4, 2, 8, 32);
  Group group(cfg);
  EXPECT_EQ(kernels::EpDispatchSend(cfg, GetParam(), group.view(0), 9, nullptr, nullptr, nullptr,
                                    stream_),
            cudaErrorInvalidValue);
  EpExchangeConfig bad = cfg;
  bad.hidden = 30;
  const char* why = nullptr;
  EXPECT_FALSE(kernels::EpConfigValid(bad, &why));
  EXPECT_NE(why, nullptr);
}

// Every rank's whole exchange (dispatch, stand-in experts on the device: a copy, combine) in one
// graph, replayed three times from the same inputs: each replay must equal the eager run bit for
// bit (the epochs advance on the device between replays).
TEST_P(EpExchangeTest, CapturedGraphReplaysBitIdenticalToEager) {
  const EpExchangeConfig cfg = Config(4, 8, 4, 16, 256);
  const EpMode mode = GetParam();
  const std::vector<RankData> ranks = Ranks(cfg, Routing::kRandom, {16, 16, 7, 16});
  const int32_t W = cfg.world, H = cfg.hidden;
  Group group(cfg);
  std::vector<std::unique_ptr<RankDevice>> dev;
  const int64_t max_rows = group.layout().max_received;
  for (const RankData& d : ranks) {
    dev.emplace_back(new RankDevice(d));
    dev.back()->expert_out.reset(new DeviceArray<float>(max_rows * H));
  }
  auto exchange = [&]() {
    for (int32_t r = 0; r < W; ++r) {
      cudaMemcpyAsync(dev[r]->out.get(), dev[r]->out0.get(), ranks[r].out0.size() * 4,
                      cudaMemcpyDeviceToDevice, stream_);
      const int32_t* slots = ranks[r].slots.empty() ? nullptr : dev[r]->slots.get();
      ASSERT_EQ(kernels::EpDispatchSend(cfg, mode, group.view(r), ranks[r].tokens,
                                        dev[r]->hidden.get(), dev[r]->ids.get(), slots, stream_),
                cudaSuccess);
    }
    for (int32_t r = 0; r < W; ++r) {
      ASSERT_EQ(kernels::EpDispatchRows(cfg, mode, group.view(r), ranks[r].tokens,
                                        dev[r]->hidden.get(), stream_),
                cudaSuccess);
    }
    for (int32_t r = 0; r < W; ++r) {
      ASSERT_EQ(kernels::EpDispatchRecv(cfg, mode, group.view(r), stream_), cudaSuccess);
      // Stand-in experts: identity over every row the buffer can hold.
      cudaMemcpyAsync(dev[r]->expert_out->get(), kernels::EpReceivedRows(cfg, mode, group.view(r)),
                      max_rows * H * sizeof(float), cudaMemcpyDeviceToDevice, stream_);
    }
    for (int32_t r = 0; r < W; ++r) {
      ASSERT_EQ(kernels::EpCombineSend(cfg, group.view(r), dev[r]->expert_out->get(), stream_),
                cudaSuccess);
    }
    for (int32_t r = 0; r < W; ++r) {
      ASSERT_EQ(kernels::EpCombineRecv(cfg, group.view(r), ranks[r].tokens, dev[r]->ids.get(),
                                       dev[r]->weights.get(), dev[r]->out.get(), stream_),
                cudaSuccess);
    }
  };
  for (int32_t r = 0; r < W; ++r) {
    ASSERT_EQ(kernels::EpInitBuffers(cfg, group.view(r), stream_), cudaSuccess);
  }
  exchange();
  std::vector<std::vector<float>> eager(W);
  for (int32_t r = 0; r < W; ++r) ASSERT_EQ(dev[r]->out.Download(&eager[r]), cudaSuccess);

  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  exchange();
  ASSERT_EQ(cudaStreamEndCapture(stream_, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int replay = 0; replay < 3; ++replay) {
    SCOPED_TRACE("replay " + std::to_string(replay));
    for (int32_t r = 0; r < W; ++r) dev[r]->out.Poison();
    ASSERT_EQ(cudaGraphLaunch(exec, stream_), cudaSuccess);
    for (int32_t r = 0; r < W; ++r) {
      std::vector<float> got;
      ASSERT_EQ(dev[r]->out.Download(&got), cudaSuccess);
      EXPECT_TRUE(std::memcmp(got.data(), eager[r].data(), got.size() * sizeof(float)) == 0)
          << "rank " << r;
      int32_t error = -1;
      cudaMemcpy(&error, kernels::EpErrorWord(cfg, group.view(r)), 4, cudaMemcpyDeviceToHost);
      EXPECT_EQ(error, 0) << "rank " << r;
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

INSTANTIATE_TEST_SUITE_P(Modes, EpExchangeTest,
                         ::testing::Values(EpMode::kLowLatency, EpMode::kThroughput),
                         [](const ::testing::TestParamInfo<EpMode>& info) {
                           return info.param == EpMode::kLowLatency ? std::string("LowLatency")
                                                                    : std::string("Throughput");
                         });

}  // namespace
}  // namespace deepinfer
