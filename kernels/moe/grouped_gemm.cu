// Decode-shaped grouped GEMM on CUDA cores. Grid: x = tiles of kRowsPerBlock weight rows (output
// features), y = the j-th NON-EMPTY slot, j < min(num_slots, max_rows) (a slot is found from
// the device offsets by warp 0; blocks past the last non-empty slot exit). So with one token
// and top-6, only 6 columns of blocks do work, whatever num_slots is.
//
// Inside a block each warp owns kRowsPerWarp weight rows and streams them once per row tile:
// every lane loads 16 bytes (8 bf16) of each row per step, converts them to fp32 (a shift) and
// multiplies them with the matching 8 floats of each x row of the tile (x rows come through
// L1, shared by the block's warps). Rows of a slot are processed in tiles of 8/4/2/1 so that
// a slot with m rows streams its weights ceil(m / 8) times (later passes hit L2), and the
// accumulators stay in registers.
#include "kernels/moe/grouped_gemm.h"

#include <algorithm>

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerWarp = 2;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kUnroll = 2;  // 16-byte weight loads in flight per lane and weight row

__device__ __forceinline__ void Bf16x8ToFloat(const uint4& v, float f[8]) {
  const unsigned u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = __uint_as_float(u[i] << 16);
    f[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
  }
}

