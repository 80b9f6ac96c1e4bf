// CudaBackend::v4_ops() (CudaV4Ops) against the CPU backend's V4 ops through the Backend
// interface (the kernels' own tests in kernels/v4 cover the shapes and paths): one site of
// V4-Flash's hyper-connections (hidden 4096, 4 streams), a CSA compressor's windows, the router
// and the clamped SwiGLU; the same ops recorded in a CUDA graph and replayed on new inputs (no
// host synchronisation or allocation inside them); the indexer and sink attention at V4-Flash's
// width over keys in ring slots and paged streams; the row copies; bad arguments reported
// through status(); the hyper-connection mix with its norm and GEMM (HcMixFromStreams) against
// the three ops it replaces; the bf16 query and output of a prefill against the fp32 path and
// the CPU; the query's and key's norm and rope in one op against the two (the clamped SwiGLU on
// bf16 rows is Backend::GateUpSiluMulBf16's, cuda_backend_gemm_test). Skips itself without a GPU.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cuda/cuda_backend_test_fixture.h"
#include "worker/backend/cuda/cuda_v4_ops.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::RandomFloats;

constexpr int64_t kRows = 3, kHc = 4, kHidden = 4096, kMix = (2 + kHc) * kHc;
constexpr int64_t kWindows = 2, kRatio = 4, kDim = 512;  // CSA: overlapping windows
constexpr int64_t kExperts = 256, kTopK = 6, kInter = 2048;

// The inputs of every op, host side.
struct Inputs {
  std::vector<float> mixes, base, scale, streams, block_out, head_mixes, head_base, head_scale;
  std::vector<float> rows, bias, logits, router_bias, gate_up;
  std::vector<int32_t> has_prev;

  explicit Inputs(uint32_t seed) {
    mixes = RandomFloats(kRows * kMix, seed, 2.0f);
    base = RandomFloats(kMix, seed + 1);
    scale = RandomFloats(3, seed + 2, 0.5f);
    streams = RandomFloats(kRows * kHc * kHidden, seed + 3);
    block_out = RandomFloats(kRows * kHidden, seed + 4);
    head_mixes = RandomFloats(kRows * kHc, seed + 5);
    head_base = RandomFloats(kHc, seed + 6);
    head_scale = RandomFloats(1, seed + 7, 0.5f);
    rows = RandomFloats(kWindows * 2 * kRatio * 4 * kDim, seed + 8);  // kv | gate, 2 * dim each
    bias = RandomFloats(kRatio * 2 * kDim, seed + 9, 0.5f);
    has_prev = {0, 1};
    logits = RandomFloats(kRows * kExperts, seed + 10, 2.0f);
    // kTopK experts per token far ahead of the rest (sqrt(softplus(30)) ~ 5.5 against at most
    // ~2.5 + the bias), so an ulp of expf cannot change the choice; kernels/v4:v4_router_test
    // covers close decisions.
    std::mt19937 gen(seed + 13);
    std::vector<int64_t> experts(kExperts);
    std::iota(experts.begin(), experts.end(), 0);
    for (int64_t t = 0; t < kRows; ++t) {
      std::shuffle(experts.begin(), experts.end(), gen);
      for (int64_t k = 0; k < kTopK; ++k) logits[t * kExperts + experts[k]] = 30.0f;
    }
    router_bias = RandomFloats(kExperts, seed + 11, 0.3f);
    gate_up = RandomFloats(kRows * kTopK * 2 * kInter, seed + 12, 8.0f);
  }
};

// The buffers of every op on one backend, and the ops issued over them.
class V4Step {
 public:
  explicit V4Step(Backend* b) : b_(b) {
    auto floats = [&](int64_t n) { return b_->Allocate(n * sizeof(float)); };
    mixes_ = floats(kRows * kMix), base_ = floats(kMix), scale_ = floats(3);
    streams_ = floats(kRows * kHc * kHidden), block_out_ = floats(kRows * kHidden);
    head_mixes_ = floats(kRows * kHc), head_base_ = floats(kHc), head_scale_ = floats(1);
    rows_ = floats(kWindows * 2 * kRatio * 4 * kDim), bias_ = floats(kRatio * 2 * kDim);
    has_prev_ = b_->Allocate(kWindows * sizeof(int32_t));
    logits_ = floats(kRows * kExperts), router_bias_ = floats(kExperts);
    gate_up_ = floats(kRows * kTopK * 2 * kInter);
    post_ = floats(kRows * kHc), comb_ = floats(kRows * kHc * kHc);
    collapsed_ = floats(kRows * kHidden), next_ = floats(kRows * kHc * kHidden);
    head_ = floats(kRows * kHidden), pooled_ = floats(kWindows * kDim);
    ids_ = b_->Allocate(kRows * kTopK * sizeof(int32_t)), weights_ = floats(kRows * kTopK);
    act_ = floats(kRows * kTopK * kInter);
  }

  void Upload(const Inputs& in) {
    auto put = [&](const std::vector<float>& v, DeviceBuffer* d) {
      b_->CopyToDevice(v.data(), v.size() * sizeof(float), d->data());
    };
    put(in.mixes, mixes_.get()), put(in.base, base_.get()), put(in.scale, scale_.get());
    put(in.streams, streams_.get()), put(in.block_out, block_out_.get());
    put(in.head_mixes, head_mixes_.get()), put(in.head_base, head_base_.get());
    put(in.head_scale, head_scale_.get()), put(in.rows, rows_.get()), put(in.bias, bias_.get());
    b_->CopyToDevice(in.has_prev.data(), in.has_prev.size() * sizeof(int32_t), has_prev_->data());
    put(in.logits, logits_.get()), put(in.router_bias, router_bias_.get());
    put(in.gate_up, gate_up_.get());
  }

