// V4StepPlan's addressing against values worked out by hand from kv_cache_spec.h's layout: a
// chunk's windows, the compressors' windows (slots from this step's rows and from the ring, HCA
// entries spread over two blocks, CSA's overlapping windows), the rings' last rows; the padded
// shape of a decode graph (every row a candidate window, a row closing none and the padding rows
// writing nothing, fixed lengths). The model's results through either shape are checked against
// each other by deepseek_v4_decode_graph_test and against HF by the parity tests.
#include "worker/model/deepseek_v4/v4_step_plan.h"

#include <vector>

#include "gtest/gtest.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/deepseek_v4/deepseek_v4_model.h"

namespace deepinfer {
namespace {

// Window 4, head_dim 8, index_dim 4; layers: sliding, CSA (ratio 2), HCA (ratio 8). In blocks of
// 4 positions an HCA entry (8 floats) spans two blocks of 4 floats, a CSA block holds 2 entries
// (16 floats), an indexer block 2 keys (8 floats).
DeepseekV4Config Config() {
  DeepseekV4Config c;
  c.num_layers = 3;
  c.head_dim = 8;
  c.sliding_window = 4;
  c.attention = {V4AttentionKind::kSliding, V4AttentionKind::kSparse, V4AttentionKind::kCompressed};
  c.compress_rate = {0, 2, 8};
  c.index_head_dim = 4;
  c.hc_mult = 2;
  return c;
}

std::vector<int64_t> Read(const int64_t* p, int64_t n) { return {p, p + n}; }
std::vector<int32_t> Read(const int32_t* p, int64_t n) { return {p, p + n}; }

class V4StepPlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_ = Config();
    KvBlockPoolOptions o{DeepseekV4Model::CacheSpecOf(config_), 16, 4};
    o.max_sequences = 4;
    auto pool = KvBlockPool::Create(&backend_, o);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
  }
  const KvCacheGroupSpec& Group(int32_t layer) { return pool_->LayerGroup(layer); }
  const V4GroupPlan& Plan(const V4StepPlan& p, int32_t layer) { return p.group_of_layer(layer); }

  CpuBackend backend_{1};
  DeepseekV4Config config_;
  std::unique_ptr<KvBlockPool> pool_;
};

