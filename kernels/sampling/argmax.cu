// Row argmax and log-sum-exp in two passes (see argmax.h). One reduction serves both ops: a
// partial is (max, lowest index of the max, sum of exp(l - max)); ArgmaxRows leaves the sum 0.
#include <math.h>

#include <algorithm>
#include <cstdint>

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

// One value at index i, visited in increasing i by this thread: a strict > keeps the lowest
// index. -inf adds nothing to the sum (and must not: exp(-inf - -inf) is NaN).
template <bool kSum>
__device__ __forceinline__ void Visit(Partial* p, float v, int32_t i) {
  if (v > p->max) {
    if (kSum) p->sum = p->sum * static_cast<double>(expf(p->max - v)) + 1.0;
    p->max = v;
    p->arg = i;
  } else if (kSum && v != -INFINITY) {
    p->sum += static_cast<double>(expf(v - p->max));
  }
}

template <bool kSum>
__device__ Partial ShuffleAbsorb(Partial p) {
  for (int o = 16; o > 0; o >>= 1) {
    Partial q;
    q.max = __shfl_xor_sync(0xffffffffu, p.max, o);
    q.arg = __shfl_xor_sync(0xffffffffu, p.arg, o);
    q.sum = __shfl_xor_sync(0xffffffffu, p.sum, o);
    Absorb<kSum>(&p, q);
  }
  return p;
}

// Pass 1: block (chunk, row) reduces logits[row, chunk * kArgmaxChunk, + kArgmaxChunk) into
// parts[row * chunks + chunk]. kVec: rows start 16-byte aligned and vocab % 4 == 0.
template <bool kSum, bool kVec>
__global__ void ChunkPartialsKernel(int64_t vocab, const float* logits, Partial* parts) {
  __shared__ Partial warp_part[kWarps];
  const int64_t row = blockIdx.y;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kArgmaxChunk;
  const int64_t end = min(vocab, begin + kArgmaxChunk);
  const float* l = logits + row * vocab;
  Partial p{-INFINITY, kNoIndex, 0.0};
  if (kVec && end - begin == kArgmaxChunk) {
    // Every load issued before any is used; thread t reads float4s t, t + 256, ... of the chunk,
    // so its indices still increase.
    float4 v[kPerThread / 4];
    const float4* l4 = reinterpret_cast<const float4*>(l + begin);
#pragma unroll
    for (int j = 0; j < kPerThread / 4; ++j) v[j] = l4[threadIdx.x + j * kThreads];
#pragma unroll
    for (int j = 0; j < kPerThread / 4; ++j) {
      const int32_t i = static_cast<int32_t>(begin + 4 * (threadIdx.x + j * kThreads));
      Visit<kSum>(&p, v[j].x, i);
      Visit<kSum>(&p, v[j].y, i + 1);
      Visit<kSum>(&p, v[j].z, i + 2);
      Visit<kSum>(&p, v[j].w, i + 3);
    }
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) {
      Visit<kSum>(&p, l[i], static_cast<int32_t>(i));
    }
  }
  p = ShuffleAbsorb<kSum>(p);
  if ((threadIdx.x & 31) == 0) warp_part[threadIdx.x / 32] = p;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) Absorb<kSum>(&p, warp_part[w]);
    parts[row * gridDim.x + blockIdx.x] = p;
  }
}

// Pass 2: one warp per row combines the row's chunk partials (lane c takes chunks c, c + 32,
// ...) and writes the token and, with kSum, its logprob.
template <bool kSum>
__global__ void CombineKernel(int64_t rows, int64_t vocab, int64_t chunks, const float* logits,
                              const Partial* parts, int32_t* token, float* logprob) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x & 31;
  Partial p{-INFINITY, kNoIndex, 0.0};
  for (int64_t c = lane; c < chunks; c += 32) Absorb<kSum>(&p, parts[row * chunks + c]);
  p = ShuffleAbsorb<kSum>(p);
  if (lane == 0) {
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
                   int32_t* token, float* logprob, cudaStream_t stream) {
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
    if (vocab % 4 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0) {
      ChunkPartialsKernel<kSum, true><<<grid, kThreads, 0, stream>>>(vocab, l, pr);
    } else {
      ChunkPartialsKernel<kSum, false><<<grid, kThreads, 0, stream>>>(vocab, l, pr);
    }
    const unsigned blocks = static_cast<unsigned>((n + kRowsPerBlock - 1) / kRowsPerBlock);
    CombineKernel<kSum><<<blocks, kRowsPerBlock * 32, 0, stream>>>(
        n, vocab, chunks, l, pr, token + r0, kSum ? logprob + r0 : nullptr);
  }
  return cudaGetLastError();
}

}  // namespace

size_t ArgmaxWorkspaceBytes(int64_t rows, int64_t vocab) {
  if (rows <= 0 || vocab <= 0) return 0;
  return static_cast<size_t>(rows * ChunksPerRow(vocab)) * sizeof(Partial);
}

cudaError_t ArgmaxRowsF32(int64_t rows, int64_t vocab, const float* logits, void* workspace,
                          int32_t* out, cudaStream_t stream) {
  return Launch<false>(rows, vocab, logits, workspace, out, nullptr, stream);
}

cudaError_t GreedySampleRowsF32(int64_t rows, int64_t vocab, const float* logits, void* workspace,
                                int32_t* token, float* logprob, cudaStream_t stream) {
  return Launch<true>(rows, vocab, logits, workspace, token, logprob, stream);
}

}  // namespace kernels
}  // namespace deepinfer
