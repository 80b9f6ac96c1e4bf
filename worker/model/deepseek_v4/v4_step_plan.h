// V4StepPlan: where the rows of one DeepSeek-V4 step come from and go to. Every index a layer
// needs (the queries' windows and visible entries, the compressors' windows, the row moves
// between the step's buffers and the cache: window and compressor rings in the sequences' state
// slots, pooled entries into the paged streams) follows from the batch's shapes and block tables
// alone, and is the same for every layer of a cache group (only the layer's state and stream
// base addresses differ). So the plan is built once per step on the host, uploaded in one copy,
// and read by every layer (V4Attention) as device arrays: no per-layer uploads, no copy per
// cache block, nothing read back.
//
// Two shapes:
//  * exact (Step's general path): the step's tokens and exactly the windows it closes;
//  * padded (a decode graph's bucket of B rows): row i < n is sequence i's one new token, rows
//    past n are padding (position 0, seeing only themselves, writing nothing); every row is a
//    candidate window whose moves are listed whether or not it closes one (the entry write of a
//    row that closes none is skipped), so every array's length depends on B alone and the
//    plan's device layout is the same at every step: a graph recorded over it stays valid when
//    the next step's plan is uploaded into the same buffer.
// Both give each closing window, ring row and query exactly the same rows, so the CPU results do
// not depend on the shape.
#ifndef DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_STEP_PLAN_H_
#define DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_STEP_PLAN_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/deepseek_v4/v4_config.h"

namespace deepinfer {

// One sequence of a step, host side.
struct V4Sequence {
  int64_t first_row = 0;   // its first token's row in the step
  int64_t num_tokens = 0;  // new tokens
  int64_t offset = 0;      // position of the first new token
  const std::vector<int32_t>* block_table = nullptr;
  int32_t slot = 0;  // its state slot in the cache
  // SequenceStep::replay_from / kept_end: no window key or compressor row before replay_from;
  // the compressed entries of windows ending at or before kept_end are kept as they are.
  int64_t replay_from = 0;
  int64_t kept_end = 0;
};

// A list of V4Ops::CopyRows moves (device offsets, in floats, from and to the buffers the
// user names).
struct V4RowMoves {
  int64_t rows = 0;
  const int64_t* src = nullptr;
  const int64_t* dst = nullptr;

  CopyRowsArgs Args(int64_t width, const float* from, float* to) const {
    return {rows, width, from, src, to, dst};
  }
};

// One compressor of a compressed group (the attention's, or the CSA indexer's), over the step's
// projection rows (kv then gate, row_floats each, one per token) and the windows the group pools.
struct V4CompressorPlan {
  int64_t dim = 0;  // entry width
  int64_t ratio = 0;
  bool overlap = false;    // CSA's overlapping windows (CompressWindowsArgs::overlap)
  int64_t slots = 0;       // rows a window pools
  int64_t row_floats = 0;  // a projection row: kv then gate, each dim (HCA) or 2 * dim (CSA)
  // Window slots [windows, slots] of row_floats each, gathered from the step's projection rows
  // and from the compressor ring in the layer's state.
  V4RowMoves gather_new, gather_ring;
  // The pooled entries [windows, dim] into the layer's paged stream, in pieces of `piece`
  // floats (a piece never straddles a block).
  int64_t piece = 0;
  V4RowMoves entries;
  // The step's projection rows into the compressor ring (the last ring rows of each sequence).
  V4RowMoves ring;
};

// What the layers of one cache group read.
struct V4GroupPlan {
  // The step's keys ([tokens, head_dim]) into the window ring of the layer's state.
  V4RowMoves window_ring;
  // Compressed groups: per query, the entries it sees (HCA: attends to them all; CSA: the
  // indexer's visible candidates) and the indexer's candidates (CSA).
  const int32_t* visible = nullptr;
  const int32_t* candidates = nullptr;
  int64_t max_candidates = 0;  // host: the largest candidates (or visible) value of the step
  // The windows the compressors pool this step (host count), each window's has_prev and its
  // first position (the entry's rope position).
  int64_t windows = 0;
  const int32_t* has_prev = nullptr;
  const int32_t* window_pos = nullptr;
  V4CompressorPlan compressor, indexer;  // indexer: CSA only
};

class V4StepPlan {
 public:
  struct Inputs {
    const DeepseekV4Config* config = nullptr;
    const KvBlockPool* cache = nullptr;
    const std::vector<V4Sequence>* seqs = nullptr;
    int64_t tokens = 0;  // exact shape: the step's tokens (the sequences' rows)
    // DeepseekV4Model::set_indexer_full_forward_ties.
    bool full_forward_ties = false;
    // > 0: the padded shape of this many rows (every sequence has one new token; rows past the
    // sequences are padding).
    int64_t padded_rows = 0;
  };

  // Builds the plan on the host and uploads it in one copy: into `reuse`'s buffer when given
  // (a plan of the same padded shape: the same layout, so the device addresses stay), else into
  // a buffer of its own. INVALID_ARGUMENT if `reuse` has another layout.
  static absl::StatusOr<std::unique_ptr<V4StepPlan>> Build(const Inputs& in, Backend* backend,
                                                           V4StepPlan* reuse = nullptr);

  int64_t tokens() const { return tokens_; }
  // Per token (device): position, -position (the output's inverse rope), window length, the
  // first position of its sequence in this step, its sequence's state slot, its block-table
  // row.
  const int32_t* positions() const { return positions_; }
  const int32_t* neg_positions() const { return neg_positions_; }
  const int32_t* window_len() const { return window_len_; }
  const int32_t* step_start() const { return step_start_; }
  const int32_t* slot() const { return slot_; }
  // [tokens * hc_mult]: row t * hc_mult + k is t (the residual streams' copies of the embedding).
  const int32_t* stream_rows() const { return stream_rows_; }
  // Block tables [sequences, table_stride] and each token's row (exact shape). A padded plan
  // has none: its user passes the decode graph's (one row per token, set_block_tables).
  const int32_t* token_seq() const { return token_seq_; }
  const int32_t* block_tables() const { return block_tables_; }
  int64_t table_stride() const { return table_stride_; }
  // Rows of block_tables() (0 in a padded plan).
  int64_t table_rows() const { return table_rows_; }
  void set_block_tables(const int32_t* token_seq, const int32_t* tables, int64_t stride) {
    token_seq_ = token_seq;
    block_tables_ = tables;
    table_stride_ = stride;
  }
  // The group of the cache layer `layer`.
  const V4GroupPlan& group_of_layer(int32_t layer) const { return groups_[group_of_layer_[layer]]; }
  V4GroupPlan& group(size_t g) { return groups_[g]; }
  size_t num_groups() const { return groups_.size(); }
  // Bytes of the plan's device buffer.
  size_t device_bytes() const { return buffer_bytes_; }

 private:
  V4StepPlan() = default;

  int64_t tokens_ = 0;
  const int32_t* positions_ = nullptr;
  const int32_t* neg_positions_ = nullptr;
  const int32_t* window_len_ = nullptr;
  const int32_t* step_start_ = nullptr;
  const int32_t* slot_ = nullptr;
  const int32_t* stream_rows_ = nullptr;
  const int32_t* token_seq_ = nullptr;
  const int32_t* block_tables_ = nullptr;
  int64_t table_stride_ = 0;
  int64_t table_rows_ = 0;
  std::vector<V4GroupPlan> groups_;
  std::vector<size_t> group_of_layer_;
  std::unique_ptr<DeviceBuffer> buffer_;
  size_t buffer_bytes_ = 0;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_STEP_PLAN_H_
