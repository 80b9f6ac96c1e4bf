// CpuV4Ops against values worked out by hand from the formulas in v4_ops.h (the whole model is
// checked against HF by //tests/parity:deepseek_v4_parity_test).
#include "worker/backend/cpu/cpu_v4_ops.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

TEST(CpuV4OpsTest, SwiGluClampsGateAboveAndUpBothWays) {
  ThreadPool pool(2);
  CpuV4Ops ops(&pool);
  const std::vector<float> x = {20.0f, -3.0f, /*up*/ -20.0f, 0.5f};
  std::vector<float> out(2);
  ops.SwiGluClamped(1, 2, x.data(), 10.0f, out.data());
  EXPECT_FLOAT_EQ(out[0], Silu(10.0f) * -10.0f);
  EXPECT_FLOAT_EQ(out[1], Silu(-3.0f) * 0.5f);
  ops.SwiGluClamped(1, 2, x.data(), 0.0f, out.data());  // no limit
  EXPECT_FLOAT_EQ(out[0], Silu(20.0f) * -20.0f);
}

TEST(CpuV4OpsTest, SinkAttentionTakesTheSinkIntoTheSoftmax) {
  ThreadPool pool(1);
  CpuV4Ops ops(&pool);
  // One query, one head of dim 2 at position 0: its window is its own key (1, 0); one compressed
  // entry (0, 1) in block 3 of a stream of 2-float blocks.
  const std::vector<float> q = {2.0f, 1.0f}, kv = {1.0f, 0.0f}, sinks = {0.5f};
  const std::vector<float> stream = {9, 9, 9, 9, 9, 9, 0.0f, 1.0f};
  const std::vector<int32_t> pos = {0}, wl = {1}, start = {0}, slot = {0}, table = {3}, seq = {0},
                             el = {1};
  std::vector<float> out(2);
  SinkAttentionArgs a;
  a.tokens = 1;
  a.heads = 1;
  a.dim = 2;
  a.q = q.data();
  a.kv = kv.data();
  a.positions = pos.data();
  a.window_len = wl.data();
  a.step_start = start.data();
  a.ring_slot = slot.data();
  a.entries = {stream.data(), 2, table.data(), 1, seq.data()};
  a.extra_len = el.data();
  a.sinks = sinks.data();
  a.scale = 1.0f;
  a.out = out.data();
  ops.SinkAttention(a);
  const double z = std::exp(2.0) + std::exp(1.0) + std::exp(0.5);
  EXPECT_NEAR(out[0], std::exp(2.0) / z, 1e-6);
  EXPECT_NEAR(out[1], std::exp(1.0) / z, 1e-6);
  // The indexer's choice instead of the range: none chosen leaves the window only.
  const std::vector<int32_t> none = {-1};
  a.selected = none.data();
  a.selected_stride = 1;
  ops.SinkAttention(a);
  EXPECT_NEAR(out[0], std::exp(2.0) / (std::exp(2.0) + std::exp(0.5)), 1e-6);
  EXPECT_EQ(out[1], 0.0f);
}

