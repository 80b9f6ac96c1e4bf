// SinkAttentionF32 against CpuV4Ops::SinkAttention on random inputs laid out as the V4 model's
// cache keeps them (worker/model/deepseek_v4/v4_attention.cc): per sequence a ring slot with the
// window positions before the step (slots of a stride longer than the ring), the step's keys, and
// its compressed entries in a paged stream (its blocks scattered over the pool by a block table;
// whole entries in a block, or each entry spread over 8 blocks as V4-Flash's HCA entries at block
// size 16); each query token over its own window (up to 128 rows) and either a prefix of the
// entries (HCA, extra_len) or the indexer's ascending selection of them padded with -1 (CSA).
// Shapes: V4-Flash decode (64 heads x 512, window 128 + 512 selected; HCA with 3000 entries),
// prefill chunks (every token its own window and selection, part of it among the step's keys),
// head counts that do not fill a block, the fixtures' small shape (4 heads x 64), tokens with no
// window, no entries or neither, sinks large (the sink takes almost all the weight) and small;
// every kernel that runs the shape, each with one split, chosen splits and forced 3 and 32
// splits (kTensorCoreBf16Prefill: one split); at dim 512 the bf16 kernels with a bf16 query and
// a rotated bf16 output (ExpectBf16QueryAndOutputMatch), and kTensorCoreBf16Prefill with none,
// some and all of its bf16 copies of the row buffers, against the CPU. Ring rows, stream blocks
// and slots outside every list are NaN (in the bf16 copies too), so a kernel reading one fails.
// (Somewhat over 800 lines: one harness builds these layouts for every kernel and copy set, and
// splitting the file would mean a second copy of it.)
//
// Tolerances are relative to each output's magnitude mag = sum_j p_j |v_j| (p: the softmax with
// the sink, computed here in double): a score error d moves an output by at most 2 max|d| mag,
// rounding P or V by a relative e moves it by at most e mag.
//   CUDA cores: fp32 FMA in another order than the CPU's, whose own error against a double
//     reference reaches 2.3e-5 mag at the sharp scale (measured on these inputs): 2e-4 mag.
//   tensor cores, exact: every product hi·hi + hi·lo + lo·hi of bf16 pairs, off by at most
//     3 * 2^-16 of |q k| and typically ~2^-17; a 512-long dot of these N(0, 1) inputs moves by
//     ~2e-4 (rms), a score by that x scale (0.044-0.25 here), the largest of ~10^6 scores by ~5x
//     that: up to ~3e-4 mag at the sharp scale: 1e-3 mag.
//   tensor cores, bf16: against the CPU run on Q and KV rounded to bf16 (the kernel's own
//     operands: the scores then agree to fp32 rounding), what remains is P's rounding to bf16,
//     at most 2^-8 relative: 2^-8 mag, plus 1e-4 mag.
// A row missed or read twice moves an output by p_j |v_j[d]|: dropping one of 3128 HCA rows
// moves ~2.5% of the outputs by more than 1e-3 mag and over a hundred of them by more than 2^-8
// mag, more at the sharper scale. A row outside the lists is NaN.
#include "kernels/v4/sink_attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/rope/rope.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cpu/cpu_v4_ops.h"
#include "worker/backend/cpu/thread_pool.h"
#include "worker/backend/v4_ops.h"