  // Every op once: the attention site's mix, the expand, the head, a compressor, the router and
  // the experts' activation.
  void Issue() {
    V4Ops* ops = b_->v4_ops();
    HcMixArgs m;
    m.rows = kRows, m.hc = kHc, m.hidden = kHidden;
    m.mixes = mixes_->as<float>(), m.base = base_->as<float>(), m.scale = scale_->as<float>();
    m.sinkhorn_iters = 20, m.eps = 1e-6f;
    m.streams = streams_->as<float>();
    m.post = post_->as<float>(), m.comb = comb_->as<float>(), m.collapsed = collapsed_->as<float>();
    ops->HcMix(m);
    HcExpandArgs e;
    e.rows = kRows, e.hc = kHc, e.hidden = kHidden;
    e.block_out = block_out_->as<float>(), e.post = post_->as<float>(), e.comb = comb_->as<float>();
    e.streams_in = streams_->as<float>(), e.streams_out = next_->as<float>();
    ops->HcExpand(e);
    HcHeadArgs h;
    h.rows = kRows, h.hc = kHc, h.hidden = kHidden;
    h.mixes = head_mixes_->as<float>(), h.base = head_base_->as<float>();
    h.scale = head_scale_->as<float>(), h.eps = 1e-6f;
    h.streams = next_->as<float>(), h.out = head_->as<float>();
    ops->HcHead(h);
    CompressWindowsArgs c;
    c.windows = kWindows, c.ratio = kRatio, c.dim = kDim, c.overlap = true;
    c.kv = rows_->as<float>(), c.gate = rows_->as<float>() + 2 * kDim, c.row_stride = 4 * kDim;
    c.bias = bias_->as<float>(), c.has_prev = has_prev_->as<int32_t>();
    c.out = pooled_->as<float>();
    ops->CompressWindows(c);
    V4RouteArgs r;
    r.rows = kRows, r.experts = kExperts, r.top_k = kTopK;
    r.logits = logits_->as<float>(), r.bias = router_bias_->as<float>();
    r.sqrtsoftplus = true, r.scaling = 1.5f;
    r.topk_ids = ids_->as<int32_t>(), r.topk_weights = weights_->as<float>();
    ops->Route(r);
    ops->SwiGluClamped(kRows * kTopK, kInter, gate_up_->as<float>(), 10.0f, act_->as<float>());
  }

  // The outputs, host side: floats of every float output, then the expert ids.
  struct Outputs {
    std::vector<float> post, comb, collapsed, next, head, pooled, weights, act;
    std::vector<int32_t> ids;
  };
  Outputs Download() {
    auto get = [&](const DeviceBuffer& d) {
      std::vector<float> v(d.size_bytes() / sizeof(float));
      b_->CopyToHost(d.data(), d.size_bytes(), v.data());
      return v;
    };
    Outputs o;
    o.post = get(*post_), o.comb = get(*comb_), o.collapsed = get(*collapsed_);
    o.next = get(*next_), o.head = get(*head_), o.pooled = get(*pooled_);
    o.weights = get(*weights_), o.act = get(*act_);
    o.ids.resize(kRows * kTopK);
    b_->CopyToHost(ids_->data(), o.ids.size() * sizeof(int32_t), o.ids.data());
    return o;
  }

 private:
  Backend* b_;
  std::unique_ptr<DeviceBuffer> mixes_, base_, scale_, streams_, block_out_, head_mixes_,
      head_base_, head_scale_, rows_, bias_, has_prev_, logits_, router_bias_, gate_up_, post_,
      comb_, collapsed_, next_, head_, pooled_, ids_, weights_, act_;
};

class CudaV4OpsTest : public testing::CudaBackendTest {};

TEST_F(CudaV4OpsTest, MatchCpuThroughTheBackend) {
  ASSERT_NE(gpu_->v4_ops(), nullptr);
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const Inputs in(seed);
  V4Step cpu(&cpu_), gpu(gpu_.get());
  cpu.Upload(in);
  gpu.Upload(in);
  cpu.Issue();
  gpu.Issue();
  const V4Step::Outputs want = cpu.Download(), got = gpu.Download();
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  EXPECT_TRUE(AllClose(got.post, want.post, 1e-6, 1e-6)) << "post";
  EXPECT_TRUE(AllClose(got.comb, want.comb, 1e-6, 1e-5)) << "comb";
  EXPECT_TRUE(AllClose(got.collapsed, want.collapsed, 1e-5, 1e-5)) << "collapsed";
  EXPECT_TRUE(AllClose(got.next, want.next, 1e-5, 1e-5)) << "expanded streams";
  EXPECT_TRUE(AllClose(got.head, want.head, 1e-5, 1e-5)) << "head";
  EXPECT_TRUE(AllClose(got.pooled, want.pooled, 1e-6, 1e-5)) << "compressed entries";
  EXPECT_EQ(got.ids, want.ids) << "expert ids";
  EXPECT_TRUE(AllClose(got.weights, want.weights, 1e-6, 1e-5)) << "expert weights";
  EXPECT_TRUE(AllClose(got.act, want.act, 1e-6, 1e-6)) << "clamped SwiGLU";
}

TEST_F(CudaV4OpsTest, RecordedInACudaGraphAndReplayedOnNewInputs) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  V4Step step(gpu_.get());
  step.Upload(Inputs(seed));
  auto graph = gpu_->Capture([&] {
    step.Issue();
    return absl::OkStatus();
  });
  ASSERT_TRUE(graph.ok()) << graph.status();
  // New inputs in the same buffers: the replay computes what the ops compute eagerly on them.
  const Inputs next(seed + 100);
  step.Upload(next);
  ASSERT_TRUE((*graph)->Replay().ok());
  const V4Step::Outputs replayed = step.Download();
  step.Issue();
  const V4Step::Outputs eager = step.Download();
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  EXPECT_TRUE(AllClose(replayed.post, eager.post, 0, 0));
  EXPECT_TRUE(AllClose(replayed.comb, eager.comb, 0, 0));
  EXPECT_TRUE(AllClose(replayed.collapsed, eager.collapsed, 0, 0));
  EXPECT_TRUE(AllClose(replayed.next, eager.next, 0, 0));
  EXPECT_TRUE(AllClose(replayed.head, eager.head, 0, 0));
  EXPECT_TRUE(AllClose(replayed.pooled, eager.pooled, 0, 0));
  EXPECT_EQ(replayed.ids, eager.ids);
  EXPECT_TRUE(AllClose(replayed.weights, eager.weights, 0, 0));
  EXPECT_TRUE(AllClose(replayed.act, eager.act, 0, 0));
}

