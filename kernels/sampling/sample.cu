// Device sampling: one block of 512 threads per row runs kernels/sampling/sample_row.h (the
// algorithm, shared with a host test) with BlockOf512: reductions over the block in a fixed
// order (each thread's strided values, a warp butterfly, then the warps in order), so a row's
// result does not change from run to run.
//
// Cost per row (V = vocab), each pass a read of the row with 8 loads in flight per thread:
// greedy 2 passes (the maximum, the log-softmax normaliser); with a temperature 3 (the
// normaliser and the temperature's z share a pass; at T = 1 without top-k z is the
// normaliser's sum), plus a radix select for top-k < V (counting; its first digit counted in
// the maximum's pass) and one for top-p < 1 (its first digit guessed from the z pass, then a
// double exp for each token still in the running and within 40 of the top in l / T): at most
// 7 digit passes each (a wrong top-p guess adds one and the first digit's), ending with one
// pass that gathers the chosen bin's tokens into shared memory once it holds at most
// sample_row::kGather (512).
#include <math.h>

#include "kernels/common/launch.cuh"
#include "kernels/sampling/sample.h"
#include "kernels/sampling/sample_row.h"

namespace deepinfer {
namespace kernels {
namespace {

using sample_row::u64;

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

struct SumOp {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxOp {
  __device__ u64 operator()(u64 a, u64 b) const { return a > b ? a : b; }
};

// Block-wide reduction; every thread gets the result. s holds kWarps + 1 values.
template <typename T, typename Op>
__device__ T BlockReduce(T v, T* s, Op op) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // everyone has read the previous result out of s
  if ((threadIdx.x & 31) == 0) s[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    T t = s[0];
    for (int w = 1; w < kWarps; ++w) t = op(t, s[w]);
    s[kWarps] = t;
  }
  __syncthreads();
  return s[kWarps];
}

__device__ __forceinline__ bool RaceBetter(double v, u64 r, double best, u64 rank) {
  return v > best || (v == best && r > rank);
}

// The Block of sample_row.h for kThreads threads; the arrays are the kernel's shared memory.
// Its functions are __host__ __device__ only so that the shared templates instantiate; they
// run on the device alone.
struct BlockOf512 {
  u64* su;             // [kWarps + 1]
  double* sd;          // [kWarps + 1]
  double* rv;          // [kWarps + 1]
  u64* rr;             // [kWarps + 1]
  u64* hist;           // [sample_row::kBins]
  unsigned* count;     // [sample_row::kBins]
  u64* found;          // [2]: Crossing's result
  unsigned* gathered;  // [1]
  u64* gather_key;     // [sample_row::kGather]
  u64* gather_f;       // [sample_row::kGather]

