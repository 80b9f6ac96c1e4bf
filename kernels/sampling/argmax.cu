// Row argmax and log-sum-exp in two passes (see argmax.h). One partial serves both ops: (max,
// lowest index of the max, sum of exp(l - max)); ArgmaxRows leaves the sum 0.
#include <math.h>

#include <algorithm>
#include <cstdint>

#include "kernels/common/launch.cuh"
#include "kernels/sampling/argmax.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kPerThread = static_cast<int>(kArgmaxChunk / kThreads);  // 16 values
static_assert(kPerThread % 4 == 0, "a thread loads whole float4s");
constexpr int32_t kNoIndex = 0x7fffffff;

struct Partial {
  float max;    // -inf when nothing above -inf was seen
  int32_t arg;  // kNoIndex then
  double sum;   // sum of exp(l - max) over the values seen (0 for ArgmaxRows)
};
static_assert(sizeof(Partial) == 16, "workspace layout");

int64_t ChunksPerRow(int64_t vocab) { return (vocab + kArgmaxChunk - 1) / kArgmaxChunk; }

// p absorbs q: larger max wins, the lower index on equal maxima; sums rescale to the new max.
// Equal maxima (including both -inf, whose sums are 0) need no exp.
template <bool kSum>
__device__ __forceinline__ void Absorb(Partial* p, const Partial& q) {
  const bool q_wins = q.max > p->max || (q.max == p->max && q.arg < p->arg);
  if (kSum) {
    const float mx = q_wins ? q.max : p->max;
    const double sp = p->max == mx ? p->sum : p->sum * exp(static_cast<double>(p->max) - mx);
    const double sq = q.max == mx ? q.sum : q.sum * exp(static_cast<double>(q.max) - mx);
    p->sum = sp + sq;
  }
  if (q_wins) {
    p->max = q.max;
    p->arg = q.arg;
  }
}

template <bool kSum>
__device__ Partial ShuffleAbsorb(Partial p) {
  for (int o = 16; o > 0; o >>= 1) {
    Partial q;
    q.max = __shfl_xor_sync(0xffffffffu, p.max, o);
    q.arg = __shfl_xor_sync(0xffffffffu, p.arg, o);
    if (kSum) q.sum = __shfl_xor_sync(0xffffffffu, p.sum, o);
    Absorb<kSum>(&p, q);
  }
  return p;
}

// Pass 1: block (chunk, row) reduces logits[row, chunk * kArgmaxChunk, + kArgmaxChunk) into
// parts[row * chunks + chunk]. kVec: rows start 16-byte aligned and vocab % 4 == 0.
// Each thread holds its kPerThread values in registers: first the chunk's max and its lowest
// index (block reduction), then, with kSum, the sum of expf(v - chunk max) over the same
// registers in double, reduced over the block in a fixed order. No exp in the reductions.
template <bool kSum, bool kVec>
__device__ void ChunkPartialsBody(int64_t vocab, const float* logits, Partial* parts) {
  __shared__ Partial warp_part[kWarps];
  __shared__ double warp_sum[kWarps];
  __shared__ Partial chunk;
  const int64_t row = blockIdx.y;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kArgmaxChunk;
  const int64_t end = min(vocab, begin + kArgmaxChunk);
  const float* l = logits + row * vocab;
  // v[j] is the value at index Index(j), increasing in j; past the row's end, -inf.
  float v[kPerThread];
  const bool vec = kVec && end - begin == kArgmaxChunk;
  auto index = [&](int j) {
    return static_cast<int32_t>(vec ? begin + 4 * (threadIdx.x + (j / 4) * kThreads) + j % 4
                                    : begin + threadIdx.x + j * kThreads);
  };
  if (vec) {
    // Thread t reads float4s t, t + 256, ... of the chunk; every load issued before any use.
    const float4* l4 = reinterpret_cast<const float4*>(l + begin);
#pragma unroll
    for (int j = 0; j < kPerThread / 4; ++j) {
      const float4 x = l4[threadIdx.x + j * kThreads];
      v[4 * j] = x.x;
      v[4 * j + 1] = x.y;
      v[4 * j + 2] = x.z;
      v[4 * j + 3] = x.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      const int64_t i = begin + threadIdx.x + j * kThreads;
      v[j] = i < end ? l[i] : -INFINITY;
    }
  }
  // Max and its lowest index: a strict > over increasing indices, then the block.
  Partial p{-INFINITY, kNoIndex, 0.0};
#pragma unroll
  for (int j = 0; j < kPerThread; ++j) {
    if (v[j] > p.max) {
      p.max = v[j];
      p.arg = index(j);
    }
  }
  p = ShuffleAbsorb<false>(p);
  if ((threadIdx.x & 31) == 0) warp_part[threadIdx.x / 32] = p;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) Absorb<false>(&p, warp_part[w]);
    chunk = p;
  }
  __syncthreads();
  if (kSum) {
    // -inf values add nothing (and a chunk of only -inf must not compute exp(-inf - -inf)).
    const float mx = chunk.max;
    double sum = 0;
#pragma unroll
    for (int j = 0; j < kPerThread; ++j) {
      sum += v[j] == -INFINITY ? 0.0 : static_cast<double>(expf(v[j] - mx));
    }
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    if ((threadIdx.x & 31) == 0) warp_sum[threadIdx.x / 32] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
      double total = 0;
      for (int w = 0; w < kWarps; ++w) total += warp_sum[w];
      chunk.sum = total;
    }
  }
  if (threadIdx.x == 0) parts[row * gridDim.x + blockIdx.x] = chunk;
}