// The lightning indexer's selection, then attention over each token's window and its selection
// (CSA) or every entry (HCA), through both backends' V4 ops at V4-Flash's attention width (64
// heads x 512), everything read where the cache keeps it: three sequences decoding one token
// each, their window keys in ring slots (the token's own among the step's keys), entries and
// indexer keys in paged streams with scattered block tables. Both attentions read the CPU's
// selection, so a near-tie the two indexers break differently cannot change what the attention
// comparison sees (kernels/v4's tests cover ties).
TEST_F(CudaV4OpsTest, IndexerAndSinkAttentionMatchCpu) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int64_t T = 3, NH = 64, D = 512, W = 128, IH = 8, ID = 64, TOPK = 16, CAND = 40;
  constexpr int64_t kEntries = 160, kEntryBlock = 4 * D, kKeyBlock = 4 * ID;
  constexpr int64_t kEntryBlocks = kEntries * D / kEntryBlock, kKeyBlocks = CAND * ID / kKeyBlock;
  const std::vector<float> q = RandomFloats(T * NH * D, seed), kv = RandomFloats(T * D, seed + 1);
  const std::vector<float> ring = RandomFloats(T * W * D, seed + 6);
  const std::vector<float> entries = RandomFloats(T * kEntryBlocks * kEntryBlock, seed + 7);
  const std::vector<float> sinks = RandomFloats(NH, seed + 2);
  const std::vector<float> iq = RandomFloats(T * IH * ID, seed + 3);
  const std::vector<float> ikeys = RandomFloats(T * kKeyBlocks * kKeyBlock, seed + 4);
  std::vector<float> iw = RandomFloats(T * IH, seed + 5);
  for (float& w : iw) w = std::abs(w) + 0.1f;  // scores >= 0: the top 16 of 30+ are positive
  std::vector<int32_t> positions(T), window_len(T), step_start(T), slot(T), token_seq(T),
      extra_len(T), candidates(T, CAND), visible(T), entry_tables, key_tables;
  std::mt19937 gen(seed + 8);
  for (int64_t t = 0; t < T; ++t) {
    positions[t] = static_cast<int32_t>(500 + t);
    window_len[t] = static_cast<int32_t>(64 + t);
    step_start[t] = positions[t];
    slot[t] = static_cast<int32_t>(T - 1 - t);
    token_seq[t] = static_cast<int32_t>(t);
    extra_len[t] = static_cast<int32_t>(100 + 20 * t);
    visible[t] = static_cast<int32_t>(30 + 5 * t);
  }
  for (auto [tables, n] : {std::pair{&entry_tables, kEntryBlocks}, {&key_tables, kKeyBlocks}}) {
    tables->resize(T * n);
    std::iota(tables->begin(), tables->end(), 0);
    std::shuffle(tables->begin(), tables->end(), gen);
  }
  struct Run {
    std::vector<int32_t> selected;
    std::vector<float> csa, hca;
  };
  std::vector<int32_t> cpu_selected;
  auto run = [&](Backend* b) {
    auto floats = [&](const std::vector<float>& v) {
      auto buf = b->Allocate(v.size() * sizeof(float));
      b->CopyToDevice(v.data(), v.size() * sizeof(float), buf->data());
      return buf;
    };
    auto ints = [&](const std::vector<int32_t>& v) {
      auto buf = b->Allocate(v.size() * sizeof(int32_t));
      b->CopyToDevice(v.data(), v.size() * sizeof(int32_t), buf->data());
      return buf;
    };
    auto q_d = floats(q), kv_d = floats(kv), ring_d = floats(ring), entries_d = floats(entries);
    auto sinks_d = floats(sinks), iq_d = floats(iq), ikeys_d = floats(ikeys), iw_d = floats(iw);
    auto pos = ints(positions), wl = ints(window_len), start = ints(step_start);
    auto slots = ints(slot), seqs = ints(token_seq), el = ints(extra_len);
    auto et = ints(entry_tables), kt = ints(key_tables);
    auto cand = ints(candidates), vis = ints(visible);
    auto selected = b->Allocate(T * TOPK * sizeof(int32_t));
    IndexerTopKArgs ia;
    ia.tokens = T;
    ia.heads = IH;
    ia.dim = ID;
    ia.topk = TOPK;
    ia.q = iq_d->as<float>();
    ia.weights = iw_d->as<float>();
    ia.weight_scale = 0.35f;
    ia.key_scale = 0.125f;
    ia.keys = {ikeys_d->as<float>(), kKeyBlock, kt->as<int32_t>(), kKeyBlocks, seqs->as<int32_t>()};
    ia.candidates = cand->as<int32_t>();
    ia.visible = vis->as<int32_t>();
    ia.selected = selected->as<int32_t>();
    ia.max_candidates = CAND;
    b->v4_ops()->IndexerTopK(ia);
    Run r;
    r.selected.resize(T * TOPK);
    b->CopyToHost(selected->data(), r.selected.size() * sizeof(int32_t), r.selected.data());
    if (cpu_selected.empty()) cpu_selected = r.selected;
    auto chosen = ints(cpu_selected);
    auto out = b->Allocate(T * NH * D * sizeof(float));
    SinkAttentionArgs sa;
    sa.tokens = T;
    sa.heads = NH;
    sa.dim = D;
    sa.q = q_d->as<float>();
    sa.kv = kv_d->as<float>();
    sa.positions = pos->as<int32_t>();
    sa.window_len = wl->as<int32_t>();
    sa.step_start = start->as<int32_t>();
    sa.ring = ring_d->as<float>();
    sa.ring_rows = W;
    sa.ring_stride = W * D;
    sa.ring_slot = slots->as<int32_t>();
    sa.entries = {entries_d->as<float>(), kEntryBlock, et->as<int32_t>(), kEntryBlocks,
                  seqs->as<int32_t>()};
    sa.sinks = sinks_d->as<float>();
    sa.scale = 0.0442f;
    sa.out = out->as<float>();
    sa.selected = chosen->as<int32_t>();
    sa.selected_stride = TOPK;
    b->v4_ops()->SinkAttention(sa);
    r.csa.resize(T * NH * D);
    b->CopyToHost(out->data(), r.csa.size() * sizeof(float), r.csa.data());
    sa.selected = nullptr;
    sa.selected_stride = 0;
    sa.extra_len = el->as<int32_t>();
    b->v4_ops()->SinkAttention(sa);
    r.hca.resize(T * NH * D);
    b->CopyToHost(out->data(), r.hca.size() * sizeof(float), r.hca.data());
    return r;
  };
  const Run want = run(&cpu_), got = run(gpu_.get());
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  EXPECT_EQ(got.selected, want.selected) << "the indexer's selection";
  // The fixture's backend holds bf16 weights, so attention takes the bf16 tensor-core kernel:
  // each operand rounded to bf16 (2^-8 relative), errors relative to the outputs' magnitude.
  auto magnitude = [](const std::vector<float>& v) {
    double m = 0;
    for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
    return m;
  };
  EXPECT_TRUE(AllClose(got.csa, want.csa, 2e-2 * magnitude(want.csa), 2e-2)) << "CSA attention";
  EXPECT_TRUE(AllClose(got.hca, want.hca, 2e-2 * magnitude(want.hca), 2e-2)) << "HCA attention";
}

