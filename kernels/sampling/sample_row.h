// The per-row algorithm of kernels/sampling:sample, written once for the device and the host.
// The kernel runs SampleRow / TopLogprobsRow with a block of 512 threads (reductions over the
// block); SerialBlock runs the same code in one host thread, so a CPU test checks the kernel's
// own logic (keys, bisections, tie order, arithmetic) against Sampler on this machine. What
// that cannot check is the CUDA part: the block reductions, barriers and device exp/log.
//
// Where Sampler sorts the row (top-k, top-p), this selects over 64-bit candidate keys that
// order tokens exactly as Sampler's sort does (logit descending, then id ascending): the top-k
// cut is the largest key c with #{key >= c} >= k, the top-p cut the largest c with
// mass{key >= c} >= top_p. A radix select finds each cut 8 bits at a time, one pass over the
// row per digit with a 256-bin histogram (at most 8 passes, ending early with a gather once a
// bin is down to kGather tokens; the first digit comes from an earlier pass); the mass is summed in
// 2^-53 fixed point, so the histogram's order of additions cannot change it. No scratch memory
// beyond the histogram and no sort.
#ifndef DEEPINFER_KERNELS_SAMPLING_SAMPLE_ROW_H_
#define DEEPINFER_KERNELS_SAMPLING_SAMPLE_ROW_H_

#include <math.h>

#include <cstdint>
#include <cstring>

#include "worker/sampling/counter_rng.h"
#include "worker/sampling/row_sampling_params.h"

namespace deepinfer {
namespace kernels {
namespace sample_row {

using u64 = unsigned long long;

// Candidate order as a number: a larger key is an earlier candidate. High half: the logit's bits
// mapped to an unsigned integer that sorts like the float (-0 taken as +0, as == does); low
// half: the complemented id, so a lower id is larger. A non-NaN logit's key is never 0.
DEEPINFER_HOST_DEVICE u64 Key(float v, int64_t i) {
  if (v == 0.0f) v = 0.0f;
#if defined(__CUDA_ARCH__)
  uint32_t u = __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
#endif
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<u64>(u) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(i));
}

DEEPINFER_HOST_DEVICE int32_t IdOfKey(u64 k) {
  return static_cast<int32_t>(0xFFFFFFFFu - static_cast<uint32_t>(k));
}

// a * b - c with the product rounded first, as the host computes it: nvcc would otherwise
// contract it into an FMA.
DEEPINFER_HOST_DEVICE double MulSub(double a, double b, double c) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(__dmul_rn(a, b), c);
#else
  return a * b - c;
#endif
}

constexpr int kBins = 256;         // radix-select histogram: 8 bits per pass
constexpr uint32_t kGather = 512;  // the radix select finishes on this many tokens

// Row loops load kUnroll of a thread's strided values before using any, so that a thread has
// that many loads in flight (one at a time leaves a single block waiting on memory); the
// values are still used in increasing id order, so each thread's sums add in the same order.
constexpr int kUnroll = 8;

#if defined(__CUDACC__)
#define DEEPINFER_UNROLL _Pragma("unroll")
#else
#define DEEPINFER_UNROLL
#endif

// fn(i, l[i]) for this thread's ids i = first, first + step, ... < vocab, in that order.
template <class Block, typename Fn>
DEEPINFER_HOST_DEVICE void ForRow(const Block& b, const float* l, int64_t vocab, Fn fn) {
  const int64_t step = b.step();
  for (int64_t base = b.first(); base < vocab; base += kUnroll * step) {
    float v[kUnroll];
    DEEPINFER_UNROLL
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t i = base + j * step;
      v[j] = i < vocab ? l[i] : 0.0f;
    }
    DEEPINFER_UNROLL
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t i = base + j * step;
      if (i < vocab) fn(i, v[j]);
    }
  }
}