// Rows [row0, row0 + valid) of x (valid <= MT; missing rows re-read the last valid one and are
// not stored) times the warp's weight rows w[j] (j < kRowsPerWarp; store only if n_ok[j]).
template <int MT>
__device__ __forceinline__ void RowTile(const float* x, int64_t row0, int valid, int k,
                                        const uint4* const w[kRowsPerWarp],
                                        const bool n_ok[kRowsPerWarp], int64_t n_first, int n,
                                        float* y) {
  const int lane = threadIdx.x % 32;
  const int kv = k / 8;
  const float4* xr[MT];
#pragma unroll
  for (int r = 0; r < MT; ++r) {
    xr[r] = reinterpret_cast<const float4*>(x + (row0 + min(r, valid - 1)) * int64_t{k});
  }
  float acc[MT][kRowsPerWarp];
#pragma unroll
  for (int r = 0; r < MT; ++r)
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) acc[r][j] = 0.0f;

  for (int v0 = lane; v0 < kv; v0 += 32 * kUnroll) {
    uint4 wv[kUnroll][kRowsPerWarp];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * 32;
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) {
        wv[u][j] = v < kv ? __ldg(w[j] + v) : make_uint4(0, 0, 0, 0);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int v = v0 + u * 32;
      if (v >= kv) break;
      float wf[kRowsPerWarp][8];
#pragma unroll
      for (int j = 0; j < kRowsPerWarp; ++j) Bf16x8ToFloat(wv[u][j], wf[j]);
#pragma unroll
      for (int r = 0; r < MT; ++r) {
        const float4 a = __ldg(xr[r] + 2 * v), b = __ldg(xr[r] + 2 * v + 1);
#pragma unroll
        for (int j = 0; j < kRowsPerWarp; ++j) {
          float s = acc[r][j];
          s = fmaf(a.x, wf[j][0], s);
          s = fmaf(a.y, wf[j][1], s);
          s = fmaf(a.z, wf[j][2], s);
          s = fmaf(a.w, wf[j][3], s);
          s = fmaf(b.x, wf[j][4], s);
          s = fmaf(b.y, wf[j][5], s);
          s = fmaf(b.z, wf[j][6], s);
          s = fmaf(b.w, wf[j][7], s);
          acc[r][j] = s;
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < MT; ++r) {
#pragma unroll
    for (int j = 0; j < kRowsPerWarp; ++j) {
      float s = acc[r][j];
#pragma unroll
      for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
      // Every lane holds the sum; spread the stores over lanes.
      if (r < valid && n_ok[j] && lane == (r * kRowsPerWarp + j) % 32) {
        y[(row0 + r) * int64_t{n} + n_first + j] = s;
      }
    }
  }
}

// kMaxTile bounds the row tile: larger tiles re-stream the weights less often for big slots but
// need more registers (fewer resident warps), so decode with one row per slot uses kMaxTile 1.
template <int kMaxTile>
__global__ void __launch_bounds__(kThreads) GroupedGemmBf16Kernel(GroupedGemmBf16Params p) {
  // This block serves the blockIdx.y-th non-empty slot: its index and rows [begin, end).
  __shared__ int work[3];
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int seen = 0;
    bool found = false;
    for (int base = 0; base < p.num_slots && !found; base += 32) {
      const int s = base + lane;
      int b = 0, e = 0;
      if (s < p.num_slots) {
        b = min(p.slot_offsets[s], p.max_rows);
        e = min(p.slot_offsets[s + 1], p.max_rows);
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
  const int slot = work[0], row_begin = work[1], row_end = work[2];
  if (row_begin >= row_end) return;

  const int warp = threadIdx.x / 32;
  const int64_t n_first = int64_t{blockIdx.x} * kRowsPerBlock + warp * kRowsPerWarp;
  if (n_first >= p.n) return;
  const uint4* w[kRowsPerWarp];
  bool n_ok[kRowsPerWarp];
  const uint16_t* weights = p.weights[slot];
#pragma unroll
  for (int j = 0; j < kRowsPerWarp; ++j) {
    n_ok[j] = n_first + j < p.n;
    // A row past n re-reads the last row (in bounds) and is not stored.
    const int64_t row = min(n_first + j, int64_t{p.n} - 1);
    w[j] = reinterpret_cast<const uint4*>(weights + row * p.k);
  }
  for (int row0 = row_begin; row0 < row_end;) {
    const int rest = row_end - row0;
    if (kMaxTile >= 8 && rest >= 5) {
      RowTile<kMaxTile >= 8 ? 8 : 1>(p.x, row0, min(rest, 8), p.k, w, n_ok, n_first, p.n, p.y);
      row0 += min(rest, 8);
    } else if (kMaxTile >= 4 && rest >= 3) {
      RowTile<kMaxTile >= 4 ? 4 : 1>(p.x, row0, min(rest, 4), p.k, w, n_ok, n_first, p.n, p.y);
      row0 += min(rest, 4);
    } else if (kMaxTile >= 2 && rest >= 2) {
      RowTile<kMaxTile >= 2 ? 2 : 1>(p.x, row0, 2, p.k, w, n_ok, n_first, p.n, p.y);
      row0 += 2;
    } else {
      RowTile<1>(p.x, row0, 1, p.k, w, n_ok, n_first, p.n, p.y);
      row0 += 1;
    }
  }
}

}  // namespace

cudaError_t GroupedGemmBf16(const GroupedGemmBf16Params& p, cudaStream_t stream) {
  if (p.num_slots <= 0 || p.n <= 0 || p.k <= 0 || p.k % 8 != 0 || p.max_rows < 0 ||
      reinterpret_cast<uintptr_t>(p.x) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  if (p.max_rows == 0) return cudaSuccess;
  const int64_t n_blocks = (int64_t{p.n} + kRowsPerBlock - 1) / kRowsPerBlock;
  const int64_t slot_blocks = std::min<int64_t>(p.num_slots, p.max_rows);
  if (n_blocks > 0x7fffffff || slot_blocks > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(n_blocks), static_cast<unsigned>(slot_blocks));
  const int hint = p.rows_per_slot_hint > 0 ? p.rows_per_slot_hint : p.max_rows;
  if (hint <= 1) {
    GroupedGemmBf16Kernel<1><<<grid, kThreads, 0, stream>>>(p);
  } else if (hint <= 2) {
    GroupedGemmBf16Kernel<2><<<grid, kThreads, 0, stream>>>(p);
  } else if (hint <= 4) {
    GroupedGemmBf16Kernel<4><<<grid, kThreads, 0, stream>>>(p);
  } else {
    GroupedGemmBf16Kernel<8><<<grid, kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