// The prefill path of a bf16 model (V4Ops::TakesBf16Attention: from kBf16AttentionMinTokens
// queries): NormRope's bf16 query is its fp32 query rounded, bit for bit, and the CPU's within
// the rounding (from bf16 rows, in place: bit for bit its query from the widened rows);
// SinkAttention over the bf16 query with its rotated bf16 output (the keys and entries read
// from the backend's bf16 copies; kTensorCoreBf16Prefill, as the fp32 path at this size) gives
// bit for bit what the fp32 path gives (the fp32 query, the fp32 output, Backend::ApplyRope at
// the negated positions,
// the rounding of a bf16 Gemm operand), and the CPU's (over the same bf16 query and keys rounded
// to bf16) within the bf16 kernel's tolerance. 512 tokens of one prefill from position 0 (every
// window among the step's keys), V4-Flash's query (64 heads x 512, rope 64), and HCA-like
// entries: token t sees the first (t + 1) / 4 of 128 entries in a paged stream (4 entries a
// block, the blocks shuffled over a pool whose other blocks are NaN, the table padded with
// block 0 as the step plan pads it; entry_table_rows given).
TEST_F(CudaV4OpsTest, Bf16QueryAndOutputAtPrefillMatchTheFp32PathAndCpu) {
  const int64_t T = CudaV4Ops::kBf16AttentionMinTokens, NH = 64, D = 512, RD = 64, W = 128;
  V4Ops* ops = gpu_->v4_ops();
  ASSERT_TRUE(ops->TakesBf16Attention(T, NH, D));
  EXPECT_FALSE(ops->TakesBf16Attention(T - 1, NH, D)) << "decode sizes keep the fp32 path";
  EXPECT_FALSE(ops->TakesBf16Attention(T, NH, 4096)) << "a dim the kernels do not take";
  EXPECT_FALSE(cpu_.v4_ops()->TakesBf16Attention(T, NH, D));
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<float> x = RandomFloats(T * NH * D, seed, 3.0f);
  const std::vector<float> kv = RandomFloats(T * D, seed + 1);
  const std::vector<float> sinks = RandomFloats(NH, seed + 2);
  const std::vector<float> ones(D, 1.0f);
  std::vector<float> inv_freq(RD / 2);
  for (int64_t j = 0; j < RD / 2; ++j) {
    inv_freq[j] = static_cast<float>(std::pow(160000.0, -2.0 * j / RD));
  }
  std::vector<int32_t> positions(T), neg(T), window_len(T), step_start(T, 0), extra_len(T),
      token_seq(T, 0);
  for (int64_t t = 0; t < T; ++t) {
    positions[t] = static_cast<int32_t>(t);
    neg[t] = -positions[t];
    window_len[t] = static_cast<int32_t>(std::min<int64_t>(W, t + 1));
    extra_len[t] = static_cast<int32_t>((t + 1) / 4);
  }
  // The entries: 32 blocks of 4 in a pool of 40 (the rest NaN), the table 36 wide.
  constexpr int64_t kEntries = 128, kBlockFloats = 4 * D, kPool = 40, kTableStride = 36;
  std::vector<int32_t> table(kTableStride, 0), pool(kPool);
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), std::mt19937(seed + 3));
  std::copy(pool.begin(), pool.begin() + kEntries / 4, table.begin());
  std::vector<float> stream(kPool * kBlockFloats, std::numeric_limits<float>::quiet_NaN());
  {
    const std::vector<float> values = RandomFloats(kEntries * D, seed + 4);
    for (int64_t e = 0; e < kEntries * D; ++e) {
      stream[int64_t{table[e / kBlockFloats]} * kBlockFloats + e % kBlockFloats] = values[e];
    }
  }
  const float eps = 1e-6f, factor = 1.2079f;
  auto ints = [&](const std::vector<int32_t>& v) {
    auto buf = gpu_->Allocate(v.size() * sizeof(int32_t));
    gpu_->CopyToDevice(v.data(), v.size() * sizeof(int32_t), buf->data());
    return buf;
  };
  auto dx = Upload(x), dkv = Upload(kv), dsinks = Upload(sinks), dones = Upload(ones);
  auto dinv = Upload(inv_freq);
  auto dpos = ints(positions), dneg = ints(neg), dwl = ints(window_len), dstart = ints(step_start);
  auto dextra = ints(extra_len), dseq = ints(token_seq), dtable = ints(table);
  auto dstream = Upload(stream);
  // The query: fp32 (in place, as the fp32 path runs it) and bf16.
  NormRopeArgs na;
  na.tokens = T, na.heads = NH, na.dim = D, na.rope_dim = RD;
  na.weight = dones->as<float>(), na.eps = eps;
  na.positions = dpos->as<int32_t>(), na.inv_freq = dinv->as<float>(), na.attention_factor = factor;
  auto q32 = Upload(x);
  NormRopeArgs n32 = na;
  n32.x = q32->as<float>(), n32.out = q32->as<float>();
  ASSERT_TRUE(ops->NormRope(n32));
  auto q16 = gpu_->Allocate(T * NH * D * sizeof(uint16_t));
  NormRopeArgs n16 = na;
  n16.x = dx->as<float>(), n16.out_bf16 = q16->as<uint16_t>();
  ASSERT_TRUE(ops->NormRope(n16));
  const std::vector<float> q_fp32 = Download(*q32);
  std::vector<uint16_t> q_bits(T * NH * D);
  gpu_->CopyToHost(q16->data(), q_bits.size() * sizeof(uint16_t), q_bits.data());
  std::vector<float> q_cpu(T * NH * D);
  cpu_.RmsNorm(T * NH, D, x.data(), D, ones.data(), eps, q_cpu.data(), D);
  cpu_.ApplyRope(T, NH, q_cpu.data() + D - RD, NH * D, D, RD, positions.data(), inv_freq.data(),
                 factor, /*interleaved=*/true);
  int64_t differ = 0;
  std::vector<float> q_rounded(q_bits.size());
  for (size_t i = 0; i < q_bits.size(); ++i) {
    differ += q_bits[i] != FloatToBf16Bits(q_fp32[i]);
    q_rounded[i] = Bf16BitsToFloat(q_bits[i]);
  }
  EXPECT_EQ(differ, 0) << "the bf16 query is not the fp32 query rounded";
  EXPECT_TRUE(AllClose(q_rounded, q_cpu, 1e-6, 1.0 / 256)) << "the bf16 query against the CPU";
  {
    // From bf16 rows (a bf16 q_b's output), in place: bit for bit NormRope from the widened rows
    // to bf16, and the CPU's on the widened rows within the rounding.
    std::vector<uint16_t> x16(x.size());
    std::vector<float> widened(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      x16[i] = FloatToBf16Bits(x[i]);
      widened[i] = Bf16BitsToFloat(x16[i]);
    }
    auto dx16 = gpu_->Allocate(x16.size() * sizeof(uint16_t));
    gpu_->CopyToDevice(x16.data(), x16.size() * sizeof(uint16_t), dx16->data());
    auto dwidened = Upload(widened);
    auto want16 = gpu_->Allocate(x16.size() * sizeof(uint16_t));
    NormRopeArgs from32 = na;
    from32.x = dwidened->as<float>(), from32.out_bf16 = want16->as<uint16_t>();
    ASSERT_TRUE(ops->NormRope(from32));
    NormRopeArgs from16 = na;
    from16.x_bf16 = dx16->as<uint16_t>(), from16.out_bf16 = dx16->as<uint16_t>();
    ASSERT_TRUE(ops->NormRope(from16));
    NormRopeArgs no_bf16_out = na;
    no_bf16_out.x_bf16 = dx16->as<uint16_t>(), no_bf16_out.out = q32->as<float>();
    EXPECT_FALSE(ops->NormRope(no_bf16_out)) << "bf16 rows in take a bf16 output only";
    std::vector<uint16_t> got_bits(x16.size()), want_bits(x16.size());
    gpu_->CopyToHost(dx16->data(), got_bits.size() * sizeof(uint16_t), got_bits.data());
    gpu_->CopyToHost(want16->data(), want_bits.size() * sizeof(uint16_t), want_bits.data());
    EXPECT_EQ(got_bits, want_bits) << "bf16 rows in: not NormRope of the widened rows";
    std::vector<float> cpu_w(widened.size()), got_w(got_bits.size());
    cpu_.RmsNorm(T * NH, D, widened.data(), D, ones.data(), eps, cpu_w.data(), D);
    cpu_.ApplyRope(T, NH, cpu_w.data() + D - RD, NH * D, D, RD, positions.data(), inv_freq.data(),
                   factor, /*interleaved=*/true);
    for (size_t i = 0; i < got_bits.size(); ++i) got_w[i] = Bf16BitsToFloat(got_bits[i]);
    EXPECT_TRUE(AllClose(got_w, cpu_w, 1e-6, 1.0 / 256)) << "bf16 rows in: against the CPU";
  }

  SinkAttentionArgs sa;
  sa.tokens = T, sa.heads = NH, sa.dim = D;
  sa.kv = dkv->as<float>();
  sa.positions = dpos->as<int32_t>(), sa.window_len = dwl->as<int32_t>();
  sa.step_start = dstart->as<int32_t>();
  sa.entries = {dstream->as<float>(), kBlockFloats, dtable->as<int32_t>(), kTableStride,
                dseq->as<int32_t>()};
  sa.entry_table_rows = 1;
  sa.extra_len = dextra->as<int32_t>();
  sa.sinks = dsinks->as<float>();
  sa.scale = 0.0442f;
  // The fp32 path.
  auto out32 = Poisoned(T * NH * D);
  SinkAttentionArgs s32 = sa;
  s32.q = q32->as<float>(), s32.out = out32->as<float>();
  ops->SinkAttention(s32);
  gpu_->ApplyRope(T, NH, out32->as<float>() + D - RD, NH * D, D, RD, dneg->as<int32_t>(),
                  dinv->as<float>(), factor, /*interleaved=*/true);
  // The bf16 path.
  auto out16 = gpu_->Allocate(T * NH * D * sizeof(uint16_t));
  SinkAttentionArgs s16 = sa;
  s16.q_bf16 = q16->as<uint16_t>(), s16.out_bf16 = out16->as<uint16_t>();
  s16.out_rope_dim = RD, s16.out_rope_positions = dneg->as<int32_t>();
  s16.out_rope_inv_freq = dinv->as<float>(), s16.out_rope_factor = factor;
  ops->SinkAttention(s16);
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  const std::vector<float> o32 = Download(*out32);
  std::vector<uint16_t> o_bits(T * NH * D);
  gpu_->CopyToHost(out16->data(), o_bits.size() * sizeof(uint16_t), o_bits.data());
  // The CPU over the bf16 query and bf16-rounded keys, rotated back.
  std::vector<float> kv16(kv), stream16(stream);
  for (float& v : kv16) v = RoundToBf16(v);
  for (float& v : stream16) v = RoundToBf16(v);
  std::vector<float> o_cpu(T * NH * D);
  SinkAttentionArgs sc = sa;
  sc.q = q_rounded.data(), sc.kv = kv16.data(), sc.positions = positions.data();
  sc.window_len = window_len.data(), sc.step_start = step_start.data();
  sc.entries = {stream16.data(), kBlockFloats, table.data(), kTableStride, token_seq.data()};
  sc.extra_len = extra_len.data();
  sc.sinks = sinks.data(), sc.out = o_cpu.data();
  cpu_.v4_ops()->SinkAttention(sc);
  cpu_.ApplyRope(T, NH, o_cpu.data() + D - RD, NH * D, D, RD, neg.data(), inv_freq.data(), factor,
                 /*interleaved=*/true);
  differ = 0;
  std::vector<float> o_rounded(o_bits.size());
  double max_out = 0.0;
  for (size_t i = 0; i < o_bits.size(); ++i) {
    differ += o_bits[i] != FloatToBf16Bits(o32[i]);
    o_rounded[i] = Bf16BitsToFloat(o_bits[i]);
    max_out = std::max(max_out, static_cast<double>(std::abs(o_cpu[i])));
  }
  EXPECT_EQ(differ, 0) << "the bf16 output is not the fp32 path's rotated output rounded";
  // P's rounding to bf16 (2^-8 relative) and the output's (2^-9), against the outputs' scale.
  EXPECT_TRUE(AllClose(o_rounded, o_cpu, 2e-2 * max_out, 2e-2)) << "against the CPU";
}

