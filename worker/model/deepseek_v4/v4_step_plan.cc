// V4StepPlan: the host arrays of a step (exact or padded shape) and their one upload.
#include "worker/model/deepseek_v4/v4_step_plan.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

// The host arrays of a plan and the plan fields that will point at their device copies.
class HostArrays {
 public:
  void Add(std::vector<int64_t> v, const int64_t** field) { i64_.push_back({std::move(v), field}); }
  void Add(std::vector<int32_t> v, const int32_t** field) { i32_.push_back({std::move(v), field}); }
  // Bytes of the blob: int64 arrays, then int32 arrays.
  size_t Bytes() const {
    size_t n64 = 0, n32 = 0;
    for (const auto& a : i64_) n64 += a.host.size();
    for (const auto& a : i32_) n32 += a.host.size();
    return std::max<size_t>(1, n64 * sizeof(int64_t) + n32 * sizeof(int32_t));
  }
  // Uploads the blob to `device` (Bytes() bytes) and points every field at its array there
  // (an empty array: null).
  void Upload(Backend* backend, void* device) {
    std::vector<char> blob(Bytes());
    size_t at = 0;
    auto place = [&](const void* data, size_t bytes, const void** field) {
      *field = bytes == 0 ? nullptr : static_cast<const char*>(device) + at;
      if (bytes > 0) std::memcpy(blob.data() + at, data, bytes);
      at += bytes;
    };
    for (auto& a : i64_) {
      place(a.host.data(), a.host.size() * sizeof(int64_t),
            reinterpret_cast<const void**>(a.field));
    }
    for (auto& a : i32_) {
      place(a.host.data(), a.host.size() * sizeof(int32_t),
            reinterpret_cast<const void**>(a.field));
    }
    backend->CopyToDevice(blob.data(), blob.size(), device);
  }

 private:
  template <typename T>
  struct Array {
    std::vector<T> host;
    const T** field;
  };
  std::vector<Array<int64_t>> i64_;
  std::vector<Array<int32_t>> i32_;
};

// Host lists of row moves, added to the arrays as one V4RowMoves.
struct Moves {
  std::vector<int64_t> src, dst;
  void Add(int64_t from, int64_t to) {
    src.push_back(from);
    dst.push_back(to);
  }
  void AddTo(HostArrays* arrays, V4RowMoves* moves) {
    moves->rows = static_cast<int64_t>(src.size());
    arrays->Add(std::move(src), &moves->src);
    arrays->Add(std::move(dst), &moves->dst);
  }
};

int64_t Mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }

// Element e of the paged stream of `table` (P floats per block).
int64_t PagedElement(const std::vector<int32_t>& table, int64_t P, int64_t e) {
  return int64_t{table[e / P]} * P + e % P;
}

// A window a compressed group pools this step: window `index` of the sequence, pooled from the
// rows of its positions; `closes` false only for a padded row that closes none.
struct Window {
  const V4Sequence* seq = nullptr;  // null: a padding row
  int64_t row = 0;                  // padded shape: the row it belongs to
  int64_t index = 0;
  bool closes = true;
};

}  // namespace