// The keys come from where the cache keeps them: window positions before the step from the
// ring (row p % ring_rows of the query's slot), the step's from kv, and a compressed entry
// spread over two blocks (block_floats 1 < dim 2) gathered through the block table.
TEST(CpuV4OpsTest, SinkAttentionReadsTheRingTheStepAndPagedEntries) {
  ThreadPool pool(1);
  CpuV4Ops ops(&pool);
  // Two queries of one sequence at positions 5 and 6, window 3: query 1 (position 6) sees
  // position 4 (ring slot 1, row 4 % 3 = 1), 5 (kv row 0) and 6 (kv row 1). Query 0 sees
  // positions 3, 4 (ring) and 5 (kv row 0).
  const std::vector<float> q = {0.0f, 0.0f, 0.0f, 0.0f};  // equal logits: plain averages
  const std::vector<float> kv = {5.0f, 50.0f, 6.0f, 60.0f};
  const std::vector<float> ring = {0,    0,     0,    0,     0, 0,   // slot 0, unused
                                   3.0f, 30.0f, 4.0f, 40.0f, 0, 0};  // slot 1: positions 3, 4
  const std::vector<int32_t> pos = {5, 6}, wl = {3, 3}, start = {5, 5}, slot = {1, 1};
  // Entry 0 of the stream: element 0 in block 2, element 1 in block 0.
  const std::vector<float> stream = {100.0f, 0.0f, 7.0f};
  const std::vector<int32_t> table = {2, 0}, seq = {0, 0}, el = {0, 1};
  const std::vector<float> sinks = {-1e30f};  // no sink weight
  std::vector<float> out(4);
  SinkAttentionArgs a;
  a.tokens = 2;
  a.heads = 1;
  a.dim = 2;
  a.q = q.data();
  a.kv = kv.data();
  a.positions = pos.data();
  a.window_len = wl.data();
  a.step_start = start.data();
  a.ring = ring.data();
  a.ring_rows = 3;
  a.ring_stride = 6;
  a.ring_slot = slot.data();
  a.entries = {stream.data(), 1, table.data(), 2, seq.data()};
  a.extra_len = el.data();
  a.sinks = sinks.data();
  a.out = out.data();
  ops.SinkAttention(a);
  EXPECT_FLOAT_EQ(out[0], (3.0f + 4.0f + 5.0f) / 3);
  EXPECT_FLOAT_EQ(out[1], (30.0f + 40.0f + 50.0f) / 3);
  EXPECT_FLOAT_EQ(out[2], (4.0f + 5.0f + 6.0f + 7.0f) / 4);
  EXPECT_FLOAT_EQ(out[3], (40.0f + 50.0f + 60.0f + 100.0f) / 4);
}

TEST(CpuV4OpsTest, IndexerKeepsTheBestVisibleAscending) {
  ThreadPool pool(1);
  CpuV4Ops ops(&pool);
  // One head of dim 1, q = 1, weight 1: key i scores relu(key i). Keys 3, 5, -1, 9 (the last
  // not visible), paged two per block in blocks 1 and 0; top 2 -> entries 0 and 1 (scores 3 and
  // 5), listed ascending.
  const std::vector<float> q = {1.0f}, w = {1.0f}, keys = {-1.0f, 9.0f, 3.0f, 5.0f};
  const std::vector<int32_t> table = {1, 0}, seq = {0}, cand = {4}, vis = {3};
  std::vector<int32_t> sel(3, 7);
  IndexerTopKArgs a;
  a.tokens = 1;
  a.heads = 1;
  a.dim = 1;
  a.topk = 3;
  a.q = q.data();
  a.weights = w.data();
  a.keys = {keys.data(), 2, table.data(), 2, seq.data()};
  a.candidates = cand.data();
  a.visible = vis.data();
  a.max_candidates = 4;
  a.selected = sel.data();
  ops.IndexerTopK(a);
  // Top 3 of (3, 5, 0, -inf): entries 1, 0, 2, all visible.
  EXPECT_EQ(sel, (std::vector<int32_t>{0, 1, 2}));
  a.topk = 2;
  ops.IndexerTopK(a);
  EXPECT_EQ(sel[0], 0);
  EXPECT_EQ(sel[1], 1);
  const std::vector<int32_t> one_visible = {1};
  a.visible = one_visible.data();
  ops.IndexerTopK(a);
  EXPECT_EQ(sel[0], 0);
  EXPECT_EQ(sel[1], -1);
}

TEST(CpuV4OpsTest, CopyRowsMovesListedRowsAndSkipsNegativeDestinations) {
  ThreadPool pool(1);
  CpuV4Ops ops(&pool);
  const std::vector<float> src = {1, 2, 3, 4, 5, 6};
  std::vector<float> dst(8, 0.0f);
  const std::vector<int64_t> from = {4, 0, 2}, to = {1, -1, 5};
  ops.CopyRows({3, 2, src.data(), from.data(), dst.data(), to.data()});
  EXPECT_EQ(dst, (std::vector<float>{0, 5, 6, 0, 0, 3, 4, 0}));
  // Null offsets: row r at r * width.
  ops.CopyRows({2, 2, src.data(), nullptr, dst.data(), to.data()});
  EXPECT_EQ(dst, (std::vector<float>{0, 1, 2, 0, 0, 3, 4, 0}));
}