namespace deepinfer {
namespace {

using kernels::SinkAttentionKernel;
using testing::DeviceArray;

struct Case {
  std::string name;
  int64_t heads = 64, dim = 512;
  int32_t seqs = 2;
  int32_t tokens_per_seq = 1;  // 1: decode
  int32_t context = 1000;      // positions before a sequence's first query token
  int32_t window = 128;
  int32_t entries = 600;  // compressed entries per sequence
  int32_t topk = 512;     // the selection's stride; 0: HCA (every visible entry)
  // Floats of the entries' stream per block (0: 4 entries a block); dim / 8: each entry spread
  // over 8 blocks.
  int64_t block_floats = 0;
  float scale = 0.0f;  // 0: 1 / sqrt(dim)
  float sink_mean = 0.0f, sink_std = 1.0f;
  bool empty_tokens = false;  // tokens 0, 1, 2 of each sequence: no window, no entries, neither
  // Floats past a ring slot's W * dim (4: a stride the prefill kernel reads no ring copy with).
  int64_t ring_pad = 4;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// The inputs of one call, on the host, and each token's rows in attention order (a window row by
// its position p >= 0, an entry i as -1 - i).
struct Inputs {
  int64_t tokens = 0, heads = 0, dim = 0, stride = 0;
  float scale = 1.0f;
  std::vector<float> q, kv, ring, stream, sinks;
  int64_t ring_rows = 0, ring_stride = 0, block_floats = 0, table_stride = 0;
  std::vector<int32_t> positions, window_len, step_start, slot, token_seq, tables, extra_len,
      selected;
  std::vector<std::vector<int64_t>> rows;
};

Inputs MakeInputs(const Case& c, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const int64_t D = c.dim, W = c.window;
  Inputs in;
  in.tokens = int64_t{c.seqs} * c.tokens_per_seq;
  in.heads = c.heads;
  in.dim = D;
  in.stride = c.topk;
  in.scale = c.scale > 0.0f ? c.scale : 1.0f / std::sqrt(static_cast<float>(D));
  // Sequence s in ring slot 2 s + 1 (slots of W rows and ring_pad floats more); blocks of the
  // stream shuffled over a pool with a spare block per sequence (NaN).
  in.ring_rows = W;
  in.ring_stride = W * D + c.ring_pad;
  in.ring.assign((2 * int64_t{c.seqs} + 1) * in.ring_stride, nan);
  in.block_floats = c.block_floats > 0 ? c.block_floats : 4 * D;
  const int64_t per_seq = (int64_t{c.entries} * D + in.block_floats - 1) / in.block_floats;
  in.table_stride = per_seq + 1;
  std::vector<int32_t> pool(c.seqs * (per_seq + 1));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), gen);
  in.stream.assign(pool.size() * in.block_floats, nan);
  for (int32_t s = 0; s < c.seqs; ++s) {
    const int64_t slot = 2 * s + 1;
    float* ring = in.ring.data() + slot * in.ring_stride;
    for (int64_t p = std::max<int64_t>(0, c.context - (W - 1)); p < c.context; ++p) {
      for (int64_t d = 0; d < D; ++d) ring[(p % W) * D + d] = normal(gen);
    }
    for (int64_t b = 0; b < in.table_stride; ++b) {
      in.tables.push_back(pool[s * (per_seq + 1) + b]);
    }
    const int32_t* table = in.tables.data() + s * in.table_stride;
    for (int64_t e = 0; e < int64_t{c.entries} * D; ++e) {
      in.stream[int64_t{table[e / in.block_floats]} * in.block_floats + e % in.block_floats] =
          normal(gen);
    }
    for (int32_t i = 0; i < c.tokens_per_seq; ++i) {
      const int64_t pos = c.context + i;
      int32_t wl = static_cast<int32_t>(std::min<int64_t>(W, pos + 1));
      // Later tokens of a prefill chunk see more entries.
      int32_t visible = std::max(0, c.entries - 3 * (c.tokens_per_seq - 1 - i));
      if (c.empty_tokens && (i == 0 || i == 2)) wl = 0;
      if (c.empty_tokens && (i == 1 || i == 2)) visible = 0;
      in.positions.push_back(static_cast<int32_t>(pos));
      in.window_len.push_back(wl);
      in.step_start.push_back(c.context);
      in.slot.push_back(static_cast<int32_t>(slot));
      in.token_seq.push_back(s);
      std::vector<int64_t> r;
      for (int64_t p = pos - wl + 1; p <= pos; ++p) r.push_back(p);
      if (c.topk == 0) {
        in.extra_len.push_back(visible);
        for (int32_t j = 0; j < visible; ++j) r.push_back(-1 - j);
      } else {
        in.extra_len.push_back(0);  // not read with a selection
        std::vector<int32_t> all(visible);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), gen);
        int32_t n = std::min(c.topk, visible);
        if (i % 3 == 2) n /= 2;  // a token whose selection is shorter than the stride
        all.resize(n);
        std::sort(all.begin(), all.end());
        for (int32_t j = 0; j < c.topk; ++j) in.selected.push_back(j < n ? all[j] : -1);
        for (int32_t e : all) r.push_back(-1 - e);
      }
      in.rows.push_back(r);
    }
  }
  for (int64_t i = 0; i < in.tokens * D; ++i) in.kv.push_back(normal(gen));
  for (int64_t i = 0; i < in.tokens * c.heads * D; ++i) in.q.push_back(normal(gen));
  std::normal_distribution<float> sink(c.sink_mean, c.sink_std);
  for (int64_t h = 0; h < c.heads; ++h) in.sinks.push_back(sink(gen));
  return in;
}

// The values of row r (Inputs::rows' coding) of token t: into out (dim floats).
void RowValues(const Inputs& in, int64_t t, int64_t r, float* out) {
  const int64_t D = in.dim;
  if (r >= 0) {
    const int64_t pos = in.positions[t];
    const float* src = r >= in.step_start[t]
                           ? in.kv.data() + (t - (pos - r)) * D
                           : in.ring.data() + in.slot[t] * in.ring_stride + (r % in.ring_rows) * D;
    std::copy(src, src + D, out);
    return;
  }
  const int32_t* table = in.tables.data() + in.token_seq[t] * in.table_stride;
  const int64_t P = in.block_floats;
  for (int64_t d = 0; d < D; ++d) {
    const int64_t e = (-1 - r) * D + d;
    out[d] = in.stream[int64_t{table[e / P]} * P + e % P];
  }
}

// CpuV4Ops::SinkAttention over the inputs (or rounded copies of q and the keys).
std::vector<float> CpuReference(const Inputs& in, const std::vector<float>& q,
                                const std::vector<float>& kv, const std::vector<float>& ring,
                                const std::vector<float>& stream) {
  ThreadPool pool(0);
  CpuV4Ops ops(&pool);
  std::vector<float> out(in.tokens * in.heads * in.dim);
  SinkAttentionArgs a;
  a.tokens = in.tokens;
  a.heads = in.heads;
  a.dim = in.dim;
  a.q = q.data();
  a.kv = kv.data();
  a.positions = in.positions.data();
  a.window_len = in.window_len.data();
  a.step_start = in.step_start.data();
  a.ring = ring.data();
  a.ring_rows = in.ring_rows;
  a.ring_stride = in.ring_stride;
  a.ring_slot = in.slot.data();
  a.entries = {stream.data(), in.block_floats, in.tables.data(), in.table_stride,
               in.token_seq.data()};
  a.extra_len = in.extra_len.data();
  if (in.stride > 0) {
    a.selected = in.selected.data();
    a.selected_stride = in.stride;
  }
  a.sinks = in.sinks.data();
  a.scale = in.scale;
  a.out = out.data();
  ops.SinkAttention(a);
  return out;
}

