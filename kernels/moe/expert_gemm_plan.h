// Device-planned chunked expert GEMMs: the pointer arrays of a cublasGemmBatchedEx call with a
// FIXED batch count, computed on the device from the per-slot row counts that MoePermuteF32
// left there, so the expert GEMMs of a decode step need no host synchronisation and can be
// captured in a CUDA graph (ExpertGemmsCublas kChunked copies the counts to the host instead).
// Each slot's rows (padded layout, MoePermuteParams::row_align = chunk_rows) are cut into chunks
// of chunk_rows rows; the entries the real chunks do not fill are "dummies" that write a dummy
// output nobody reads: either all after the last chunk (dummy x times the first chunk's weights,
// one matrix, so its repeated reads hit L2), or spread evenly between the real chunks, each a
// copy of its neighbouring chunk's weights and x (read at about the same time, so from L2).
// Inside a CUDA graph the planner can also pick the batch itself among a few sizes and set
// switch nodes' handles, so that only the GEMM of that batch runs (most dummies never launched).
// docs/kernels.md has the measurements.
#ifndef DEEPINFER_KERNELS_MOE_EXPERT_GEMM_PLAN_H_
#define DEEPINFER_KERNELS_MOE_EXPERT_GEMM_PLAN_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>

namespace deepinfer {
namespace kernels {

// Batch entries that always suffice for `rows` (tokens x top_k) rows over num_slots slots in
// chunks of chunk_rows: at most min(num_slots, rows) slots are busy, and a busy slot with c
// rows needs ceil(c / chunk_rows) <= (c + chunk_rows - 1) / chunk_rows chunks. At least 1.
inline int32_t ExpertGemmBatchBound(int64_t rows, int32_t num_slots, int32_t chunk_rows) {
  const int64_t busy = std::min<int64_t>(num_slots, rows);
  return static_cast<int32_t>(std::max<int64_t>(1, (rows + busy * (chunk_rows - 1)) / chunk_rows));
}

// Most batch sizes a CUDA graph's switch over the planned GEMMs may hold
// (ExpertGemmPlanParams::bucket_batch).
constexpr int32_t kMaxExpertGemmBatchBuckets = 16;

// Batch sizes for that switch, ascending, into bucket_batch[0 .. return value): up to
// max_buckets (<= kMaxExpertGemmBatchBuckets) evenly spaced sizes from just above the fewest
// chunks `rows` rows can take (ceil(rows / chunk_rows)) to the bound (ExpertGemmBatchBound, the
// last), so a launch whose real chunks number c runs at most (bound - fewest) / max_buckets + 1
// dummies instead of bound - c.
inline int32_t ExpertGemmBatchBuckets(int64_t rows, int32_t num_slots, int32_t chunk_rows,
                                      int32_t max_buckets, int32_t* bucket_batch) {
  const int32_t bound = ExpertGemmBatchBound(rows, num_slots, chunk_rows);
  const int64_t fewest = std::max<int64_t>(1, (rows + chunk_rows - 1) / chunk_rows);
  const int64_t span = std::max<int64_t>(0, bound - fewest);
  const int32_t n = static_cast<int32_t>(
      std::max<int64_t>(1, std::min<int64_t>({max_buckets, kMaxExpertGemmBatchBuckets, span + 1})));
  int32_t count = 0;
  for (int32_t i = 0; i < n; ++i) {
    // fewest + ceil(span * (i + 1) / n): strictly ascending (n <= span + 1), the last = bound.
    const int32_t b = static_cast<int32_t>(fewest + (span * (i + 1) + n - 1) / n);
    if (count == 0 || b > bucket_batch[count - 1]) bucket_batch[count++] = b;
  }
  return count;
}

// One of the GEMMs sharing the row layout (gate_up and down): y = x · W_sᵀ per chunk.
struct ExpertGemmPlanGemm {
  const void* const* weights = nullptr;  // device [num_slots] pointers to [n, k] matrices
  const void* x = nullptr;               // device [rows, k]
  int64_t x_row_bytes = 0;               // bytes of one x row (k * element size)
  void* y = nullptr;                     // device [rows, n]
  int64_t y_row_bytes = 0;               // bytes of one y row
  const void* dummy_x = nullptr;         // device [chunk_rows, k], any values
  void* dummy_y = nullptr;               // device [chunk_rows, n], written with garbage
  // Output: device [3 * batch] pointers, the A (weights), B (x) and C (y) arrays one after the
  // other, as cublasGemmBatchedEx takes them.
  void** pointers = nullptr;
};

struct ExpertGemmPlanParams {
  int32_t num_slots = 0;                  // 1..kMaxMoeSlots
  const int32_t* slot_counts = nullptr;   // device [num_slots]
  const int32_t* slot_offsets = nullptr;  // device [num_slots + 1], multiples of chunk_rows
  int32_t chunk_rows = 0;
  int32_t batch = 0;      // entries to fill: ExpertGemmBatchBound for the launch's sizes
  int32_t num_gemms = 0;  // 1 or 2 entries of gemm[] to plan
  // false: the dummies after the last real chunk; true: spread between the real chunks.
  bool interleave_dummies = false;
  ExpertGemmPlanGemm gemm[2];
  // Optional, inside a CUDA graph only: a switch over batch sizes. With num_buckets > 0 (and
  // bucket_batch ascending, its last entry == batch), the entries are planned for the smallest
  // bucket_batch[i] >= the real chunk count (the last if none is), laid out [A | B | C] with
  // THAT batch, and the planner sets bucket_handle[g] to i for each planned GEMM g
  // (cudaGraphSetConditional): a switch node on that handle then runs the GEMM of batch
  // bucket_batch[i]. num_buckets = 0: `batch` entries, as above.
  int32_t num_buckets = 0;
  int32_t bucket_batch[kMaxExpertGemmBatchBuckets] = {};
  cudaGraphConditionalHandle bucket_handle[2] = {};
};

// One launch of one block on `stream`. The real chunks, chunk c of slot s in slot order, get
// A = weights[s], B = x + (slot_offsets[s] + c * chunk_rows) rows, C likewise in y. Without
// interleave_dummies they are entries 0 .. total - 1 and the rest are dummies (A = the first
// chunk's weights, B = dummy_x). With it, of D = batch - total dummies, entry j is a dummy iff
// floor((j + 1) D / batch) > floor(j D / batch), and takes A and B of the next real chunk (the
// last one at the end). No real chunk: every entry is a dummy with A = weights[0] (which must
// then be readable) and B = dummy_x. C of a dummy is always dummy_y. Chunks beyond `batch`
// (only if the counts break the bound, e.g. duplicate expert ids) are dropped: size `batch` with
// ExpertGemmBatchBound.
// cudaErrorInvalidValue for num_slots outside 1..kMaxMoeSlots, chunk_rows < 1, batch < 1,
// num_gemms outside 1..2, a null pointer, or buckets out of range, not ascending or not ending
// at batch.
cudaError_t PlanExpertGemmBatches(const ExpertGemmPlanParams& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_EXPERT_GEMM_PLAN_H_