// CopyRows (the V4 model's cache moves) through both backends: a gather and a scatter with
// skipped rows; a copy, so the bits must be equal.
TEST_F(CudaV4OpsTest, CopyRowsMatchesCpu) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int64_t kRowsMoved = 50, kWidth = 2048, kSlots = 120;
  const std::vector<float> src = RandomFloats(kSlots * kWidth, seed);
  std::vector<int64_t> from(kRowsMoved), to(kRowsMoved);
  for (int64_t r = 0; r < kRowsMoved; ++r) {
    from[r] = ((r * 37) % kSlots) * kWidth;
    to[r] = r % 7 == 3 ? -1 : ((r * 53 + 11) % kSlots) * kWidth;
  }
  auto run = [&](Backend* b) {
    auto s = b->Allocate(src.size() * sizeof(float));
    b->CopyToDevice(src.data(), src.size() * sizeof(float), s->data());
    auto d = b->Allocate(src.size() * sizeof(float));  // zeroed
    auto f = b->Allocate(kRowsMoved * sizeof(int64_t)),
         t = b->Allocate(kRowsMoved * sizeof(int64_t));
    b->CopyToDevice(from.data(), kRowsMoved * sizeof(int64_t), f->data());
    b->CopyToDevice(to.data(), kRowsMoved * sizeof(int64_t), t->data());
    b->v4_ops()->CopyRows({kRowsMoved, kWidth, s->as<float>(), static_cast<int64_t*>(f->data()),
                           d->as<float>(), static_cast<int64_t*>(t->data())});
    std::vector<float> out(src.size());
    b->CopyToHost(d->data(), out.size() * sizeof(float), out.data());
    return out;
  };
  const std::vector<float> want = run(&cpu_), got = run(gpu_.get());
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  EXPECT_EQ(got, want);
}