// mag[t, h, d] = sum_j p_j |v_j[d]| in double (the tolerances' scale, see the top).
std::vector<double> Magnitudes(const Inputs& in) {
  const int64_t D = in.dim;
  std::vector<double> mag(in.tokens * in.heads * D, 0.0);
  std::vector<double> s;
  for (int64_t t = 0; t < in.tokens; ++t) {
    const std::vector<int64_t>& rows = in.rows[t];
    std::vector<float> values(rows.size() * D);
    for (size_t j = 0; j < rows.size(); ++j) RowValues(in, t, rows[j], values.data() + j * D);
    for (int64_t h = 0; h < in.heads; ++h) {
      const float* q = in.q.data() + (t * in.heads + h) * D;
      s.assign(rows.size(), 0.0);
      double mx = in.sinks[h];
      for (size_t j = 0; j < rows.size(); ++j) {
        const float* k = values.data() + j * D;
        double dot = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += static_cast<double>(q[d]) * k[d];
        s[j] = dot * in.scale;
        mx = std::max(mx, s[j]);
      }
      double z = std::exp(in.sinks[h] - mx);
      for (double& x : s) {
        x = std::exp(x - mx);
        z += x;
      }
      double* m = mag.data() + (t * in.heads + h) * D;
      for (size_t j = 0; j < rows.size(); ++j) {
        const float* v = values.data() + j * D;
        for (int64_t d = 0; d < D; ++d) m[d] += s[j] / z * std::fabs(v[d]);
      }
    }
  }
  return mag;
}

// |got - want| <= rel * mag element-wise (NaN fails); the first few mismatches are reported.
::testing::AssertionResult WithinMagnitude(const std::vector<float>& got,
                                           const std::vector<float>& want,
                                           const std::vector<double>& mag, double rel) {
  size_t bad = 0;
  std::string first;
  double worst = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double bound = rel * mag[i] + 1e-30;
    if (!(diff <= bound)) {
      if (bad < 5) {
        first += " [" + std::to_string(i) + "] got " + std::to_string(got[i]) + " want " +
                 std::to_string(want[i]) + " mag " + std::to_string(mag[i]) + ";";
      }
      ++bad;
    }
    if (mag[i] > 0.0) worst = std::max(worst, diff / mag[i]);
  }
  if (bad > 0) {
    return ::testing::AssertionFailure() << bad << " of " << want.size() << " mismatches:" << first;
  }
  return ::testing::AssertionSuccess() << "max error / mag " << worst;
}

// The device copies of an Inputs and the params over them.
struct DeviceInputs {
  explicit DeviceInputs(const Inputs& in)
      : q(in.q),
        kv(in.kv),
        ring(in.ring),
        stream(in.stream),
        sinks(in.sinks),
        positions(in.positions),
        window_len(in.window_len),
        step_start(in.step_start),
        slot(in.slot),
        token_seq(in.token_seq),
        tables(in.tables),
        extra_len(in.extra_len),
        selected(in.selected),
        out(in.tokens * in.heads * in.dim) {
    p.tokens = in.tokens;
    p.heads = in.heads;
    p.dim = in.dim;
    p.q = q.get();
    p.kv = kv.get();
    p.positions = positions.get();
    p.window_len = window_len.get();
    p.step_start = step_start.get();
    p.ring = ring.get();
    p.ring_rows = in.ring_rows;
    p.ring_stride = in.ring_stride;
    p.ring_slot = slot.get();
    p.entries = {stream.get(), in.block_floats, tables.get(), in.table_stride, token_seq.get()};
    p.extra_len = extra_len.get();
    if (in.stride > 0) {
      p.selected = selected.get();
      p.selected_stride = in.stride;
    }
    p.sinks = sinks.get();
    p.scale = in.scale;
    p.out = out.get();
  }
  DeviceArray<float> q, kv, ring, stream, sinks;
  DeviceArray<int32_t> positions, window_len, step_start, slot, token_seq, tables, extra_len,
      selected;
  DeviceArray<float> out;
  kernels::SinkAttentionParams p;
};