// As ForRow, but every thread calls fn(i, v, in) the same number of times (in: i < vocab,
// else v is 0), for block-wide calls inside fn.
template <class Block, typename Fn>
DEEPINFER_HOST_DEVICE void ForRowUniform(const Block& b, const float* l, int64_t vocab, Fn fn) {
  const int64_t step = b.step();
  for (int64_t base = 0; base < vocab; base += kUnroll * step) {
    float v[kUnroll];
    DEEPINFER_UNROLL
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t i = base + j * step + b.first();
      v[j] = i < vocab ? l[i] : 0.0f;
    }
    DEEPINFER_UNROLL
    for (int j = 0; j < kUnroll; ++j) {
      const int64_t i = base + j * step + b.first();
      fn(i, v[j], i < vocab);
    }
  }
}

// One thread doing the whole row: a block of one. The Block concept: first()/step() give this
// thread's strided loop over the row; SumD / SumU / MaxU reduce over the block (every thread gets
// the result); RaceMax keeps the larger (race, rank) pair, larger rank on equal races; leader() is
// the thread that writes results. HistClear / HistAdd / HistDone: a block-wide histogram of
// kBins bins, each a u64 sum h(d) and a count of adds: cleared, then every thread calls HistAdd
// the same number of times (bin < 0 adds nothing; the device combines a warp's adds per bin
// before one atomic), then every thread reads it with Count(d) and Crossing(target, &cum): the
// largest bin d with *cum + h(d) + h(the bins above d) >= target (-1 if none), *cum then plus
// h(the bins above d); every thread gets both. GatherClear / Gather(key, f) / GatherDone: a
// block-wide list of up to kGather (key, f) pairs, in any order: cleared, added to by any
// thread, then every thread reads it with GatheredKey(j) / GatheredF(j).

struct SerialBlock {
  int64_t first() const { return 0; }
  int64_t step() const { return 1; }
  bool leader() const { return true; }
  double SumD(double v) { return v; }
  u64 SumU(u64 v) { return v; }
  u64 MaxU(u64 v) { return v; }
  void RaceMax(double*, u64*) {}
  void HistClear() {
    for (int d = 0; d < kBins; ++d) hist[d] = count[d] = 0;
  }
  void HistAdd(int bin, u64 v) {
    if (bin >= 0) {
      hist[bin] += v;
      ++count[bin];
    }
  }
  void HistDone() {}
  uint32_t Count(int bin) const { return count[bin]; }
  int Crossing(u64 target, u64* cum) const {
    for (int d = kBins - 1; d >= 0; --d) {
      if (*cum + hist[d] >= target) return d;
      *cum += hist[d];
    }
    return -1;
  }
  void GatherClear() { gathered = 0; }
  void Gather(u64 key, u64 f) {
    gather_key[gathered] = key;
    gather_f[gathered++] = f;
  }
  void GatherDone() {}
  u64 GatheredKey(int64_t j) const { return gather_key[j]; }
  u64 GatheredF(int64_t j) const { return gather_f[j]; }
  u64 hist[kBins];
  uint32_t count[kBins];
  uint32_t gathered;
  u64 gather_key[kGather];
  u64 gather_f[kGather];
};