// Pass 2: one warp per row combines the row's chunk partials (lane c takes chunks c, c + 32,
// ...) and writes the token and, with kSum, its logprob.
// With `given` (TokenLogprobRowsF32), the logprob is that of given[row] and token is not written.
template <bool kSum>
__device__ void CombineBody(int64_t rows, int64_t vocab, int64_t chunks, const float* logits,
                            const Partial* parts, const int32_t* given, int32_t* token,
                            float* logprob) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  Partial p{-INFINITY, kNoIndex, 0.0};
  for (int64_t c = lane; c < chunks; c += 32) Absorb<kSum>(&p, parts[row * chunks + c]);
  p = ShuffleAbsorb<kSum>(p);
  if (lane == 0) {
    if (given != nullptr) {
      const int32_t t = given[row];
      const double log_z = static_cast<double>(p.max) + log(p.sum);
      logprob[row] = t < 0 || t >= vocab
                         ? NAN
                         : static_cast<float>(static_cast<double>(logits[row * vocab + t]) - log_z);
      return;
    }
    const int32_t arg = p.arg == kNoIndex ? 0 : p.arg;
    token[row] = arg;
    if (kSum) {
      const double log_z = static_cast<double>(p.max) + log(p.sum);
      logprob[row] = static_cast<float>(static_cast<double>(logits[row * vocab + arg]) - log_z);
    }
  }
}

template <bool kSum>
cudaError_t Launch(int64_t rows, int64_t vocab, const float* logits, void* workspace,
                   const int32_t* given, int32_t* token, float* logprob, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > 0x7fffffff) return cudaErrorInvalidValue;
  const int64_t chunks = ChunksPerRow(vocab);
  auto* parts = static_cast<Partial*>(workspace);
  // Rows go on grid.y (at most 65535 per launch).
  constexpr int64_t kMaxGridRows = 65535;
  constexpr int kRowsPerBlock = 8;  // warps of the combine block
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxGridRows) {
    const int64_t n = std::min(rows - r0, kMaxGridRows);
    const float* l = logits + r0 * vocab;
    Partial* pr = parts + r0 * chunks;
    const dim3 grid(static_cast<unsigned>(chunks), static_cast<unsigned>(n));
    cudaError_t e;
    if (vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0) {
      e = LaunchAfterPrecedingGrids<ChunkPartialsBody<kSum, true>, kThreads>(grid, 0, stream, vocab,
                                                                             l, pr);
    } else {
      e = LaunchAfterPrecedingGrids<ChunkPartialsBody<kSum, false>, kThreads>(grid, 0, stream,
                                                                              vocab, l, pr);
    }
    if (e != cudaSuccess) return e;
    const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
    e = LaunchAfterPrecedingGrids<CombineBody<kSum>, kRowsPerBlock * 32>(
        blocks, 0, stream, n, vocab, chunks, l, pr, given != nullptr ? given + r0 : nullptr,
        token != nullptr ? token + r0 : nullptr, kSum ? logprob + r0 : nullptr);
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace

size_t ArgmaxWorkspaceBytes(int64_t rows, int64_t vocab) {
  if (rows <= 0 || vocab <= 0) return 0;
  return static_cast<size_t>(rows * ChunksPerRow(vocab)) * sizeof(Partial);
}

cudaError_t ArgmaxRowsF32(int64_t rows, int64_t vocab, const float* logits, void* workspace,
                          int32_t* out, cudaStream_t stream) {
  return Launch<false>(rows, vocab, logits, workspace, nullptr, out, nullptr, stream);
}

cudaError_t GreedySampleRowsF32(int64_t rows, int64_t vocab, const float* logits, void* workspace,
                                int32_t* token, float* logprob, cudaStream_t stream) {
  return Launch<true>(rows, vocab, logits, workspace, nullptr, token, logprob, stream);
}

cudaError_t TokenLogprobRowsF32(int64_t rows, int64_t vocab, const float* logits, void* workspace,
                                const int32_t* token, float* logprob, cudaStream_t stream) {
  return Launch<true>(rows, vocab, logits, workspace, token, nullptr, logprob, stream);
}

}  // namespace kernels
}  // namespace deepinfer