// bf16 copies of the row buffers (FloatToBf16Bits of every value, NaN where the buffer is), a
// compact copy of the entries (SinkAttentionEntriesToBf16 over every block-table row) and the
// sets of them kTensorCoreBf16Prefill is tested with.
struct DeviceBf16Rows {
  DeviceBf16Rows(const Inputs& in, const kernels::SinkAttentionParams& p)
      : kv(FloatsToBf16Bits(in.kv)),
        ring(FloatsToBf16Bits(in.ring)),
        stream(FloatsToBf16Bits(in.stream)),
        table_rows(static_cast<int64_t>(in.tables.size()) / in.table_stride),
        compact(kernels::SinkAttentionEntriesBf16Values(p.entries, table_rows)),
        compact_tables(in.tables.size()),
        ring_usable(in.ring_stride % 8 == 0) {
    compact.Poison();
    compact_tables.Poison();
    compact_status = kernels::SinkAttentionEntriesToBf16(p.entries, table_rows, compact.get(),
                                                         compact_tables.get(), nullptr);
  }
  bool ok() const {
    return kv.ok() && ring.ok() && stream.ok() && compact.ok() && compact_tables.ok() &&
           compact_status == cudaSuccess;
  }
  // Set s of kSets in p: none; kv's; the stream's; all (the ring's where its stride allows);
  // kv's and the compact copy of the entries through its tables, then also with its seq_stride
  // (the backend's prefill call; kTensorCoreBf16Prefill reads no table then).
  static constexpr int kSets = 6;
  static const char* SetName(int s) {
    static const char* const kNames[kSets] = {
        "no bf16 copies",  "kv_bf16", "entries_bf16", "all bf16 copies",
        "kv_bf16, compact entries_bf16", "kv_bf16, compact entries_bf16 with seq_stride"};
    return kNames[s];
  }
  void Set(int s, kernels::SinkAttentionParams* p) const {
    p->kv_bf16 = s == 1 || s == 3 || s >= 4 ? kv.get() : nullptr;
    p->ring_bf16 = s == 3 && ring_usable ? ring.get() : nullptr;
    p->entries_bf16 = {};
    if (s == 2 || s == 3) p->entries_bf16.data = stream.get();
    if (s >= 4) {
      p->entries_bf16.data = compact.get();
      p->entries_bf16.block_tables = compact_tables.get();
      p->entries_bf16.table_stride = p->entries.table_stride;
      if (s == 5) p->entries_bf16.seq_stride = p->entries.table_stride * p->entries.block_floats;
    }
  }
  DeviceArray<uint16_t> kv, ring, stream;
  int64_t table_rows;
  DeviceArray<uint16_t> compact;
  DeviceArray<int32_t> compact_tables;
  bool ring_usable;
  cudaError_t compact_status = cudaSuccess;
};

bool DeviceHasTensorCores() {
  int device = 0, major = 0;
  return cudaGetDevice(&device) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
         major >= 8;
}

const char* KernelName(SinkAttentionKernel k) {
  switch (k) {
    case SinkAttentionKernel::kCudaCore:
      return "cuda_core";
    case SinkAttentionKernel::kTensorCoreExact:
      return "tensor_core_exact";
    case SinkAttentionKernel::kTensorCoreBf16:
      return "tensor_core_bf16";
    case SinkAttentionKernel::kTensorCoreBf16Prefill:
      return "tensor_core_bf16_prefill";
    case SinkAttentionKernel::kAuto:
      break;
  }
  return "auto";
}