// HcMixFromStreams: declined by the CPU backend (the model then runs its RmsNorm + Gemm +
// HcMix, the reference here), taken by the GPU's at V4-Flash's site shape and within rounding of
// the reference; recorded in a CUDA graph (its partials from scratch while recording) and
// replayed on new streams, bit for bit the eager op.
TEST_F(CudaV4OpsTest, MixFromStreamsMatchesNormGemmMixAndReplays) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int64_t S = kHc * kHidden;
  const Inputs in(seed);
  const auto fn = RandomFloats(kMix * S, seed + 20, 0.02f);
  const std::vector<float> ones(S, 1.0f);
  HcMixArgs a;
  a.rows = kRows, a.hc = kHc, a.hidden = kHidden;
  a.sinkhorn_iters = 20, a.eps = 1e-6f, a.norm_eps = 1e-6f;
  a.base = in.base.data(), a.scale = in.scale.data(), a.streams = in.streams.data();
  a.fn = fn.data();
  std::vector<float> normed(kRows * S), mixes(kRows * kMix), post(kRows * kHc),
      comb(kRows * kHc * kHc), collapsed(kRows * kHidden);
  a.post = post.data(), a.comb = comb.data(), a.collapsed = collapsed.data();
  EXPECT_FALSE(cpu_.v4_ops()->HcMixFromStreams(a));
  cpu_.RmsNorm(kRows, S, in.streams.data(), S, ones.data(), a.norm_eps, normed.data(), S);
  cpu_.Gemm(kRows, kMix, S, normed.data(), S, WeightView(fn.data()), S, mixes.data(), kMix, false);
  a.mixes = mixes.data();
  cpu_.v4_ops()->HcMix(a);

  auto dstreams = Upload(in.streams), dfn = Upload(fn), dbase = Upload(in.base),
       dscale = Upload(in.scale);
  auto dpost = Poisoned(post.size()), dcomb = Poisoned(comb.size()),
       dcol = Poisoned(collapsed.size());
  HcMixArgs d = a;
  d.mixes = nullptr;
  d.base = dbase->as<float>(), d.scale = dscale->as<float>(), d.streams = dstreams->as<float>();
  d.fn = dfn->as<float>();
  d.post = dpost->as<float>(), d.comb = dcomb->as<float>(), d.collapsed = dcol->as<float>();
  ASSERT_TRUE(gpu_->v4_ops()->HcMixFromStreams(d));
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  EXPECT_TRUE(AllClose(Download(*dpost), post, 1e-5, 1e-5)) << "post";
  EXPECT_TRUE(AllClose(Download(*dcomb), comb, 1e-5, 1e-4)) << "comb";
  EXPECT_TRUE(AllClose(Download(*dcol), collapsed, 1e-5, 1e-4)) << "collapsed";

  auto graph = Record([&] { return gpu_->v4_ops()->HcMixFromStreams(d); });
  ASSERT_NE(graph, nullptr);
  const auto next = RandomFloats(kRows * S, seed + 21);
  gpu_->CopyToDevice(next.data(), next.size() * sizeof(float), dstreams->data());
  ASSERT_TRUE(graph->Replay().ok());
  const std::vector<float> replayed[3] = {Download(*dpost), Download(*dcomb), Download(*dcol)};
  ASSERT_TRUE(gpu_->v4_ops()->HcMixFromStreams(d));
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  EXPECT_TRUE(AllClose(replayed[0], Download(*dpost), 0, 0));
  EXPECT_TRUE(AllClose(replayed[1], Download(*dcomb), 0, 0));
  EXPECT_TRUE(AllClose(replayed[2], Download(*dcol), 0, 0));
}