TEST(CpuV4OpsTest, RoutesByHashTableOrTopKAndRenormalises) {
  ThreadPool pool(1);
  CpuV4Ops ops(&pool);
  // sigmoid scores of logits (0, 2, -2, 1); top 2 by score + bias with bias favouring expert 2.
  const std::vector<float> logits = {0.0f, 2.0f, -2.0f, 1.0f}, bias = {0.0f, 0.0f, 5.0f, 0.0f};
  std::vector<int32_t> ids(2);
  std::vector<float> w(2);
  V4RouteArgs r;
  r.rows = 1;
  r.experts = 4;
  r.top_k = 2;
  r.logits = logits.data();
  r.bias = bias.data();
  r.sqrtsoftplus = false;
  r.scaling = 2.0f;
  r.topk_ids = ids.data();
  r.topk_weights = w.data();
  ops.Route(r);
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2}));
  EXPECT_NEAR(w[0], sig(2) / (sig(2) + sig(-2)) * 2, 1e-6);
  EXPECT_NEAR(w[1], sig(-2) / (sig(2) + sig(-2)) * 2, 1e-6);
  // Hash routing: token 1's row (3, 0), weighted by sqrt(softplus(logit)), sorted by id.
  const std::vector<int32_t> table = {1, 2, 3, 0}, token = {1};
  r.hash_table = table.data();
  r.token_ids = token.data();
  r.sqrtsoftplus = true;
  ops.Route(r);
  auto ssp = [](double x) { return std::sqrt(std::log1p(std::exp(x))); };
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 3}));
  EXPECT_NEAR(w[0], ssp(0) / (ssp(0) + ssp(1)) * 2, 1e-6);
  EXPECT_NEAR(w[1], ssp(1) / (ssp(0) + ssp(1)) * 2, 1e-6);
}

TEST(CpuV4OpsTest, HyperConnectionMixIsSinkhornProjected) {
  ThreadPool pool(1);
  CpuV4Ops ops(&pool);
  const int64_t hc = 2, H = 3, M = (2 + hc) * hc;
  // Mixes 0: pre = sigmoid(base) + eps, post = 2 sigmoid(base), comb from base alone.
  std::vector<float> mixes(M, 0.0f), base = {1.0f, -1.0f, 0.0f, 2.0f, 3.0f, 0.0f, 0.0f, 1.0f};
  const std::vector<float> scale = {1.0f, 1.0f, 1.0f};
  const std::vector<float> streams = {1, 2, 3, 10, 20, 30};
  std::vector<float> post(hc), comb(hc * hc), collapsed(H);
  HcMixArgs a;
  a.rows = 1;
  a.hc = hc;
  a.hidden = H;
  a.mixes = mixes.data();
  a.base = base.data();
  a.scale = scale.data();
  a.sinkhorn_iters = 50;
  a.eps = 1e-6f;
  a.streams = streams.data();
  a.post = post.data();
  a.comb = comb.data();
  a.collapsed = collapsed.data();
  ops.HcMix(a);
  auto sig = [](double x) { return 1.0 / (1.0 + std::exp(-x)); };
  EXPECT_NEAR(post[0], 2 * sig(0.0), 1e-6);
  EXPECT_NEAR(post[1], 2 * sig(2.0), 1e-6);
  const double pre0 = sig(1.0) + 1e-6, pre1 = sig(-1.0) + 1e-6;
  EXPECT_NEAR(collapsed[0], pre0 * 1 + pre1 * 10, 1e-5);
  EXPECT_NEAR(collapsed[2], pre0 * 3 + pre1 * 30, 1e-5);
  // Doubly stochastic after the iterations (rows and columns sum to 1 up to eps).
  EXPECT_NEAR(comb[0] + comb[1], 1.0, 1e-4);
  EXPECT_NEAR(comb[2] + comb[3], 1.0, 1e-4);
  EXPECT_NEAR(comb[0] + comb[2], 1.0, 1e-4);
  EXPECT_NEAR(comb[1] + comb[3], 1.0, 1e-4);
  // Expand: out[k] = post[k] * f + sum_j comb[j][k] * in[j].
  const std::vector<float> f = {1, 1, 1};
  std::vector<float> out(hc * H);
  HcExpandArgs e;
  e.rows = 1;
  e.hc = hc;
  e.hidden = H;
  e.block_out = f.data();
  e.post = post.data();
  e.comb = comb.data();
  e.streams_in = streams.data();
  e.streams_out = out.data();
  ops.HcExpand(e);
  EXPECT_NEAR(out[1 * H + 0], post[1] + comb[0 * hc + 1] * 1 + comb[1 * hc + 1] * 10, 1e-5);
}

}  // namespace
}  // namespace deepinfer