// The bf16 kernel with q_bf16 and out_bf16 (the prefill path of a bf16 model):
//  * q_bf16 = q rounded: the fp32 output bit for bit the fp32 query's (any split count);
//  * out_bf16 (one split; kAuto picks the bf16 kernel): bit for bit the fp32 output of one split
//    rotated back by ApplyRopeF32 (negated positions, a YaRN factor) and rounded to nearest
//    even, and against the CPU (want_bf16, rotated by CpuBackend::ApplyRope) within the bf16
//    kernel's tolerance plus the output's rounding (2^-9 of a value, at most its magnitude; a
//    rotated pair's magnitude is factor x the sum of its two);
//  * more than one split with out_bf16, or the other kernels with either, are refused.
//  * kAuto with q_bf16 and each set of bf16 copies but an fp32 output: kTensorCoreBf16;
//  * kTensorCoreBf16Prefill (kAuto's pick with out_bf16) with each set of bf16 copies: bit for
//    bit its own fp32 output rotated and rounded, and against the CPU as kTensorCoreBf16.
void ExpectBf16QueryAndOutputMatch(const Inputs& in, const std::vector<float>& want_bf16,
                                   const std::vector<double>& mag, DeviceInputs* dev,
                                   const DeviceBf16Rows& rows16, DeviceArray<float>* workspace) {
  const int64_t D = in.dim, rd = 64, n = in.tokens * in.heads * D;
  const float factor = 1.2079f;
  std::vector<int32_t> neg(in.positions);
  for (int32_t& x : neg) x = -x;
  std::vector<float> inv_freq(rd / 2);
  for (int64_t j = 0; j < rd / 2; ++j) {
    inv_freq[j] = static_cast<float>(std::pow(160000.0, -2.0 * j / rd));
  }
  // out16 has 8 more elements: out_bf16 also starts 2 elements (4 bytes) in, the kernel's
  // 4-byte store path.
  DeviceArray<uint16_t> q16(FloatsToBf16Bits(in.q)), out16(n + 8);
  DeviceArray<int32_t> dneg(neg);
  DeviceArray<float> dinv(inv_freq);
  ASSERT_TRUE(q16.ok() && out16.ok());
  auto run = [&](kernels::SinkAttentionParams p, std::vector<float>* got) {
    size_t need = 0;
    ASSERT_EQ(kernels::SinkAttentionWorkspaceBytes(p, &need), cudaSuccess);
    ASSERT_LE(need, workspace->size() * sizeof(float));
    p.workspace = workspace->get();
    p.workspace_bytes = workspace->size() * sizeof(float);
    dev->out.Poison();
    DEEPINFER_CUDA_OK(kernels::SinkAttentionF32(p, nullptr));
    DEEPINFER_CUDA_OK(dev->out.Download(got));
  };
  for (int32_t splits : {0, 3}) {
    SCOPED_TRACE(::testing::Message() << "q_bf16, num_splits " << splits);
    kernels::SinkAttentionParams p = dev->p;
    p.kernel = SinkAttentionKernel::kTensorCoreBf16;
    p.num_splits = splits;
    std::vector<float> fp32_q, bf16_q;
    run(p, &fp32_q);
    p.q = nullptr;
    p.q_bf16 = q16.get();
    run(p, &bf16_q);
    ASSERT_EQ(fp32_q.size(), bf16_q.size());
    EXPECT_EQ(0, std::memcmp(fp32_q.data(), bf16_q.data(), fp32_q.size() * sizeof(float)));
  }
  // The fp32 path: one split, ApplyRopeF32 on the output's rope slices, then the rounding.
  kernels::SinkAttentionParams p = dev->p;
  p.kernel = SinkAttentionKernel::kTensorCoreBf16;
  p.num_splits = 1;
  DEEPINFER_CUDA_OK(kernels::SinkAttentionF32(p, nullptr));
  DEEPINFER_CUDA_OK(kernels::ApplyRopeF32(in.tokens, in.heads, dev->out.get() + D - rd,
                                          in.heads * D, D, rd, dneg.get(), dinv.get(), factor,
                                          /*interleaved=*/true, nullptr));
  std::vector<float> fp32_path, prefill_fp32_path;
  DEEPINFER_CUDA_OK(dev->out.Download(&fp32_path));
  p.kernel = SinkAttentionKernel::kTensorCoreBf16Prefill;
  DEEPINFER_CUDA_OK(kernels::SinkAttentionF32(p, nullptr));
  DEEPINFER_CUDA_OK(kernels::ApplyRopeF32(in.tokens, in.heads, dev->out.get() + D - rd,
                                          in.heads * D, D, rd, dneg.get(), dinv.get(), factor,
                                          /*interleaved=*/true, nullptr));
  DEEPINFER_CUDA_OK(dev->out.Download(&prefill_fp32_path));
  // The CPU's: the bf16 kernel's reference rotated back.
  CpuBackend cpu(1);
  std::vector<float> want(want_bf16);
  cpu.ApplyRope(in.tokens, in.heads, want.data() + D - rd, in.heads * D, D, rd, neg.data(),
                inv_freq.data(), factor, /*interleaved=*/true);
  std::vector<double> rotated_mag(mag);
  for (int64_t r = 0; r < in.tokens * in.heads; ++r) {
    for (int64_t i = D - rd; i < D; i += 2) {
      const double m = factor * (mag[r * D + i] + mag[r * D + i + 1]);
      rotated_mag[r * D + i] = rotated_mag[r * D + i + 1] = m;
    }
  }
  for (int32_t splits : {0, 1}) {
    for (int64_t offset : {0, 2}) {
      SCOPED_TRACE(::testing::Message()
                   << "q_bf16 and out_bf16 (offset " << offset << "), num_splits " << splits);
      kernels::SinkAttentionParams pb = dev->p;
      pb.q = nullptr;
      pb.q_bf16 = q16.get();
      pb.out = nullptr;
      pb.out_bf16 = out16.get() + offset;
      pb.out_rope_dim = rd;
      pb.out_rope_positions = dneg.get();
      pb.out_rope_inv_freq = dinv.get();
      pb.out_rope_factor = factor;
      pb.num_splits = splits;
      EXPECT_EQ(kernels::SinkAttentionKernelFor(pb), SinkAttentionKernel::kTensorCoreBf16Prefill);
      pb.kernel = SinkAttentionKernel::kTensorCoreBf16;
      size_t need = 1;
      ASSERT_EQ(kernels::SinkAttentionWorkspaceBytes(pb, &need), cudaSuccess);
      EXPECT_EQ(need, 0u);
      out16.Poison();
      DEEPINFER_CUDA_OK(kernels::SinkAttentionF32(pb, nullptr));
      std::vector<uint16_t> all16;
      DEEPINFER_CUDA_OK(out16.Download(&all16));
      const std::vector<uint16_t> got16(all16.begin() + offset, all16.begin() + offset + n);
      int64_t outside = 0;  // elements written around the output (poisoned: 0xFFFF)
      for (int64_t i = 0; i < static_cast<int64_t>(all16.size()); ++i) {
        outside += (i < offset || i >= offset + n) && all16[i] != 0xFFFFu;
      }
      EXPECT_EQ(outside, 0);
      int64_t differ = 0;
      std::vector<float> got(n);
      for (int64_t i = 0; i < n; ++i) {
        differ += got16[i] != FloatToBf16Bits(fp32_path[i]);
        got[i] = Bf16BitsToFloat(got16[i]);
      }
      EXPECT_EQ(differ, 0) << "not the fp32 path's rotated output rounded, bit for bit";
      // The fp32 path's bound plus the bf16 output's rounding: half an ulp, up to 2^-8 of the
      // value (a value just above a power of two).
      EXPECT_TRUE(WithinMagnitude(got, want, rotated_mag, 1.0 / 256 + 1e-4 + 1.0 / 256));
      for (int set = 0; set < DeviceBf16Rows::kSets; ++set) {
        kernels::SinkAttentionParams pr = pb;
        rows16.Set(set, &pr);
        pr.kernel = SinkAttentionKernel::kAuto;
        pr.out = dev->p.out;
        pr.out_bf16 = nullptr;
        EXPECT_EQ(kernels::SinkAttentionKernelFor(pr), SinkAttentionKernel::kTensorCoreBf16)
            << DeviceBf16Rows::SetName(set);
      }
      for (int set = 0; set < DeviceBf16Rows::kSets; ++set) {
        SCOPED_TRACE(::testing::Message()
                     << "tensor_core_bf16_prefill, " << set << " " << DeviceBf16Rows::SetName(set));
        kernels::SinkAttentionParams pr = pb;
        rows16.Set(set, &pr);
        pr.kernel = SinkAttentionKernel::kAuto;
        pr.prefill_blocks = set % 2 == 1 ? 2 : 0;  // every other token per block: the same bits
        EXPECT_EQ(kernels::SinkAttentionKernelFor(pr),
                  SinkAttentionKernel::kTensorCoreBf16Prefill);
        out16.Poison();
        DEEPINFER_CUDA_OK(kernels::SinkAttentionF32(pr, nullptr));
        std::vector<uint16_t> pre_all16;
        DEEPINFER_CUDA_OK(out16.Download(&pre_all16));
        int64_t pre_outside = 0, pre_differ = 0;
        for (int64_t i = 0; i < static_cast<int64_t>(pre_all16.size()); ++i) {
          pre_outside += (i < offset || i >= offset + n) && pre_all16[i] != 0xFFFFu;
        }
        EXPECT_EQ(pre_outside, 0);
        std::vector<float> pre(n);
        for (int64_t i = 0; i < n; ++i) {
          const uint16_t bits = pre_all16[offset + i];
          pre_differ += bits != FloatToBf16Bits(prefill_fp32_path[i]);
          pre[i] = Bf16BitsToFloat(bits);
        }
        EXPECT_EQ(pre_differ, 0) << "not its fp32 output rotated and rounded, bit for bit";
        EXPECT_TRUE(WithinMagnitude(pre, want, rotated_mag, 1.0 / 256 + 1e-4 + 1.0 / 256));
      }
      pb.num_splits = 3;
      EXPECT_EQ(kernels::SinkAttentionF32(pb, nullptr), cudaErrorInvalidValue);
      pb.num_splits = 1;
      for (SinkAttentionKernel k :
           {SinkAttentionKernel::kCudaCore, SinkAttentionKernel::kTensorCoreExact}) {
        EXPECT_FALSE(kernels::SinkAttentionKernelRuns(pb, k)) << KernelName(k);
      }
    }
  }
}