// HcMixFromStreams with the next op's norm (no collapsed; fp32 as the model's ffn site takes it,
// bf16 as its attention site does) against the reference ops plus the CPU's RmsNorm and
// AddRmsNorm (bf16) of its collapsed rows; replayed from a CUDA graph on new streams, bit for bit
// the eager op.
TEST_F(CudaV4OpsTest, MixFromStreamsWithNormMatchesAndReplays) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int64_t S = kHc * kHidden;
  const Inputs in(seed);
  const auto fn = RandomFloats(kMix * S, seed + 20, 0.02f);
  const auto weight = RandomFloats(kHidden, seed + 22);
  const std::vector<float> ones(S, 1.0f);
  HcMixArgs a;
  a.rows = kRows, a.hc = kHc, a.hidden = kHidden;
  a.sinkhorn_iters = 20, a.eps = 1e-6f, a.norm_eps = 1e-6f;
  a.base = in.base.data(), a.scale = in.scale.data(), a.streams = in.streams.data();
  std::vector<float> normed(kRows * S), mixes(kRows * kMix), post(kRows * kHc),
      comb(kRows * kHc * kHc), collapsed(kRows * kHidden), out(kRows * kHidden);
  a.post = post.data(), a.comb = comb.data(), a.collapsed = collapsed.data();
  cpu_.RmsNorm(kRows, S, in.streams.data(), S, ones.data(), a.norm_eps, normed.data(), S);
  cpu_.Gemm(kRows, kMix, S, normed.data(), S, WeightView(fn.data()), S, mixes.data(), kMix, false);
  a.mixes = mixes.data();
  cpu_.v4_ops()->HcMix(a);
  cpu_.RmsNorm(kRows, kHidden, collapsed.data(), kHidden, weight.data(), 1e-6f, out.data(),
               kHidden);
  std::vector<uint16_t> out16(kRows * kHidden);
  cpu_.AddRmsNorm(kRows, kHidden, collapsed.data(), nullptr, weight.data(), 1e-6f, nullptr,
                  out16.data());
  auto as_floats = [](const std::vector<uint16_t>& bits) {
    std::vector<float> f(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) {
      const uint32_t u = static_cast<uint32_t>(bits[i]) << 16;
      std::memcpy(&f[i], &u, sizeof(float));
    }
    return f;
  };

  auto dstreams = Upload(in.streams), dfn = Upload(fn), dbase = Upload(in.base),
       dscale = Upload(in.scale), dweight = Upload(weight);
  auto dpost = Poisoned(post.size()), dcomb = Poisoned(comb.size()), dout = Poisoned(out.size()),
       dout16 = Poisoned(out16.size() / 2);
  auto download16 = [&] {
    std::vector<uint16_t> v(out16.size());
    gpu_->CopyToHost(dout16->data(), v.size() * sizeof(uint16_t), v.data());
    return v;
  };
  HcMixArgs d = a;
  d.mixes = nullptr, d.collapsed = nullptr;
  d.base = dbase->as<float>(), d.scale = dscale->as<float>(), d.streams = dstreams->as<float>();
  d.fn = dfn->as<float>();
  d.post = dpost->as<float>(), d.comb = dcomb->as<float>();
  d.out_norm_weight = dweight->as<float>(), d.out_norm_eps = 1e-6f, d.normed = dout->as<float>();
  d.normed_bf16 = dout16->as<uint16_t>();
  ASSERT_TRUE(gpu_->v4_ops()->HcMixFromStreams(d));
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  EXPECT_TRUE(AllClose(Download(*dpost), post, 1e-5, 1e-5)) << "post";
  EXPECT_TRUE(AllClose(Download(*dcomb), comb, 1e-5, 1e-4)) << "comb";
  EXPECT_TRUE(AllClose(Download(*dout), out, 1e-4, 1e-4)) << "normed";
  EXPECT_TRUE(AllClose(as_floats(download16()), as_floats(out16), 1e-3, 1e-2)) << "normed_bf16";

  auto graph = Record([&] { return gpu_->v4_ops()->HcMixFromStreams(d); });
  ASSERT_NE(graph, nullptr);
  const auto next = RandomFloats(kRows * S, seed + 21);
  gpu_->CopyToDevice(next.data(), next.size() * sizeof(float), dstreams->data());
  ASSERT_TRUE(graph->Replay().ok());
  const std::vector<float> replayed[3] = {Download(*dpost), Download(*dcomb), Download(*dout)};
  const std::vector<uint16_t> replayed16 = download16();
  ASSERT_TRUE(gpu_->v4_ops()->HcMixFromStreams(d));
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  EXPECT_TRUE(AllClose(replayed[0], Download(*dpost), 0, 0));
  EXPECT_TRUE(AllClose(replayed[1], Download(*dcomb), 0, 0));
  EXPECT_TRUE(AllClose(replayed[2], Download(*dout), 0, 0));
  EXPECT_TRUE(replayed16 == download16());
}

