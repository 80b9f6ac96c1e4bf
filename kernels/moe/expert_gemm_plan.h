// Device-planned chunked expert GEMMs: the pointer arrays of a cublasGemmBatchedEx call with a
// FIXED batch count, computed on the device from the per-slot row counts that MoePermuteF32
// left there, so the expert GEMMs of a decode step need no host synchronisation and can be
// captured in a CUDA graph (ExpertGemmsCublas kChunked copies the counts to the host instead).
// Each slot's rows (padded layout, MoePermuteParams::row_align = chunk_rows) are cut into chunks
// of chunk_rows rows; the entries the real chunks do not fill are "dummies" that write a dummy
// output nobody reads, spread evenly between the real chunks, each a copy of its neighbouring
// chunk's weights and x (read at about the same time, so from L2; measured faster than all
// dummies after the last chunk). docs/kernels/moe-decode.md has the measurements.
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
  ExpertGemmPlanGemm gemm[2];
};

// One launch of one block on `stream`. The real chunks, chunk c of slot s in slot order, get
// A = weights[s], B = x + (slot_offsets[s] + c * chunk_rows) rows, C likewise in y. Of D =
// batch - total dummies, entry j is a dummy iff floor((j + 1) D / batch) > floor(j D / batch),
// and takes A and B of the next real chunk (the last one at the end). No real chunk: every entry
// is a dummy with A = weights[0] (which must then be readable) and B = dummy_x. C of a dummy is
// always dummy_y. Chunks beyond `batch` (only if the counts break the bound, e.g. duplicate
// expert ids) are dropped: size `batch` with ExpertGemmBatchBound.
// cudaErrorInvalidValue for num_slots outside 1..kMaxMoeSlots, chunk_rows < 1, batch < 1,
// num_gemms outside 1..2 or a null pointer.
cudaError_t PlanExpertGemmBatches(const ExpertGemmPlanParams& params, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_EXPERT_GEMM_PLAN_H_