class SinkAttentionKernelTest : public ::testing::TestWithParam<Case> {};

TEST_P(SinkAttentionKernelTest, MatchesCpuV4Ops) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << c.name << " seed " << seed);
  const Inputs in = MakeInputs(c, seed);
  const std::vector<float> want = CpuReference(in, in.q, in.kv, in.ring, in.stream);
  const std::vector<double> mag = Magnitudes(in);
  std::vector<float> want_bf16;  // the CPU over the bf16 kernel's rounded operands
  if (c.dim == kernels::kSinkAttentionMmaDim) {
    std::vector<float> q16(in.q), kv16(in.kv), ring16(in.ring), stream16(in.stream);
    for (std::vector<float>* v : {&q16, &kv16, &ring16, &stream16}) {
      for (float& x : *v) x = RoundToBf16(x);
    }
    want_bf16 = CpuReference(in, q16, kv16, ring16, stream16);
  }

  DeviceInputs dev(in);
  ASSERT_TRUE(dev.out.ok() && dev.kv.ok());
  const DeviceBf16Rows rows16(in, dev.p);
  ASSERT_TRUE(rows16.ok());
  DeviceArray<float> workspace(in.tokens * in.heads * kernels::kMaxSinkAttentionSplits *
                               (in.dim + 2));
  ASSERT_TRUE(workspace.ok());
  for (SinkAttentionKernel k :
       {SinkAttentionKernel::kCudaCore, SinkAttentionKernel::kTensorCoreExact,
        SinkAttentionKernel::kTensorCoreBf16, SinkAttentionKernel::kTensorCoreBf16Prefill}) {
    kernels::SinkAttentionParams p = dev.p;
    p.kernel = k;
    const bool mma = k != SinkAttentionKernel::kCudaCore;
    const bool runs = kernels::SinkAttentionKernelRuns(p, k);
    // Every kernel runs the shapes it is for.
    EXPECT_EQ(runs, !mma || (c.dim == kernels::kSinkAttentionMmaDim && DeviceHasTensorCores()))
        << KernelName(k);
    if (!runs) continue;
    // kTensorCoreBf16Prefill: one split only (3 is refused), every set of bf16 copies; with one
    // block per token and with 3 blocks taking every third token each.
    const bool prefill = k == SinkAttentionKernel::kTensorCoreBf16Prefill;
    const bool copies = prefill;
    if (prefill) {
      p.num_splits = 3;
      EXPECT_FALSE(kernels::SinkAttentionKernelRuns(p, k));
    }
    const std::vector<int32_t> split_counts =
        prefill ? std::vector<int32_t>{0, 1}
                : std::vector<int32_t>{0, 1, 3, kernels::kMaxSinkAttentionSplits};
    for (size_t si = 0; si < split_counts.size(); ++si) {
      for (int set = 0; set < (copies ? DeviceBf16Rows::kSets : 1); ++set) {
        SCOPED_TRACE(::testing::Message() << KernelName(k) << " num_splits " << split_counts[si]
                                          << (prefill && si == 1 ? ", 3 blocks" : "")
                                          << (copies ? ", " : "")
                                          << (copies ? DeviceBf16Rows::SetName(set) : ""));
        p.num_splits = split_counts[si];
        p.prefill_blocks = prefill && si == 1 ? 3 : 0;
        if (copies) {
          rows16.Set(set, &p);
          ASSERT_TRUE(kernels::SinkAttentionKernelRuns(p, k));
        }
        size_t need = 0;
        ASSERT_EQ(kernels::SinkAttentionWorkspaceBytes(p, &need), cudaSuccess);
        ASSERT_LE(need, workspace.size() * sizeof(float));
        p.workspace = workspace.get();
        p.workspace_bytes = workspace.size() * sizeof(float);
        dev.out.Poison();
        workspace.Poison();
        DEEPINFER_CUDA_OK(kernels::SinkAttentionF32(p, nullptr));
        std::vector<float> got;
        DEEPINFER_CUDA_OK(dev.out.Download(&got));
        if (k == SinkAttentionKernel::kTensorCoreBf16 || copies) {
          EXPECT_TRUE(WithinMagnitude(got, want_bf16, mag, 1.0 / 256 + 1e-4));
        } else {
          EXPECT_TRUE(WithinMagnitude(got, want, mag, mma ? 1e-3 : 2e-4));
        }
      }
    }
  }
  // kAuto runs the exact tensor-core kernel where it can, else CUDA cores.
  EXPECT_EQ(kernels::SinkAttentionKernelFor(dev.p),
            c.dim == kernels::kSinkAttentionMmaDim && DeviceHasTensorCores()
                ? SinkAttentionKernel::kTensorCoreExact
                : SinkAttentionKernel::kCudaCore);
  EXPECT_EQ(kernels::SinkAttentionTakesBf16Io(c.dim),
            c.dim == kernels::kSinkAttentionMmaDim && DeviceHasTensorCores());
  if (kernels::SinkAttentionTakesBf16Io(c.dim)) {
    ExpectBf16QueryAndOutputMatch(in, want_bf16, mag, &dev, rows16, &workspace);
  }
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  Case c;
  c.name = "flash_decode_csa";  // 3 requests: window 128 + 512 of 700 entries
  c.seqs = 3;
  c.entries = 700;
  cases.push_back(c);
  c = Case();
  c.name = "flash_decode_hca";  // HCA: every one of 3000 entries
  c.entries = 3000;
  c.topk = 0;
  cases.push_back(c);
  c = Case();
  c.name = "flash_decode_hca_spread";  // HCA entries over 8 blocks of 64 floats (block 16)
  c.entries = 300;
  c.topk = 0;
  c.block_floats = 64;
  cases.push_back(c);
  c = Case();
  c.name = "flash_decode_csa_spread";  // a selection of entries spread over blocks
  c.entries = 700;
  c.block_floats = 128;
  c.tokens_per_seq = 2;
  cases.push_back(c);
  c = Case();
  c.name = "flash_prefill_csa";  // 2 sequences x 24 tokens from position 0: growing windows
  c.tokens_per_seq = 24;
  c.context = 0;
  cases.push_back(c);
  c = Case();
  c.name = "flash_prefill_hca_sharp";  // chunks after 60 positions, a sharper softmax
  c.tokens_per_seq = 9;
  c.context = 60;
  c.entries = 300;
  c.topk = 0;
  c.scale = 0.25f;
  cases.push_back(c);
  c = Case();
  c.name = "prefill_ring_stride_8";  // ring rows, entries over 16 blocks: every bf16 copy read
  c.tokens_per_seq = 5;
  c.context = 300;
  c.entries = 300;
  c.topk = 128;
  c.block_floats = 32;
  c.ring_pad = 8;
  cases.push_back(c);
  c = Case();
  c.name = "empty_lists";
  c.tokens_per_seq = 6;
  c.entries = 40;
  c.topk = 16;
  c.empty_tokens = true;
  cases.push_back(c);
  c = Case();
  c.name = "large_sinks";  // the sink takes almost all the weight
  c.sink_mean = 12.0f;
  c.entries = 200;
  c.topk = 0;
  cases.push_back(c);
  c = Case();
  c.name = "small_sinks";
  c.sink_mean = -30.0f;
  c.tokens_per_seq = 3;
  cases.push_back(c);
  c = Case();
  c.name = "heads_20";  // a head block not filled
  c.heads = 20;
  c.tokens_per_seq = 2;
  cases.push_back(c);
  c = Case();
  c.name = "heads_72";  // two head blocks of the tensor-core kernels, five of the CUDA-core one
  c.heads = 72;
  c.tokens_per_seq = 2;
  c.entries = 300;
  c.topk = 0;
  cases.push_back(c);
  c = Case();
  c.name = "fixture_shape";  // tests/fixtures/dsv4_mix: 4 heads x 64, window 16, top-k 8
  c.heads = 4;
  c.dim = 64;
  c.window = 16;
  c.entries = 30;
  c.topk = 8;
  c.tokens_per_seq = 5;
  c.context = 0;
  c.empty_tokens = true;
  cases.push_back(c);
  c.name = "fixture_shape_chunk";  // a chunk after 20 positions, HCA 16 at block 4: 16 floats
  c.context = 20;
  c.topk = 0;
  c.block_floats = 16;
  c.empty_tokens = false;
  cases.push_back(c);
  c = Case();
  c.name = "dim_1000";  // the CUDA-core kernel's widest column loop, a dim not a multiple of 32
  c.heads = 18;
  c.dim = 1000;
  c.entries = 50;
  c.topk = 0;
  cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, SinkAttentionKernelTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