absl::StatusOr<std::unique_ptr<V4StepPlan>> V4StepPlan::Build(const Inputs& in, Backend* backend,
                                                              V4StepPlan* reuse) {
  const DeepseekV4Config& c = *in.config;
  const KvBlockPool& cache = *in.cache;
  const std::vector<V4Sequence>& seqs = *in.seqs;
  const KvCacheSpec& spec = cache.spec();
  const bool padded = in.padded_rows > 0;
  const int64_t T = padded ? in.padded_rows : in.tokens;
  const int64_t W = c.sliding_window, D = c.head_dim;
  const int32_t bs = cache.block_size();
  if (padded && static_cast<int64_t>(seqs.size()) > T) {
    return absl::InvalidArgumentError(
        absl::StrCat("V4StepPlan: ", seqs.size(), " sequences in ", T, " padded rows"));
  }

  auto plan = std::unique_ptr<V4StepPlan>(new V4StepPlan());
  plan->tokens_ = T;
  plan->groups_.resize(spec.groups.size());
  plan->group_of_layer_.assign(spec.num_layers(), 0);
  for (size_t g = 0; g < spec.groups.size(); ++g) {
    for (int32_t l : spec.groups[g].layers) plan->group_of_layer_[l] = g;
  }
  HostArrays arrays;

  // Per token. Padding rows: position 0 of no sequence, their window their own key.
  std::vector<int32_t> positions(T, 0), neg(T, 0), window_len(T, 1), step_start(T, 0), slot(T, 0);
  std::vector<int32_t> token_seq(T);
  std::iota(token_seq.begin(), token_seq.end(), 0);
  std::vector<const V4Sequence*> seq_of(T, nullptr);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const V4Sequence& q = seqs[s];
    for (int64_t i = 0; i < q.num_tokens; ++i) {
      const int64_t t = q.first_row + i, p = q.offset + i;
      const int64_t first = std::max<int64_t>(q.replay_from, p - W + 1);
      positions[t] = static_cast<int32_t>(p);
      neg[t] = -static_cast<int32_t>(p);
      window_len[t] = static_cast<int32_t>(p - first + 1);
      step_start[t] = static_cast<int32_t>(q.offset);
      slot[t] = q.slot;
      token_seq[t] = static_cast<int32_t>(s);
      seq_of[t] = &q;
    }
  }
  arrays.Add(std::move(positions), &plan->positions_);
  arrays.Add(std::move(neg), &plan->neg_positions_);
  arrays.Add(std::move(window_len), &plan->window_len_);
  arrays.Add(std::move(step_start), &plan->step_start_);
  arrays.Add(std::move(slot), &plan->slot_);
  std::vector<int32_t> stream_rows(T * c.hc_mult);
  for (int64_t r = 0; r < T * c.hc_mult; ++r) stream_rows[r] = static_cast<int32_t>(r / c.hc_mult);
  arrays.Add(std::move(stream_rows), &plan->stream_rows_);
  if (!padded) {
    // Block tables as far as the step reads them (its sequences' blocks up to their last
    // position); the rest of a row is never read.
    int64_t width = 1;
    for (const V4Sequence& q : seqs) {
      width = std::max<int64_t>(width, (q.offset + q.num_tokens + bs - 1) / bs);
    }
    std::vector<int32_t> tables(seqs.size() * width, 0);
    for (size_t s = 0; s < seqs.size(); ++s) {
      const std::vector<int32_t>& b = *seqs[s].block_table;
      std::copy(b.begin(), b.begin() + std::min<int64_t>(width, b.size()),
                tables.begin() + s * width);
    }
    plan->table_stride_ = width;
    plan->table_rows_ = static_cast<int64_t>(seqs.size());
    arrays.Add(std::move(token_seq), &plan->token_seq_);
    arrays.Add(std::move(tables), &plan->block_tables_);
  }

  for (size_t gi = 0; gi < spec.groups.size(); ++gi) {
    const KvCacheGroupSpec& g = spec.groups[gi];
    V4GroupPlan& gp = plan->groups_[gi];
    const int64_t SF = g.StateFloats();
    // The window ring keeps each sequence's last window_rows() keys (the window and the spare
    // rows of a verification's drafts).
    const int64_t WR = g.window_rows();
    Moves ring;
    if (padded) {
      for (int64_t t = 0; t < T; ++t) {
        const V4Sequence* q = seq_of[t];
        ring.Add(t * D, q != nullptr ? q->slot * SF + (q->offset % WR) * D : -1);
      }
    } else {
      for (const V4Sequence& q : seqs) {
        const int64_t end = q.offset + q.num_tokens;
        for (int64_t p = std::max(q.offset, end - WR); p < end; ++p) {
          ring.Add((q.first_row + p - q.offset) * D, q.slot * SF + (p % WR) * D);
        }
      }
    }
    ring.AddTo(&arrays, &gp.window_ring);
    if (g.kind != KvCacheKind::kCompressed && g.kind != KvCacheKind::kCompressedSparse) continue;

    const bool sparse = g.kind == KvCacheKind::kCompressedSparse;
    const int64_t R = g.ratio;
    std::vector<int32_t> visible(T, 0), candidates(T, 0);
    for (int64_t t = 0; t < T; ++t) {
      const V4Sequence* q = seq_of[t];
      if (q == nullptr) continue;
      const int64_t p = q->offset + (t - q->first_row);
      visible[t] = static_cast<int32_t>((p + 1) / R);
      // The indexer's row: the entries the query sees, or with full-forward ties every entry
      // the sequence has after this step (HF's forward over the prefix ending here).
      candidates[t] =
          static_cast<int32_t>(in.full_forward_ties ? (q->offset + q->num_tokens) / R : visible[t]);
      gp.max_candidates = std::max<int64_t>(gp.max_candidates, sparse ? candidates[t] : visible[t]);
    }
    arrays.Add(std::move(visible), &gp.visible);
    if (sparse) arrays.Add(std::move(candidates), &gp.candidates);

    // The windows this step closes: entries max(o, kept_end) / ratio .. (o + n) / ratio - 1 of
    // each sequence (windows ending at or before kept_end hold kept entries); padded: one
    // candidate per row.
    std::vector<Window> windows;
    if (padded) {
      for (int64_t t = 0; t < T; ++t) {
        Window w;
        w.seq = seq_of[t];
        w.row = t;
        w.closes = false;
        if (w.seq != nullptr) {
          const int64_t lo = std::max(w.seq->offset, w.seq->kept_end) / R;
          w.closes = lo < (w.seq->offset + 1) / R;
          w.index = w.closes ? lo : 0;
        }
        windows.push_back(w);
      }
    } else {
      for (const V4Sequence& q : seqs) {
        for (int64_t i = std::max(q.offset, q.kept_end) / R; i < (q.offset + q.num_tokens) / R;
             ++i) {
          windows.push_back({&q, 0, i, true});
        }
      }
    }
    const int64_t NW = static_cast<int64_t>(windows.size());
    gp.windows = NW;
    std::vector<int32_t> has_prev(NW), window_pos(NW);
    for (int64_t wi = 0; wi < NW; ++wi) {
      has_prev[wi] = windows[wi].index > 0;
      window_pos[wi] = static_cast<int32_t>(windows[wi].index * R);
    }
    arrays.Add(std::move(has_prev), &gp.has_prev);
    arrays.Add(std::move(window_pos), &gp.window_pos);

    // One compressor's moves: entries `dim` wide into a stream of P floats per block, its ring
    // at `state_offset` of each slot.
    auto plan_compressor = [&](int64_t dim, bool overlap, int64_t state_offset, int64_t P,
                               V4CompressorPlan* cp) {
      const int64_t width = overlap ? 2 * dim : dim, rw = 2 * width;
      const int64_t slots = overlap ? 2 * R : R, ring_rows = g.compressor_rows();
      cp->dim = dim;
      cp->ratio = R;
      cp->overlap = overlap;
      cp->slots = slots;
      cp->row_floats = rw;
      cp->piece = std::gcd(dim, P);
      Moves gather_new, gather_ring, entries, ring_rows_moves;
      for (int64_t wi = 0; wi < NW; ++wi) {
        const Window& w = windows[wi];
        const V4Sequence* q = w.seq;
        const int64_t first = w.index * R - (overlap ? R : 0);
        const int64_t state = q != nullptr ? q->slot * SF + state_offset : state_offset;
        for (int64_t j = 0; j < slots; ++j) {
          const int64_t p = first + j, to = (wi * slots + j) * rw;
          if (padded) {
            // The window's last slot is the row's own token; the others are in the ring (a
            // closing window's are exactly the ring's rows; others read rows nobody uses).
            if (j + 1 == slots) {
              gather_new.Add(w.row * rw, to);
            } else {
              gather_ring.Add(state + Mod(p, ring_rows) * rw, to);
            }
            continue;
          }
          if (p < 0) continue;  // before the sequence: weight 0, never read
          if (p >= q->offset) {
            gather_new.Add((q->first_row + p - q->offset) * rw, to);
          } else {
            gather_ring.Add(state + (p % ring_rows) * rw, to);
          }
        }
        for (int64_t at = 0; at < dim; at += cp->piece) {
          entries.Add(wi * dim + at,
                      w.closes ? PagedElement(*q->block_table, P, w.index * dim + at) : -1);
        }
      }
      // The ring keeps each sequence's last ring_rows projection rows.
      if (padded) {
        for (int64_t t = 0; t < T; ++t) {
          const V4Sequence* q = seq_of[t];
          ring_rows_moves.Add(
              t * rw,
              q != nullptr ? q->slot * SF + state_offset + (q->offset % ring_rows) * rw : -1);
        }
      } else {
        for (const V4Sequence& q : seqs) {
          const int64_t end = q.offset + q.num_tokens;
          for (int64_t p = std::max(q.offset, end - ring_rows); p < end; ++p) {
            ring_rows_moves.Add((q.first_row + p - q.offset) * rw,
                                q.slot * SF + state_offset + (p % ring_rows) * rw);
          }
        }
      }
      gather_new.AddTo(&arrays, &cp->gather_new);
      gather_ring.AddTo(&arrays, &cp->gather_ring);
      entries.AddTo(&arrays, &cp->entries);
      ring_rows_moves.AddTo(&arrays, &cp->ring);
    };
    plan_compressor(g.head_dim, sparse, g.compressor_state_offset(), g.CompressedFloatsPerBlock(bs),
                    &gp.compressor);
    if (sparse) {
      plan_compressor(g.index_dim, true, g.indexer_state_offset(), g.IndexFloatsPerBlock(bs),
                      &gp.indexer);
    }
  }

  plan->buffer_bytes_ = arrays.Bytes();
  if (reuse != nullptr) {
    if (reuse->buffer_ == nullptr || reuse->buffer_bytes_ != plan->buffer_bytes_) {
      return absl::InvalidArgumentError(absl::StrCat("V4StepPlan: a plan of ", plan->buffer_bytes_,
                                                     " bytes cannot reuse a buffer laid out for ",
                                                     reuse->buffer_bytes_));
    }
    plan->buffer_ = std::move(reuse->buffer_);
  } else {
    plan->buffer_ = padded ? backend->Allocate(plan->buffer_bytes_)
                           : backend->AllocateScratch(plan->buffer_bytes_);
  }
  arrays.Upload(backend, plan->buffer_->data());
  return plan;
}

}  // namespace deepinfer