// NormRopePair at a decode step's query and key (1 and 2 tokens; 64 heads x 512 normed in place,
// then the key row of 512 into its own buffer; rope 64): declined by the CPU backend, taken by
// the GPU's and bit for bit its two NormRope ops, within rounding of the CPU's RmsNorm +
// ApplyRope; declined with a bf16 output or unlike rope arguments.
TEST_F(CudaV4OpsTest, NormRopePairIsTheTwoNormRopes) {
  constexpr int64_t NH = 64, D = 512, RD = 64;
  V4Ops* ops = gpu_->v4_ops();
  for (const int64_t T : {1, 2}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "tokens " << T << " seed " << seed);
    const std::vector<float> q = RandomFloats(T * NH * D, seed, 3.0f);
    const std::vector<float> kv = RandomFloats(T * D, seed + 1);
    const std::vector<float> kv_norm = RandomFloats(D, seed + 2);
    const std::vector<float> ones(D, 1.0f);
    std::vector<float> inv_freq(RD / 2);
    for (int64_t j = 0; j < RD / 2; ++j) {
      inv_freq[j] = static_cast<float>(std::pow(160000.0, -2.0 * j / RD));
    }
    std::vector<int32_t> positions(T);
    for (int64_t t = 0; t < T; ++t) positions[t] = static_cast<int32_t>(4000 + 7 * t);
    const float eps = 1e-6f, factor = 1.2079f;
    auto dones = Upload(ones), dkv = Upload(kv), dkv_norm = Upload(kv_norm),
         dinv = Upload(inv_freq);
    auto dpos = gpu_->Allocate(T * sizeof(int32_t));
    gpu_->CopyToDevice(positions.data(), T * sizeof(int32_t), dpos->data());
    auto args = [&](int64_t heads, const float* x, const float* weight, float* out) {
      NormRopeArgs a;
      a.tokens = T, a.heads = heads, a.dim = D, a.rope_dim = RD;
      a.x = x, a.weight = weight, a.eps = eps, a.out = out;
      a.positions = dpos->as<int32_t>(), a.inv_freq = dinv->as<float>();
      a.attention_factor = factor;
      return a;
    };
    // The two ops, then the pair.
    auto q1 = Upload(q), kvn1 = Poisoned(T * D);
    ASSERT_TRUE(ops->NormRope(args(NH, q1->as<float>(), dones->as<float>(), q1->as<float>())));
    ASSERT_TRUE(ops->NormRope(args(1, dkv->as<float>(), dkv_norm->as<float>(), kvn1->as<float>())));
    auto q2 = Upload(q), kvn2 = Poisoned(T * D);
    const NormRopeArgs qa = args(NH, q2->as<float>(), dones->as<float>(), q2->as<float>());
    const NormRopeArgs ka = args(1, dkv->as<float>(), dkv_norm->as<float>(), kvn2->as<float>());
    EXPECT_FALSE(cpu_.v4_ops()->NormRopePair(qa, ka));
    ASSERT_TRUE(ops->NormRopePair(qa, ka));
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    EXPECT_TRUE(AllClose(Download(*q2), Download(*q1), 0, 0)) << "query";
    EXPECT_TRUE(AllClose(Download(*kvn2), Download(*kvn1), 0, 0)) << "key";
    std::vector<float> want_q(q.size()), want_k(kv.size());
    cpu_.RmsNorm(T * NH, D, q.data(), D, ones.data(), eps, want_q.data(), D);
    cpu_.ApplyRope(T, NH, want_q.data() + D - RD, NH * D, D, RD, positions.data(), inv_freq.data(),
                   factor, /*interleaved=*/true);
    cpu_.RmsNorm(T, D, kv.data(), D, kv_norm.data(), eps, want_k.data(), D);
    cpu_.ApplyRope(T, 1, want_k.data() + D - RD, D, D, RD, positions.data(), inv_freq.data(),
                   factor, /*interleaved=*/true);
    EXPECT_TRUE(AllClose(Download(*q2), want_q, 2e-5, 2e-6)) << "query against the CPU";
    EXPECT_TRUE(AllClose(Download(*kvn2), want_k, 2e-5, 2e-6)) << "key against the CPU";
    NormRopeArgs other_factor = ka;
    other_factor.attention_factor = 1.0f;
    EXPECT_FALSE(ops->NormRopePair(qa, other_factor));
    auto q16 = gpu_->Allocate(T * NH * D * sizeof(uint16_t));
    NormRopeArgs bf16 = qa;
    bf16.out = nullptr, bf16.out_bf16 = q16->as<uint16_t>();
    EXPECT_FALSE(ops->NormRopePair(bf16, ka));
  }
}

TEST_F(CudaV4OpsTest, BadArgumentsAreReportedWithTheirShape) {
  HcMixArgs m;
  m.rows = 1;
  m.hc = 9;
  m.hidden = 8;
  gpu_->v4_ops()->HcMix(m);
  ASSERT_FALSE(gpu_->status().ok());
  EXPECT_NE(gpu_->status().message().find("kernels::HcMixF32 (rows 1, hc 9, hidden 8"),
            std::string::npos)
      << gpu_->status();
}

}  // namespace
}  // namespace deepinfer