  DEEPINFER_HOST_DEVICE int64_t first() const {
#if defined(__CUDA_ARCH__)
    return threadIdx.x;
#else
    return 0;
#endif
  }
  DEEPINFER_HOST_DEVICE int64_t step() const { return kThreads; }
  DEEPINFER_HOST_DEVICE bool leader() const { return first() == 0; }
  DEEPINFER_HOST_DEVICE double SumD(double v) {
#if defined(__CUDA_ARCH__)
    return BlockReduce(v, sd, SumOp());
#else
    return v;
#endif
  }
  DEEPINFER_HOST_DEVICE u64 SumU(u64 v) {
#if defined(__CUDA_ARCH__)
    return BlockReduce(v, su, SumOp());
#else
    return v;
#endif
  }
  DEEPINFER_HOST_DEVICE u64 MaxU(u64 v) {
#if defined(__CUDA_ARCH__)
    return BlockReduce(v, su, MaxOp());
#else
    return v;
#endif
  }
  DEEPINFER_HOST_DEVICE void HistClear() {
#if defined(__CUDA_ARCH__)
    __syncthreads();  // everyone has read the previous histogram
    for (int i = threadIdx.x; i < sample_row::kBins; i += kThreads) hist[i] = count[i] = 0;
    __syncthreads();
#endif
  }
  // The warp's lanes with the same bin sum their values and the lowest of them adds the sum
  // with one shared-memory atomic: the first digits put most of the row into a few bins, where
  // one atomic per lane would serialise. From sm_80 the groups come from __match_any_sync and
  // sum exactly with __reduce_add_sync on three 22-bit slices of v (32 lanes of 2^22 fit in 32
  // bits); before, one round of warp shuffles per distinct bin.
  DEEPINFER_HOST_DEVICE void HistAdd(int bin, u64 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned active = __ballot_sync(0xffffffffu, bin >= 0);
    if (bin >= 0) {
      const unsigned peers = __match_any_sync(active, bin);
      constexpr u64 kSlice = (u64{1} << 22) - 1;
      const u64 lo = __reduce_add_sync(peers, static_cast<unsigned>(v & kSlice));
      const u64 mid = __reduce_add_sync(peers, static_cast<unsigned>((v >> 22) & kSlice));
      const u64 hi = __reduce_add_sync(peers, static_cast<unsigned>(v >> 44));
      if ((threadIdx.x & 31) == static_cast<unsigned>(__ffs(peers) - 1)) {
        atomicAdd(&hist[bin], lo + (mid << 22) + (hi << 44));
        atomicAdd(&count[bin], static_cast<unsigned>(__popc(peers)));
      }
    }
#elif defined(__CUDA_ARCH__)
    const int lane = threadIdx.x & 31;
    unsigned pending = __ballot_sync(0xffffffffu, bin >= 0);
    while (pending != 0) {
      const int leader = __ffs(pending) - 1;
      const int lead_bin = __shfl_sync(0xffffffffu, bin, leader);
      const bool mine = bin == lead_bin;
      u64 x = mine ? v : 0;
      for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
      const unsigned group = __ballot_sync(0xffffffffu, mine);
      if (lane == leader) {
        atomicAdd(&hist[lead_bin], x);
        atomicAdd(&count[lead_bin], static_cast<unsigned>(__popc(group)));
      }
      pending &= ~group;
    }
#else
    (void)bin;
    (void)v;
#endif
  }
  DEEPINFER_HOST_DEVICE void HistDone() {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }
  DEEPINFER_HOST_DEVICE uint32_t Count(int bin) const { return count[bin]; }
  DEEPINFER_HOST_DEVICE void GatherClear() {
#if defined(__CUDA_ARCH__)
    __syncthreads();  // everyone has read the previous list
    if (threadIdx.x == 0) *gathered = 0;
    __syncthreads();
#endif
  }
  // The slot order depends on timing; readers use the list as a set.
  DEEPINFER_HOST_DEVICE void Gather(u64 key, u64 f) {
#if defined(__CUDA_ARCH__)
    const unsigned slot = atomicAdd(gathered, 1u);
    if (slot < sample_row::kGather) {
      gather_key[slot] = key;
      gather_f[slot] = f;
    }
#else
    (void)key;
    (void)f;
#endif
  }
  DEEPINFER_HOST_DEVICE void GatherDone() {
#if defined(__CUDA_ARCH__)
    __syncthreads();
#endif
  }
  DEEPINFER_HOST_DEVICE u64 GatheredKey(int64_t j) const { return gather_key[j]; }
  DEEPINFER_HOST_DEVICE u64 GatheredF(int64_t j) const { return gather_f[j]; }
  // Warp 0 scans: lane j sums the bins 255 - 8j down to 248 - 8j, a warp prefix sum of those
  // (from the top bin down) finds the lane where *cum reaches target, and that lane walks its
  // eight bins. Integer sums: the same result as a serial scan.
  DEEPINFER_HOST_DEVICE int Crossing(u64 target, u64* cum) {
#if defined(__CUDA_ARCH__)
    static_assert(sample_row::kBins == 8 * 32, "one warp of eight bins a lane");
    if (threadIdx.x < 32) {
      const int lane = threadIdx.x;
      const int high = sample_row::kBins - 1 - 8 * lane;
      u64 own = 0;
      for (int j = 0; j < 8; ++j) own += hist[high - j];
      u64 incl = own;  // the lanes up to this one
      for (int o = 1; o < 32; o <<= 1) {
        const u64 x = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl += x;
      }
      // The first lane that reaches target, or the last (then no bin does: d = -1).
      const unsigned reach = __ballot_sync(0xffffffffu, *cum + incl >= target);
      if (lane == (reach == 0 ? 31 : __ffs(reach) - 1)) {
        int d = -1;
        u64 c = *cum + incl - own;
        for (int j = 0; j < 8; ++j) {
          if (c + hist[high - j] >= target) {
            d = high - j;
            break;
          }
          c += hist[high - j];
        }
        found[0] = static_cast<u64>(static_cast<int64_t>(d));
        found[1] = c;
      }
    }
    __syncthreads();
    *cum = found[1];
    return static_cast<int>(static_cast<int64_t>(found[0]));
#else
    (void)target;
    (void)cum;
    return -1;
#endif
  }
  DEEPINFER_HOST_DEVICE void RaceMax(double* best, u64* rank) {
#if defined(__CUDA_ARCH__)
    double b = *best;
    u64 r = *rank;
    for (int o = 16; o > 0; o >>= 1) {
      const double ob = __shfl_xor_sync(0xffffffffu, b, o);
      const u64 orank = __shfl_xor_sync(0xffffffffu, r, o);
      if (RaceBetter(ob, orank, b, r)) {
        b = ob;
        r = orank;
      }
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
      rv[threadIdx.x / 32] = b;
      rr[threadIdx.x / 32] = r;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kWarps; ++w) {
        if (RaceBetter(rv[w], rr[w], b, r)) {
          b = rv[w];
          r = rr[w];
        }
      }
      rv[kWarps] = b;
      rr[kWarps] = r;
    }
    __syncthreads();
    *best = rv[kWarps];
    *rank = rr[kWarps];
#else
    (void)best;
    (void)rank;
#endif
  }
};

__device__ void SampleRowsBody(int64_t vocab, const float* logits, const RowSamplingParams* params,
                               int32_t* token, float* logprob) {
  __shared__ u64 su[kWarps + 1];
  __shared__ double sd[kWarps + 1];
  __shared__ double rv[kWarps + 1];
  __shared__ u64 rr[kWarps + 1];
  __shared__ u64 hist[sample_row::kBins];
  __shared__ unsigned count[sample_row::kBins];
  __shared__ u64 found[2];
  __shared__ unsigned gathered;
  __shared__ u64 gather_key[sample_row::kGather];
  __shared__ u64 gather_f[sample_row::kGather];
  BlockOf512 block{su, sd, rv, rr, hist, count, found, &gathered, gather_key, gather_f};
  const int64_t row = blockIdx.x;
  const RowSamplingParams p = params[row];
  float lp;
  const int32_t tok = sample_row::SampleRow(block, logits + row * vocab, vocab, p, &lp);
  if (threadIdx.x == 0) {
    token[row] = tok;
    logprob[row] = lp;
  }
}

__device__ void TopLogprobsBody(int64_t vocab, const float* logits, int32_t n, int32_t* ids,
                                float* logprobs) {
  __shared__ u64 su[kWarps + 1];
  __shared__ double sd[kWarps + 1];
  BlockOf512 block{su, sd, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr};
  const int64_t row = blockIdx.x;
  sample_row::TopLogprobsRow(block, logits + row * vocab, vocab, n, ids + row * n,
                             logprobs + row * n);
}

}  // namespace

cudaError_t SampleRowsF32(int64_t rows, int64_t vocab, const float* logits,
                          const RowSamplingParams* params, int32_t* token, float* logprob,
                          cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchAfterPrecedingGrids<SampleRowsBody, kThreads>(static_cast<unsigned>(rows), 0, stream,
                                                             vocab, logits, params, token, logprob);
}

cudaError_t TopLogprobsF32(int64_t rows, int64_t vocab, const float* logits, int32_t n,
                           int32_t* ids, float* logprobs, cudaStream_t stream) {
  if (n < 1 || n > kMaxTopLogprobs) return cudaErrorInvalidValue;
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  return LaunchAfterPrecedingGrids<TopLogprobsBody, kThreads>(
      static_cast<unsigned>(rows), 0, stream, vocab, logits, n, ids, logprobs);
}

}  // namespace kernels
}  // namespace deepinfer
