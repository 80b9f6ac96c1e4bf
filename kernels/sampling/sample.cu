// Device sampling: one block per row. Where Sampler sorts the row (top-k, top-p), the kernel
// instead bisects over 64-bit candidate keys that order tokens exactly as Sampler's sort does
// (logit descending, then id ascending), each bisection step one block-wide reduction over the
// row: the top-k cut is the largest key c with #{key >= c} >= k, the top-p cut the largest c
// with mass{key >= c} >= top_p. No scratch memory, no sort, and every reduction runs in a fixed
// order, so a row's result does not change from run to run.
//
// Cost per row (V = vocab, 512 threads): 2 passes for the log-softmax normaliser, +1 for the
// temperature normaliser and +1 for the race; +64 counting passes with top-k; +64 passes with a
// double exp each with top-p. Correctness first: a faster top-p (a per-block radix select
// with a histogram of probability mass) is future work once this has run on a GPU.
#include <math.h>

#include "kernels/sampling/sample.h"
#include "worker/sampling/counter_rng.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
using u64 = unsigned long long;

// Candidate order as a number: a larger key is an earlier candidate. High half: the logit's bits
// mapped to an unsigned integer that sorts like the float (-0 taken as +0, as == does); low
// half: the complemented id, so a lower id is larger. A non-NaN logit's key is never 0.
__device__ __forceinline__ u64 Key(float v, int64_t i) {
  if (v == 0.0f) v = 0.0f;
  uint32_t u = __float_as_uint(v);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<u64>(u) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

__device__ __forceinline__ int32_t IdOfKey(u64 k) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(k));
}

struct Sum {
  template <typename T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct Max {
  __device__ u64 operator()(u64 a, u64 b) const { return a > b ? a : b; }
};

// Block-wide reduction in a fixed order (each thread's strided values, a warp butterfly, then
// the warps in order); every thread gets the result. s holds kWarps + 1 values.
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

// The largest c in [lo, 2^64) with pred(c), for pred true at lo and monotone (true, then false).
// pred must be uniform over the block (it is a block reduction).
template <typename Pred>
__device__ u64 LargestWith(u64 lo, Pred pred) {
  u64 hi = ~0ull;
  while (lo < hi) {
    const u64 mid = lo + (hi - lo) / 2 + 1;  // in (lo, hi], no overflow
    if (pred(mid)) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

struct RowNormaliser {
  u64 max_key;   // the row's largest key: its argmax, lowest id on ties
  double log_z;  // logsumexp of the raw row
};

// As Sampler: the maximum, then the sum of exp(l - max) in double.
__device__ RowNormaliser Normalise(const float* l, int64_t vocab, u64* su, double* sd) {
  u64 k = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
    const u64 ki = Key(l[i], i);
    k = ki > k ? ki : k;
  }
  k = BlockReduce(k, su, Max());
  const double mx = l[IdOfKey(k)];
  double sum = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
    sum += exp(static_cast<double>(l[i]) - mx);
  return {k, mx + log(BlockReduce(sum, sd, Sum()))};
}

__global__ void SampleRowsKernel(int64_t vocab, const float* logits,
                                 const RowSamplingParams* params, int32_t* token, float* logprob) {
  __shared__ u64 su[kWarps + 1];
  __shared__ double sd[kWarps + 1];
  __shared__ double race_v[kWarps];
  __shared__ u64 race_r[kWarps];
  __shared__ u64 winner;
  const int64_t row = blockIdx.x;
  const float* l = logits + row * vocab;
  const RowSamplingParams p = params[row];
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f) || isnan(p.temperature)) {  // Sampler's errors
    if (threadIdx.x == 0) {
      token[row] = -1;
      logprob[row] = NAN;
    }
    return;
  }
  const RowNormaliser norm = Normalise(l, vocab, su, sd);
  int32_t tok = IdOfKey(norm.max_key);  // greedy
  if (p.temperature > 0.0f) {
    // Sampler's arithmetic, with the products and differences rounded separately (no FMA
    // contraction, which the host does not do either).
    const double inv_t = 1.0 / static_cast<double>(p.temperature);
    const double top = __dmul_rn(static_cast<double>(l[tok]), inv_t);
    auto weight = [&](int64_t i) {
      return exp(__dsub_rn(__dmul_rn(static_cast<double>(l[i]), inv_t), top));
    };
    int64_t keep = vocab;
    if (p.top_k > 0 && p.top_k < keep) keep = p.top_k;
    // Sampler leaves the candidates in id order unless it filters; that order breaks race ties.
    const bool sorted = keep < vocab || p.top_p < 1.0f;
    u64 cut = 0;  // the candidates are the tokens whose key is >= cut
    if (keep < vocab) {
      // Keys are distinct, so this is the keep-th largest key.
      cut = LargestWith(0, [&](u64 c) {
        u64 n = 0;
        for (int64_t i = threadIdx.x; i < vocab; i += kThreads) n += Key(l[i], i) >= c;
        return BlockReduce(n, su, Sum()) >= static_cast<u64>(keep);
      });
    }
    double z = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
      if (Key(l[i], i) >= cut) z += weight(i);
    z = BlockReduce(z, sd, Sum());
    if (p.top_p < 1.0f) {
      // The shortest prefix whose probability (normalised over the top-k) reaches top_p. If
      // rounding keeps the total below top_p, pred(cut) is false and all of top-k stays, as in
      // Sampler.
      const double top_p = p.top_p;
      cut = LargestWith(cut, [&](u64 c) {
        double mass = 0;
        for (int64_t i = threadIdx.x; i < vocab; i += kThreads)
          if (Key(l[i], i) >= c) mass += weight(i) / z;
        return BlockReduce(mass, sd, Sum()) >= top_p;
      });
    }
    // The race: the largest p_i / -log(U) wins; on equal values the earlier candidate (larger
    // rank) wins, as Sampler's strict > keeps the first.
    double best = -1.0;
    u64 rank = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
      const u64 k = Key(l[i], i);
      if (k < cut) continue;
      // 0 - log(u), not -log(u): u == 1 gives +0 (the token wins), as in Sampler.
      const double e = 0.0 - log(static_cast<double>(CounterUniform(p.seed, p.position, i)));
      const double race = weight(i) / z / e;
      const u64 r = sorted ? k : (k & 0xFFFFFFFFull);
      if (race > best || (race == best && r > rank)) {
        best = race;
        rank = r;
      }
    }
    for (int o = 16; o > 0; o >>= 1) {
      const double ob = __shfl_xor_sync(0xffffffffu, best, o);
      const u64 orank = __shfl_xor_sync(0xffffffffu, rank, o);
      if (ob > best || (ob == best && orank > rank)) {
        best = ob;
        rank = orank;
      }
    }
    if ((threadIdx.x & 31) == 0) {
      race_v[threadIdx.x / 32] = best;
      race_r[threadIdx.x / 32] = rank;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kWarps; ++w) {
        if (race_v[w] > best || (race_v[w] == best && race_r[w] > rank)) {
          best = race_v[w];
          rank = race_r[w];
        }
      }
      winner = rank;
    }
    __syncthreads();
    tok = IdOfKey(winner);  // both rank forms keep the complemented id in the low half
  }
  if (threadIdx.x == 0) {
    token[row] = tok;
    // tok < 0 (no race winner) cannot happen: the row maximum always races with p > 0.
    logprob[row] = tok < 0 ? NAN : static_cast<float>(static_cast<double>(l[tok]) - norm.log_z);
  }
}