TEST(SinkAttentionTest, SplitsNeedAWorkspace) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Case c;
  c.seqs = 1;
  const Inputs in = MakeInputs(c, 1);
  DeviceInputs dev(in);
  kernels::SinkAttentionParams p = dev.p;
  p.num_splits = 4;
  size_t need = 0;
  ASSERT_EQ(kernels::SinkAttentionWorkspaceBytes(p, &need), cudaSuccess);
  EXPECT_EQ(need, size_t{64} * 4 * 514 * sizeof(float));
  EXPECT_EQ(kernels::SinkAttentionF32(p, nullptr), cudaErrorInvalidValue);
  DeviceArray<float> small(need / sizeof(float) - 1);
  p.workspace = small.get();
  p.workspace_bytes = need - sizeof(float);
  EXPECT_EQ(kernels::SinkAttentionF32(p, nullptr), cudaErrorInvalidValue);
  p.num_splits = kernels::kMaxSinkAttentionSplits + 1;
  EXPECT_EQ(kernels::SinkAttentionF32(p, nullptr), cudaErrorInvalidValue);
  // One split needs none.
  p.num_splits = 1;
  ASSERT_EQ(kernels::SinkAttentionWorkspaceBytes(p, &need), cudaSuccess);
  EXPECT_EQ(need, 0u);
  p.workspace = nullptr;
  p.workspace_bytes = 0;
  EXPECT_EQ(kernels::SinkAttentionF32(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  // A forced kernel that cannot run the shape is an error, not a silent fallback.
  p.kernel = SinkAttentionKernel::kTensorCoreExact;
  p.dim = 256;
  EXPECT_EQ(kernels::SinkAttentionKernelFor(p), SinkAttentionKernel::kAuto);
  EXPECT_EQ(kernels::SinkAttentionF32(p, nullptr), cudaErrorInvalidValue);
}

// SinkAttentionEntriesToBf16: block j of table row s, rounded, at compact block s * stride + j,
// and that index in the compact tables (NaN blocks stay NaN).
TEST(SinkAttentionTest, EntriesToBf16CopiesEveryTableBlock) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Case c;
  c.seqs = 3;
  c.block_floats = 64;
  const Inputs in = MakeInputs(c, testing::FreshSeed());
  DeviceInputs dev(in);
  const DeviceBf16Rows rows16(in, dev.p);
  ASSERT_TRUE(rows16.ok());
  std::vector<uint16_t> got;
  std::vector<int32_t> tables;
  DEEPINFER_CUDA_OK(rows16.compact.Download(&got));
  DEEPINFER_CUDA_OK(rows16.compact_tables.Download(&tables));
  const int64_t P = in.block_floats;
  ASSERT_EQ(static_cast<int64_t>(got.size()), static_cast<int64_t>(in.tables.size()) * P);
  int64_t differ = 0;
  for (size_t b = 0; b < in.tables.size(); ++b) {
    EXPECT_EQ(tables[b], static_cast<int32_t>(b));
    for (int64_t i = 0; i < P; ++i) {
      const float x = in.stream[int64_t{in.tables[b]} * P + i];
      const uint16_t g = got[b * P + i];
      differ += std::isnan(x) ? !std::isnan(Bf16BitsToFloat(g)) : g != FloatToBf16Bits(x);
    }
  }
  EXPECT_EQ(differ, 0);
  // Bad arguments.
  EXPECT_EQ(kernels::SinkAttentionEntriesToBf16(dev.p.entries, -1, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::SinkAttentionEntriesToBf16(dev.p.entries, 1, nullptr, nullptr, nullptr),
            cudaErrorInvalidValue);
}

// A call captured in a CUDA graph (after an eager call, as the decode graphs are captured after
// a warm-up) and replayed gives the eager call's output bit for bit.
TEST(SinkAttentionTest, GraphReplayMatchesEagerCall) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Case c;
  c.seqs = 2;
  const Inputs in = MakeInputs(c, testing::FreshSeed());
  DeviceInputs dev(in);
  kernels::SinkAttentionParams p = dev.p;
  size_t need = 0;
  ASSERT_EQ(kernels::SinkAttentionWorkspaceBytes(p, &need), cudaSuccess);
  DeviceArray<float> workspace(need / sizeof(float) + 1);
  p.workspace = workspace.get();
  p.workspace_bytes = need;
  cudaStream_t stream;
  DEEPINFER_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DEEPINFER_CUDA_OK(kernels::SinkAttentionF32(p, stream));
  DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<float> eager, replayed;
  DEEPINFER_CUDA_OK(dev.out.Download(&eager));
  dev.out.Poison();
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
  cudaGraph_t graph;
  DEEPINFER_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const cudaError_t launched = kernels::SinkAttentionF32(p, stream);
  DEEPINFER_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  DEEPINFER_CUDA_OK(launched);
  cudaGraphExec_t exec;
  DEEPINFER_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  DEEPINFER_CUDA_OK(cudaGraphLaunch(exec, stream));
  DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
  DEEPINFER_CUDA_OK(dev.out.Download(&replayed));
  EXPECT_EQ(replayed, eager);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace deepinfer
