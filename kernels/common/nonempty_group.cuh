// FindNonEmptyGroup: the grouped kernels' way of giving each block row one non-empty group of
// rows, from group offsets in device memory (the MoE permutation's slot offsets), so that a
// decode step with a few busy experts launches blocks for those only and never reads the routing
// on the host. Include only from .cu files.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// The block serves the blockIdx.y-th non-empty group of offsets[0 .. num_groups] (each clamped
// to max_rows): warp 0 finds it and leaves {group, first row, end row} in work (end <= first: no
// such group, the block has nothing to do). Ends with __syncthreads().
__device__ __forceinline__ void FindNonEmptyGroup(int num_groups, int max_rows,
                                                  const int32_t* offsets, int work[3]) {
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int seen = 0;
    bool found = false;
    for (int base = 0; base < num_groups && !found; base += 32) {
      const int s = base + lane;
      int b = 0, e = 0;
      if (s < num_groups) {
        b = min(offsets[s], max_rows);
        e = min(offsets[s + 1], max_rows);
      }
      const unsigned nonempty = __ballot_sync(0xffffffffu, e > b);
      const int rank = static_cast<int>(blockIdx.y) - seen;
      if (rank < __popc(nonempty)) {
        found = true;
        if (e > b && __popc(nonempty & ((1u << lane) - 1u)) == rank) {
          work[0] = s;
          work[1] = b;
          work[2] = e;
        }
      }
      seen += __popc(nonempty);
    }
    if (!found && lane == 0) work[1] = work[2] = 0;
  }
  __syncthreads();
}

}  // namespace kernels
}  // namespace deepinfer