// n rounds of a block-wide max over the keys below the previous round's.
__global__ void TopLogprobsKernel(int64_t vocab, const float* logits, int32_t n, int32_t* ids,
                                  float* logprobs) {
  __shared__ u64 su[kWarps + 1];
  __shared__ double sd[kWarps + 1];
  const int64_t row = blockIdx.x;
  const float* l = logits + row * vocab;
  const RowNormaliser norm = Normalise(l, vocab, su, sd);
  u64 prev = norm.max_key;
  for (int32_t j = 0; j < n; ++j) {
    u64 k = prev;
    if (j > 0) {
      k = 0;
      for (int64_t i = threadIdx.x; i < vocab; i += kThreads) {
        const u64 ki = Key(l[i], i);
        if (ki < prev && ki > k) k = ki;
      }
      k = BlockReduce(k, su, Max());
    }
    if (threadIdx.x == 0) {
      const int64_t out = row * n + j;
      if (k == 0) {  // fewer than n tokens
        ids[out] = -1;
        logprobs[out] = -INFINITY;
      } else {
        const int32_t id = IdOfKey(k);
        ids[out] = id;
        logprobs[out] = static_cast<float>(static_cast<double>(l[id]) - norm.log_z);
      }
    }
    prev = k;
  }
}

}  // namespace

cudaError_t SampleRowsF32(int64_t rows, int64_t vocab, const float* logits,
                          const RowSamplingParams* params, int32_t* token, float* logprob,
                          cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  SampleRowsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(vocab, logits, params,
                                                                         token, logprob);
  return cudaGetLastError();
}

cudaError_t TopLogprobsF32(int64_t rows, int64_t vocab, const float* logits, int32_t n,
                           int32_t* ids, float* logprobs, cudaStream_t stream) {
  if (n < 1 || n > kMaxTopLogprobs) return cudaErrorInvalidValue;
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || vocab > 0x7fffffff || rows > 0x7fffffff) return cudaErrorInvalidValue;
  TopLogprobsKernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(vocab, logits, n, ids,
                                                                          logprobs);
  return cudaGetLastError();
}

}  // namespace kernels
}  // namespace deepinfer