// The largest c >= lo with F(c) >= target, where F(c) is the sum of f(i, l[i]) (>= 0) over the
// tokens whose key is >= c; lo if even F(lo) < target (no cut: as the bisection it replaces,
// which assumed its predicate true at lo). Radix select, most significant digit first: each
// pass histograms the next 8 bits of the keys that share the digits chosen so far, and keeps
// the largest digit whose bin, with everything above it, still reaches target. The result is
// then a key whose own f makes the sum reach target, so no larger c can. That bin holds a
// token with f > 0 (the bins above it did not reach target); when it holds only that token,
// its key is the result. More generally, once the bin holds at most kGather tokens, one more
// pass gathers their keys and f, and the result is the largest gathered key whose own sum
// (above, plus f over the gathered keys >= it) reaches target, instead of the remaining digits.
//
// first_digit >= 0 is the caller's guess of the first digit (from an estimate): the select
// starts at the second, and that pass also sums f over the keys whose first digit is larger
// (the exact F above the guessed bin). A wrong guess cannot pass unnoticed: too small, that
// sum alone reaches target; too large, it and the bin together do not. Then the select
// starts over from the first digit.
template <class Block, typename F>
DEEPINFER_HOST_DEVICE u64 LargestCut(Block& b, const float* l, int64_t vocab, u64 lo, u64 target,
                                     F f, int first_digit = -1) {
  for (;;) {
    u64 prefix = 0;  // the digits chosen so far, in place
    u64 above = 0;   // F of the keys above every key with that prefix
    int shift = 56;
    if (first_digit >= 0) {
      prefix = static_cast<u64>(first_digit) << 56;
      shift = 48;
    }
    for (; shift >= 0; shift -= 8) {
      const bool sum_above = first_digit >= 0 && shift == 48;
      u64 up = 0;  // with sum_above: this thread's f over the keys above the guessed bin
      b.HistClear();
      // Every thread makes the same number of calls (HistAdd's contract).
      ForRowUniform(b, l, vocab, [&](int64_t i, float x, bool in) {
        int bin = -1;
        u64 v = 0;
        if (in) {
          const u64 k = Key(x, i);
          if (k >= lo) {
            if (shift == 56 || (k >> (shift + 8)) == (prefix >> (shift + 8))) {
              bin = static_cast<int>((k >> shift) & 0xFF);
              v = f(i, x);
            } else if (sum_above && k > prefix) {
              up += f(i, x);
            }
          }
        }
        b.HistAdd(bin, v);
      });
      b.HistDone();
      if (sum_above) above = b.SumU(up);
      u64 cum = above;
      const int d = above < target ? b.Crossing(target, &cum) : -1;
      if (d < 0) {
        if (sum_above) break;  // a wrong guess
        return lo;             // only in the first pass: F(lo) < target
      }
      prefix |= static_cast<u64>(d) << shift;
      above = cum;
      const uint32_t n = b.Count(d);
      if (shift > 0 && n <= kGather) {
        b.GatherClear();
        ForRow(b, l, vocab, [&](int64_t i, float x) {
          const u64 k = Key(x, i);
          if (k >= lo && (k >> shift) == (prefix >> shift)) b.Gather(k, f(i, x));
        });
        b.GatherDone();
        u64 best = 0;
        const int64_t step = b.step();
        for (int64_t j = b.first(); j < n; j += step) {
          const u64 kj = b.GatheredKey(j);
          u64 s = above;
          for (uint32_t m = 0; m < n; ++m) {
            if (b.GatheredKey(m) >= kj) s += b.GatheredF(m);
          }
          if (s >= target && kj > best) best = kj;
        }
        return b.MaxU(best);
      }
    }
    if (shift < 0) return prefix;
    first_digit = -1;
  }
}

// Probability mass in fixed point: p * 2^53, rounded (p <= 1, so a row's total stays below
// 2^64 with room to spare). Exact integer sums: the order of additions cannot matter.
DEEPINFER_HOST_DEVICE u64 FixedMass(double p) {
  return static_cast<u64>(p * 9007199254740992.0 + 0.5);
}

// The row's largest key: its argmax, lowest id on ties. With count_first_digits, the same pass
// also counts the keys by first digit into the block's histogram.
template <class Block>
DEEPINFER_HOST_DEVICE u64 MaxKey(Block& b, const float* l, int64_t vocab,
                                 bool count_first_digits = false) {
  u64 k = 0;
  if (count_first_digits) b.HistClear();
  ForRowUniform(b, l, vocab, [&](int64_t i, float v, bool in) {
    int bin = -1;
    if (in) {
      const u64 ki = Key(v, i);
      k = ki > k ? ki : k;
      bin = static_cast<int>(ki >> 56);
    }
    if (count_first_digits) b.HistAdd(bin, 1);
  });
  if (count_first_digits) b.HistDone();
  return b.MaxU(k);
}