// One sequence in slot 3 continuing at position 6 with 3 tokens (positions 6, 7, 8), blocks
// {5, 2, 9}: it closes HCA window 0 (positions 0-7) and CSA window 3 (positions 6-7, with
// window 2's 4-5).
TEST_F(V4StepPlanTest, ExactShapeAddressesEveryRow) {
  const std::vector<int32_t> table = {5, 2, 9};
  std::vector<V4Sequence> seqs(1);
  seqs[0].first_row = 0;
  seqs[0].num_tokens = 3;
  seqs[0].offset = 6;
  seqs[0].block_table = &table;
  seqs[0].slot = 3;
  V4StepPlan::Inputs in;
  in.config = &config_;
  in.cache = pool_.get();
  in.seqs = &seqs;
  in.tokens = 3;
  auto plan = V4StepPlan::Build(in, &backend_);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const V4StepPlan& p = **plan;
  EXPECT_EQ(Read(p.positions(), 3), (std::vector<int32_t>{6, 7, 8}));
  EXPECT_EQ(Read(p.neg_positions(), 3), (std::vector<int32_t>{-6, -7, -8}));
  EXPECT_EQ(Read(p.window_len(), 3), (std::vector<int32_t>{4, 4, 4}));
  EXPECT_EQ(Read(p.step_start(), 3), (std::vector<int32_t>{6, 6, 6}));
  EXPECT_EQ(Read(p.slot(), 3), (std::vector<int32_t>{3, 3, 3}));
  EXPECT_EQ(Read(p.stream_rows(), 6), (std::vector<int32_t>{0, 0, 1, 1, 2, 2}));
  ASSERT_EQ(p.table_stride(), 3);  // positions up to 8: 3 blocks
  EXPECT_EQ(Read(p.block_tables(), 3), table);

  // Sliding layer: the window ring keeps positions 6, 7, 8 (rows 2, 3, 0 of slot 3).
  const int64_t sf0 = Group(0).StateFloats();
  const V4GroupPlan& sliding = Plan(p, 0);
  EXPECT_EQ(sliding.window_ring.rows, 3);
  EXPECT_EQ(Read(sliding.window_ring.src, 3), (std::vector<int64_t>{0, 8, 16}));
  EXPECT_EQ(Read(sliding.window_ring.dst, 3),
            (std::vector<int64_t>{3 * sf0 + 16, 3 * sf0 + 24, 3 * sf0 + 0}));
  EXPECT_EQ(sliding.windows, 0);

  // HCA (ratio 8): every query sees (p + 1) / 8 entries; window 0 pools positions 0-7, 6 and 7
  // from this step's rows (row width 16: kv then gate), 0-5 from the compressor ring.
  const KvCacheGroupSpec& hca = Group(2);
  const int64_t sf2 = hca.StateFloats(), off2 = hca.compressor_state_offset();
  const V4GroupPlan& h = Plan(p, 2);
  EXPECT_EQ(Read(h.visible, 3), (std::vector<int32_t>{0, 1, 1}));
  ASSERT_EQ(h.windows, 1);
  EXPECT_EQ(Read(h.has_prev, 1), (std::vector<int32_t>{0}));
  EXPECT_EQ(Read(h.window_pos, 1), (std::vector<int32_t>{0}));
  const V4CompressorPlan& hc = h.compressor;
  EXPECT_EQ(hc.slots, 8);
  EXPECT_EQ(hc.row_floats, 16);
  EXPECT_EQ(Read(hc.gather_new.src, 2), (std::vector<int64_t>{0, 16}));
  EXPECT_EQ(Read(hc.gather_new.dst, 2), (std::vector<int64_t>{6 * 16, 7 * 16}));
  ASSERT_EQ(hc.gather_ring.rows, 6);
  for (int64_t j = 0; j < 6; ++j) {
    EXPECT_EQ(hc.gather_ring.src[j], 3 * sf2 + off2 + j * 16) << "slot " << j;
    EXPECT_EQ(hc.gather_ring.dst[j], j * 16) << "slot " << j;
  }
  // Entry 0's 8 floats: elements 0-3 in block table[0] = 5, 4-7 in table[1] = 2 (4 a block).
  EXPECT_EQ(hc.piece, 4);
  EXPECT_EQ(Read(hc.entries.src, 2), (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(Read(hc.entries.dst, 2), (std::vector<int64_t>{5 * 4, 2 * 4}));
  // The ring keeps positions 6, 7, 8 (its last 8 rows: all of this step's).
  EXPECT_EQ(Read(hc.ring.dst, 3),
            (std::vector<int64_t>{3 * sf2 + off2 + 6 * 16, 3 * sf2 + off2 + 7 * 16,
                                  3 * sf2 + off2 + 0 * 16}));

  // CSA (ratio 2): window 3 pools positions 4-5 (the previous window's first halves, from the
  // ring of 2 * ratio = 4 rows of 32 floats) and 6-7 (this step's rows); entry 3 lies in block
  // table[1] = 2 at offset 8 (2 entries of 8 floats a block); the indexer's key 3 likewise in
  // blocks of 8 floats.
  const KvCacheGroupSpec& csa = Group(1);
  const int64_t sf1 = csa.StateFloats(), off1 = csa.compressor_state_offset();
  const V4GroupPlan& s = Plan(p, 1);
  EXPECT_EQ(Read(s.visible, 3), (std::vector<int32_t>{3, 4, 4}));
  EXPECT_EQ(Read(s.candidates, 3), (std::vector<int32_t>{3, 4, 4}));
  EXPECT_EQ(s.max_candidates, 4);
  ASSERT_EQ(s.windows, 1);
  EXPECT_EQ(Read(s.has_prev, 1), (std::vector<int32_t>{1}));
  EXPECT_EQ(Read(s.window_pos, 1), (std::vector<int32_t>{6}));
  const V4CompressorPlan& sc = s.compressor;
  EXPECT_EQ(sc.slots, 4);
  EXPECT_EQ(sc.row_floats, 32);
  EXPECT_EQ(Read(sc.gather_ring.src, 2),
            (std::vector<int64_t>{3 * sf1 + off1 + 0 * 32, 3 * sf1 + off1 + 1 * 32}));
  EXPECT_EQ(Read(sc.gather_ring.dst, 2), (std::vector<int64_t>{0, 32}));
  EXPECT_EQ(Read(sc.gather_new.src, 2), (std::vector<int64_t>{0, 32}));
  EXPECT_EQ(Read(sc.gather_new.dst, 2), (std::vector<int64_t>{64, 96}));
  EXPECT_EQ(sc.piece, 8);
  EXPECT_EQ(Read(sc.entries.dst, 1), (std::vector<int64_t>{2 * 16 + 8}));
  const V4CompressorPlan& si = s.indexer;
  EXPECT_EQ(si.dim, 4);
  EXPECT_EQ(si.row_floats, 16);
  EXPECT_EQ(Read(si.entries.dst, 1), (std::vector<int64_t>{2 * 8 + 4}));
  EXPECT_EQ(si.ring.dst[0], 3 * sf1 + csa.indexer_state_offset() + (6 % 4) * 16);
}

// A decode graph's bucket of 4 rows: sequence 0 at position 7 (closes HCA window 0 and CSA
// window 3), sequence 1 at position 4 (closes none), rows 2 and 3 padding. Every array's
// length depends on the bucket alone; rows that close nothing and padding rows write nothing.
TEST_F(V4StepPlanTest, PaddedShapeListsEveryRowAndSkipsTheirWrites) {
  const std::vector<int32_t> table0 = {5, 2}, table1 = {7, 1};
  std::vector<V4Sequence> seqs(2);
  for (int s = 0; s < 2; ++s) {
    seqs[s].first_row = s;
    seqs[s].num_tokens = 1;
    seqs[s].offset = s == 0 ? 7 : 4;
    seqs[s].block_table = s == 0 ? &table0 : &table1;
    seqs[s].slot = s == 0 ? 2 : 0;
  }
  V4StepPlan::Inputs in;
  in.config = &config_;
  in.cache = pool_.get();
  in.seqs = &seqs;
  in.padded_rows = 4;
  auto plan = V4StepPlan::Build(in, &backend_);
  ASSERT_TRUE(plan.ok()) << plan.status();
  const V4StepPlan& p = **plan;
  EXPECT_EQ(p.tokens(), 4);
  EXPECT_EQ(p.block_tables(), nullptr);  // the graph's own
  EXPECT_EQ(Read(p.positions(), 4), (std::vector<int32_t>{7, 4, 0, 0}));
  EXPECT_EQ(Read(p.window_len(), 4), (std::vector<int32_t>{4, 4, 1, 1}));
  EXPECT_EQ(Read(p.step_start(), 4), (std::vector<int32_t>{7, 4, 0, 0}));
  const int64_t sf0 = Group(0).StateFloats();
  EXPECT_EQ(Read(Plan(p, 0).window_ring.dst, 4),
            (std::vector<int64_t>{2 * sf0 + 3 * 8, 0 * sf0 + 0 * 8, -1, -1}));

  const KvCacheGroupSpec& hca = Group(2);
  const int64_t sf2 = hca.StateFloats(), off2 = hca.compressor_state_offset();
  const V4GroupPlan& h = Plan(p, 2);
  EXPECT_EQ(h.windows, 4);
  EXPECT_EQ(Read(h.visible, 4), (std::vector<int32_t>{1, 0, 0, 0}));
  const V4CompressorPlan& hc = h.compressor;
  EXPECT_EQ(hc.gather_new.rows, 4);
  EXPECT_EQ(hc.gather_ring.rows, 4 * 7);
  EXPECT_EQ(hc.entries.rows, 4 * 2);
  EXPECT_EQ(hc.ring.rows, 4);
  // Row 0's window: its own row last, positions 0-6 from slot 2's ring.
  EXPECT_EQ(hc.gather_new.src[0], 0);
  EXPECT_EQ(hc.gather_new.dst[0], 7 * 16);
  for (int64_t j = 0; j < 7; ++j) {
    EXPECT_EQ(hc.gather_ring.src[j], 2 * sf2 + off2 + j * 16) << "slot " << j;
  }
  EXPECT_EQ(Read(hc.entries.dst, 8), (std::vector<int64_t>{5 * 4, 2 * 4, -1, -1, -1, -1, -1, -1}));
  EXPECT_EQ(Read(hc.ring.dst, 4),
            (std::vector<int64_t>{2 * sf2 + off2 + 7 * 16, 0 * sf2 + off2 + 4 * 16, -1, -1}));

  // CSA: row 0 closes window 3 (entry 3: block table0[1] = 2, offset 8); row 1 (position 4)
  // closes none.
  const V4GroupPlan& s = Plan(p, 1);
  EXPECT_EQ(Read(s.visible, 4), (std::vector<int32_t>{4, 2, 0, 0}));
  EXPECT_EQ(Read(s.has_prev, 4), (std::vector<int32_t>{1, 0, 0, 0}));
  EXPECT_EQ(Read(s.window_pos, 4), (std::vector<int32_t>{6, 0, 0, 0}));
  EXPECT_EQ(Read(s.compressor.entries.dst, 4), (std::vector<int64_t>{2 * 16 + 8, -1, -1, -1}));

  // The same bucket's next plan reuses the buffer: the device addresses stay.
  seqs[0].offset = 8;
  seqs[1].offset = 5;
  auto next = V4StepPlan::Build(in, &backend_, plan->get());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ((*next)->positions(), p.positions());
  EXPECT_EQ(Plan(**next, 2).compressor.entries.dst, hc.entries.dst);
  EXPECT_EQ(Read((*next)->positions(), 4), (std::vector<int32_t>{8, 5, 0, 0}));
}

}  // namespace
}  // namespace deepinfer
