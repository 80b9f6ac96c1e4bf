// One block of kMaxMoeSlots threads: thread s holds slot s's chunk count, an inclusive scan in
// shared memory gives each slot its first entry, then the threads fill the entries, each
// finding its slot by binary search in the scan.
#include "kernels/moe/expert_gemm_plan.h"
#include "kernels/moe/moe_permute.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = kMaxMoeSlots;

__global__ void __launch_bounds__(kThreads) PlanKernel(ExpertGemmPlanParams p) {
  __shared__ int32_t end_entry[kThreads];  // inclusive scan of the chunk counts
  const int s = threadIdx.x;
  const int C = p.chunk_rows;
  end_entry[s] = s < p.num_slots ? (max(p.slot_counts[s], 0) + C - 1) / C : 0;
  __syncthreads();
  for (int d = 1; d < kThreads; d *= 2) {
    const int add = s >= d ? end_entry[s - d] : 0;
    __syncthreads();
    end_entry[s] += add;
    __syncthreads();
  }
  const int total = end_entry[kThreads - 1];
  // The weights of entry 0 (first busy slot), or slot 0's, for the dummies.
  int first_slot = 0;
  if (total > 0) {
    int lo = 0, hi = kThreads - 1;  // first slot with end_entry > 0
    while (lo < hi) {
      const int mid = (lo + hi) / 2;
      if (end_entry[mid] > 0)
        hi = mid;
      else
        lo = mid + 1;
    }
    first_slot = lo;
  }
  const int batch = p.batch;
  // Dummies spread evenly: d_before(j) = floor(j D / batch) of them sit before entry j.
  const int dummies = total < batch ? batch - total : 0;
  for (int j = s; j < batch; j += kThreads) {
    // The real chunk whose pointers entry j takes (a dummy: the next one), and whether j is a
    // dummy.
    int chunk = j;
    bool dummy = j >= total;
    if (dummies > 0) {
      const long long before = static_cast<long long>(j) * dummies / batch;
      const long long through = static_cast<long long>(j + 1) * dummies / batch;
      chunk = min(j - static_cast<int>(before), total - 1);
      dummy = through > before;
    }
    int slot = -1, row = 0;
    if (chunk >= 0 && chunk < total) {
      int lo = 0, hi = kThreads - 1;  // first slot with end_entry > chunk
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (end_entry[mid] > chunk)
          hi = mid;
        else
          lo = mid + 1;
      }
      slot = lo;
      const int first = slot > 0 ? end_entry[slot - 1] : 0;
      row = p.slot_offsets[slot] + (chunk - first) * C;
    }
    for (int gi = 0; gi < p.num_gemms; ++gi) {
      const ExpertGemmPlanGemm& g = p.gemm[gi];
      const void** a = const_cast<const void**>(g.pointers);
      if (slot >= 0) {
        a[j] = g.weights[slot];
        a[batch + j] = static_cast<const char*>(g.x) + row * g.x_row_bytes;
      } else {
        a[j] = g.weights[first_slot];
        a[batch + j] = g.dummy_x;
      }
      g.pointers[2 * batch + j] = dummy ? g.dummy_y : static_cast<char*>(g.y) + row * g.y_row_bytes;
    }
  }
}

}  // namespace

cudaError_t PlanExpertGemmBatches(const ExpertGemmPlanParams& p, cudaStream_t stream) {
  if (p.num_slots < 1 || p.num_slots > kMaxMoeSlots || p.chunk_rows < 1 || p.batch < 1 ||
      p.num_gemms < 1 || p.num_gemms > 2 || p.slot_counts == nullptr || p.slot_offsets == nullptr) {
    return cudaErrorInvalidValue;
  }
  for (int gi = 0; gi < p.num_gemms; ++gi) {
    const ExpertGemmPlanGemm& g = p.gemm[gi];
    if (g.weights == nullptr || g.x == nullptr || g.y == nullptr || g.dummy_x == nullptr ||
        g.dummy_y == nullptr || g.pointers == nullptr) {
      return cudaErrorInvalidValue;
    }
  }
  PlanKernel<<<1, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