struct RowNormaliser {
  u64 max_key;   // MaxKey
  double log_z;  // logsumexp of the raw row
};

// As Sampler: the maximum, then the sum of exp(l - max) in double. SampleRow computes the same
// sum in the same order, in a pass of its own.
template <class Block>
DEEPINFER_HOST_DEVICE RowNormaliser Normalise(Block& b, const float* l, int64_t vocab) {
  const u64 k = MaxKey(b, l, vocab);
  const double mx = l[IdOfKey(k)];
  double sum = 0;
  ForRow(b, l, vocab, [&](int64_t, float v) { sum += exp(static_cast<double>(v) - mx); });
  return {k, mx + log(b.SumD(sum))};
}

// Sampler::Sample's token for the row (-1 for Sampler's INVALID_ARGUMENT: top_p outside
// (0, 1] or a NaN temperature); *logprob its log-softmax (NaN for -1). Every thread returns it.
template <class Block>
DEEPINFER_HOST_DEVICE int32_t SampleRow(Block& b, const float* l, int64_t vocab,
                                        const RowSamplingParams& p, float* logprob) {
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f) || isnan(p.temperature)) {
    *logprob = NAN;
    return -1;
  }
  int64_t keep = vocab;
  if (p.top_k > 0 && p.top_k < keep) keep = p.top_k;
  const bool top_k = p.temperature > 0.0f && keep < vocab;
  const u64 max_key = MaxKey(b, l, vocab, top_k);
  // With top-k, the first digit of its select, from the exact counts of the maximum's pass.
  int top_k_first_digit = -1;
  if (top_k) {
    u64 above = 0;
    top_k_first_digit = b.Crossing(static_cast<u64>(keep), &above);
  }
  int32_t tok = IdOfKey(max_key);  // greedy
  const double mx = l[tok];
  double sum = 0;  // of exp(l - mx) over the row: Normalise's
  if (!(p.temperature > 0.0f)) {
    ForRow(b, l, vocab, [&](int64_t, float v) { sum += exp(static_cast<double>(v) - mx); });
    sum = b.SumD(sum);
  } else {
    // Sampler's arithmetic step by step.
    const double inv_t = 1.0 / static_cast<double>(p.temperature);
    const double top = static_cast<double>(l[tok]) * inv_t;  // the largest l * inv_t
    auto weight = [&](float v) { return exp(MulSub(static_cast<double>(v), inv_t, top)); };
    // Sampler leaves the candidates in id order unless it filters; that order breaks race ties.
    const bool sorted = keep < vocab || p.top_p < 1.0f;
    u64 cut = 0;  // the candidates are the tokens whose key is >= cut
    if (top_k) {
      // Keys are distinct, so this is the keep-th largest key.
      cut = LargestCut(
          b, l, vocab, 0, static_cast<u64>(keep), [](int64_t, float) { return u64{1}; },
          top_k_first_digit);
    }
    // The normaliser's sum and z in one pass. Without top-k at T = 1, weight(l) is exp(l - mx)
    // and z is the normaliser's sum. For top-p the pass also histograms the candidates'
    // weights (w * 2^40, rounded: w <= 1 below a finite top) by the keys' first digit, an
    // estimate of the top-p masses' histogram (w / z * 2^53) that guesses the select's first
    // digit without an exp of its own.
    const bool z_is_sum = cut == 0 && inv_t == 1.0;
    const bool guess = p.top_p < 1.0f && isfinite(top);
    if (guess) b.HistClear();
    double z = 0;
    ForRowUniform(b, l, vocab, [&](int64_t i, float v, bool in) {
      int bin = -1;
      u64 w40 = 0;
      if (in) {
        const double e = exp(static_cast<double>(v) - mx);
        sum += e;
        const u64 k = Key(v, i);
        if (k >= cut) {
          const double w = z_is_sum ? e : weight(v);
          if (!z_is_sum) z += w;
          bin = static_cast<int>(k >> 56);
          if (w >= 0.0 && w <= 1.0) w40 = static_cast<u64>(w * 1099511627776.0 + 0.5);
        }
      }
      if (guess) b.HistAdd(bin, w40);
    });
    if (guess) b.HistDone();
    sum = b.SumD(sum);
    z = z_is_sum ? sum : b.SumD(z);
    int first_digit = -1;
    if (guess && z >= 1.0 && z <= static_cast<double>(vocab)) {
      // top_p's fixed-point mass in units of w * 2^40: times z / 2^13.
      u64 est = 0;
      first_digit = b.Crossing(
          static_cast<u64>(static_cast<double>(FixedMass(p.top_p)) * (z / 8192.0)), &est);
    }
    if (p.top_p < 1.0f) {
      // The shortest prefix whose probability (normalised over the top-k) reaches top_p. If
      // rounding keeps the total below top_p, pred(cut) is false and all of top-k stays, as in
      // Sampler.
      // A token more than 40 below the top in l * inv_t has p < exp(-40) (z >= 1: the top's
      // own weight is exp(0)), which FixedMass rounds to 0; its exp is skipped.
      cut = LargestCut(
          b, l, vocab, cut, FixedMass(p.top_p),
          [&](int64_t, float v) {
            const double x = MulSub(static_cast<double>(v), inv_t, top);
            return x < -40.0 && z >= 1.0 ? u64{0} : FixedMass(exp(x) / z);
          },
          first_digit);
    }
    // The race: the largest p_i / E_i wins; on equal values the earlier candidate (larger rank)
    // wins, as Sampler's strict > keeps the first. E = 0 - log(u) as in Sampler (u == 1: +0).
    double best = -1.0;
    u64 rank = 0;
    ForRow(b, l, vocab, [&](int64_t i, float v) {
      const u64 k = Key(v, i);
      if (k < cut) return;
      const double e = 0.0 - log(static_cast<double>(CounterUniform(p.seed, p.position, i)));
      const double race = weight(v) / z / e;
      const u64 r = sorted ? k : (k & 0xFFFFFFFFull);
      if (race > best || (race == best && r > rank)) {
        best = race;
        rank = r;
      }
    });
    b.RaceMax(&best, &rank);
    // Both rank forms keep the complemented id in the low half. No winner (-1) cannot happen:
    // the row maximum always races with p > 0.
    tok = rank == 0 ? -1 : IdOfKey(rank);
  }
  const double log_z = mx + log(sum);
  *logprob = tok < 0 ? NAN : static_cast<float>(static_cast<double>(l[tok]) - log_z);
  return tok;
}

// The n most likely tokens (n rounds of a max over the keys below the previous round's);
// the leader writes ids[j], logprobs[j] for j < n (-1 and -inf past the vocabulary).
template <class Block>
DEEPINFER_HOST_DEVICE void TopLogprobsRow(Block& b, const float* l, int64_t vocab, int32_t n,
                                          int32_t* ids, float* logprobs) {
  const RowNormaliser norm = Normalise(b, l, vocab);
  u64 prev = norm.max_key;
  for (int32_t j = 0; j < n; ++j) {
    u64 k = prev;
    if (j > 0) {
      k = 0;
      ForRow(b, l, vocab, [&](int64_t i, float v) {
        const u64 ki = Key(v, i);
        if (ki < prev && ki > k) k = ki;
      });
      k = b.MaxU(k);
    }
    if (b.leader()) {
      if (k == 0) {  // fewer than n tokens
        ids[j] = -1;
        logprobs[j] = -INFINITY;
      } else {
        const int32_t id = IdOfKey(k);
        ids[j] = id;
        logprobs[j] = static_cast<float>(static_cast<double>(l[id]) - norm.log_z);
      }
    }
    prev = k;
  }
}

}  // namespace sample_row
}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_SAMPLING_SAMPLE_ROW_H_
