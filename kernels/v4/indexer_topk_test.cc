// IndexerTopKF32 against CpuV4Ops::IndexerTopK on random inputs shaped as V4Attention passes them
// (worker/model/deepseek_v4/v4_attention.cc): each sequence's keys in a paged stream (its blocks
// scattered over a pool with NaN spare blocks; several keys a block, or keys spread over two
// blocks), decode tokens each over its own sequence's keys (fewer, as many and more candidates
// than the top-k; 8192 candidates: a 32K context at ratio 4), a prefill chunk whose tokens share
// one sequence's keys with growing visible counts (and candidates past the visible ones, as with
// full-forward ties), the fixtures' small shape, head counts over one chunk of 64 and dims that
// are not a multiple of 4; every score order (kTensorCoreBf16 against the CPU over the
// bf16-rounded query and keys, and bit for bit kSequential's scores and selections on inputs
// whose dot products are exact in any order).
//
// The selections must be the CPU's wherever the scores at the k-th place are apart: the k-th
// and (k+1)-th largest scores (computed here in double) differ by more than the scores' rounding
// (kSequential: the CPU's own arithmetic, 1e-6 of the largest |score|; kFma: fp32 sums in
// another rounding, 1e-4). Where they are closer, the GPU's choice must be a valid top-k: k
// ascending distinct visible indices, none scoring below the k-th score minus that tolerance
// and none left out scoring above it plus the tolerance. Separate tests: exact ties (duplicated
// keys; the GPU takes the lowest indices of a tie, checked as such) and a NaN score (chosen
// first, as torch.topk and the CPU choose it).
#include "kernels/v4/indexer_topk.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_v4_ops.h"
#include "worker/backend/cpu/thread_pool.h"
#include "worker/backend/v4_ops.h"

namespace deepinfer {
namespace {

// Whether the device is sm_80+, where kTensorCoreBf16 must run (IndexerTopKTensorCoreRuns).
bool TensorCoreExpected() {
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) {
    return false;
  }
  return major >= 8;
}

using kernels::IndexerScoreOrder;
using testing::DeviceArray;

// The inputs of one call on the host: the keys as one matrix (a pool of rows per sequence from
// key_begin), paged for the call by Paged.
struct Inputs {
  int64_t tokens = 0, heads = 0, dim = 0, topk = 0, max_candidates = 0;
  float weight_scale = 1.0f, key_scale = 1.0f;
  std::vector<float> q, weights, keys;
  std::vector<int32_t> key_begin, candidates, visible;
  int64_t block_floats = 0;  // of the paged stream (0: 4 keys a block)
};

// The keys of Inputs in a paged stream: sequence s (the s-th distinct key_begin) holds its pool's
// rows, elements paged over blocks of block_floats scattered over the stream (a spare block per
// sequence, NaN).
struct PagedKeys {
  std::vector<float> stream;
  std::vector<int32_t> tables, token_seq;
  int64_t block_floats = 0, table_stride = 0;
};

PagedKeys Paged(const Inputs& in, uint32_t seed) {
  PagedKeys pk;
  pk.block_floats = in.block_floats > 0 ? in.block_floats : 4 * in.dim;
  std::vector<int32_t> begins;
  std::vector<int64_t> lengths;
  for (int64_t t = 0; t < in.tokens; ++t) {
    if (begins.empty() || begins.back() != in.key_begin[t]) {
      begins.push_back(in.key_begin[t]);
      lengths.push_back(0);
    }
    pk.token_seq.push_back(static_cast<int32_t>(begins.size() - 1));
    lengths.back() = std::max<int64_t>(lengths.back(), in.candidates[t]);
  }
  int64_t most = 0;
  for (int64_t n : lengths)
    most = std::max(most, (n * in.dim + pk.block_floats - 1) / pk.block_floats);
  pk.table_stride = most + 1;
  const int64_t seqs = static_cast<int64_t>(begins.size());
  std::vector<int32_t> pool(std::max<int64_t>(1, seqs * pk.table_stride));
  std::iota(pool.begin(), pool.end(), 0);
  std::mt19937 gen(seed);
  std::shuffle(pool.begin(), pool.end(), gen);
  pk.tables = pool;
  pk.stream.assign(pool.size() * pk.block_floats, std::numeric_limits<float>::quiet_NaN());
  for (int64_t s = 0; s < seqs; ++s) {
    const int32_t* table = pk.tables.data() + s * pk.table_stride;
    for (int64_t e = 0; e < lengths[s] * in.dim; ++e) {
      pk.stream[int64_t{table[e / pk.block_floats]} * pk.block_floats + e % pk.block_floats] =
          in.keys[begins[s] * in.dim + e];
    }
  }
  return pk;
}

// One query token: `candidates` keys of which `visible` count, in a pool of its own or shared
// with the previous token (share: the same key_begin).
struct Query {
  int32_t candidates, visible;
  bool share = false;
};

Inputs MakeInputs(int64_t heads, int64_t dim, int64_t topk, const std::vector<Query>& queries,
                  uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Inputs in;
  in.tokens = static_cast<int64_t>(queries.size());
  in.heads = heads;
  in.dim = dim;
  in.topk = topk;
  in.weight_scale = 1.0f / std::sqrt(static_cast<float>(heads));
  in.key_scale = 1.0f / std::sqrt(static_cast<float>(dim));
  int64_t rows = 0;
  for (const Query& qu : queries) {
    if (!qu.share || in.key_begin.empty()) {
      // A gap row before each pool: a kernel reading past a pool reads other keys, not these.
      rows += 1;
      in.key_begin.push_back(static_cast<int32_t>(rows));
      rows += qu.candidates;
    } else {
      in.key_begin.push_back(in.key_begin.back());
    }
    in.candidates.push_back(qu.candidates);
    in.visible.push_back(qu.visible);
    in.max_candidates = std::max<int64_t>(in.max_candidates, qu.visible);
  }
  in.keys.resize(rows * dim);
  for (float& x : in.keys) x = normal(gen);
  in.q.resize(in.tokens * heads * dim);
  for (float& x : in.q) x = normal(gen);
  in.weights.resize(in.tokens * heads);
  for (float& x : in.weights) x = normal(gen);
  return in;
}

std::vector<int32_t> CpuSelection(const Inputs& in) {
  ThreadPool pool(0);
  CpuV4Ops ops(&pool);
  std::vector<int32_t> sel(in.tokens * in.topk);
  const PagedKeys pk = Paged(in, 1);
  IndexerTopKArgs a;
  a.tokens = in.tokens;
  a.heads = in.heads;
  a.dim = in.dim;
  a.topk = in.topk;
  a.q = in.q.data();
  a.weights = in.weights.data();
  a.weight_scale = in.weight_scale;
  a.key_scale = in.key_scale;
  a.keys = {pk.stream.data(), pk.block_floats, pk.tables.data(), pk.table_stride,
            pk.token_seq.data()};
  a.candidates = in.candidates.data();
  a.visible = in.visible.data();
  a.max_candidates = in.max_candidates;
  a.selected = sel.data();
  ops.IndexerTopK(a);
  return sel;
}

// Token t's scores of its visible candidates, in double.
std::vector<double> Scores(const Inputs& in, int64_t t) {
  const int64_t v = std::min(in.visible[t], in.candidates[t]);
  std::vector<double> s(std::max<int64_t>(v, 0), 0.0);
  for (int64_t i = 0; i < v; ++i) {
    const float* k = in.keys.data() + (in.key_begin[t] + i) * in.dim;
    for (int64_t h = 0; h < in.heads; ++h) {
      const float* q = in.q.data() + (t * in.heads + h) * in.dim;
      double dot = 0.0;
      for (int64_t d = 0; d < in.dim; ++d) dot += static_cast<double>(q[d]) * k[d];
      s[i] += std::max(dot, 0.0) * in.key_scale *
              (static_cast<double>(in.weights[t * in.heads + h]) * in.weight_scale);
    }
  }
  return s;
}

// Checks token t's selection `got` against the CPU's `want` as the top of this file says.
::testing::AssertionResult SelectionOk(const Inputs& in, int64_t t, const int32_t* got,
                                       const int32_t* want, double rel_tol) {
  const std::vector<double> s = Scores(in, t);
  const int64_t v = static_cast<int64_t>(s.size());
  const int64_t k = std::min<int64_t>(in.topk, v);
  std::vector<double> sorted(s);
  std::sort(sorted.begin(), sorted.end(), std::greater<double>());
  double largest = 0.0;
  for (double x : s) largest = std::max(largest, std::fabs(x));
  const double tol = rel_tol * largest;
  // The shape every selection has: k ascending distinct visible indices, then -1.
  for (int64_t i = 0; i < in.topk; ++i) {
    if (i < k) {
      if (got[i] < 0 || got[i] >= v || (i > 0 && got[i] <= got[i - 1])) {
        return ::testing::AssertionFailure() << "token " << t << " entry " << i << " = " << got[i];
      }
    } else if (got[i] != -1) {
      return ::testing::AssertionFailure()
             << "token " << t << " entry " << i << " = " << got[i] << ", want -1 after " << k;
    }
  }
  if (k == 0 || k == v) {
    return std::equal(got, got + in.topk, want) ? ::testing::AssertionSuccess()
                                                : ::testing::AssertionFailure() << "token " << t;
  }
  const double kth = sorted[k - 1], next = sorted[k];
  if (kth - next > tol) {
    for (int64_t i = 0; i < in.topk; ++i) {
      if (got[i] != want[i]) {
        return ::testing::AssertionFailure()
               << "token " << t << " entry " << i << ": got " << got[i] << " want " << want[i]
               << " (k-th score " << kth << ", next " << next << ")";
      }
    }
    return ::testing::AssertionSuccess();
  }
  // A near-tie at the k-th place: any valid top-k.
  std::vector<bool> chosen(v, false);
  for (int64_t i = 0; i < k; ++i) chosen[got[i]] = true;
  for (int64_t i = 0; i < v; ++i) {
    if (chosen[i] ? s[i] < kth - tol : s[i] > kth + tol) {
      return ::testing::AssertionFailure()
             << "token " << t << " candidate " << i << " score " << s[i]
             << (chosen[i] ? " chosen" : " left out") << ", k-th score " << kth;
    }
  }
  return ::testing::AssertionSuccess();
}

// The device copies of an Inputs and the params over them.
struct DeviceInputs {
  explicit DeviceInputs(const Inputs& in) : DeviceInputs(in, Paged(in, 2)) {}
  DeviceInputs(const Inputs& in, const PagedKeys& pk)
      : q(in.q),
        weights(in.weights),
        stream(pk.stream),
        tables(pk.tables),
        token_seq(pk.token_seq),
        candidates(in.candidates),
        visible(in.visible),
        selected(in.tokens * in.topk),
        workspace(in.tokens * in.max_candidates) {
    p.tokens = in.tokens;
    p.heads = in.heads;
    p.dim = in.dim;
    p.topk = in.topk;
    p.q = q.get();
    p.weights = weights.get();
    p.weight_scale = in.weight_scale;
    p.key_scale = in.key_scale;
    p.keys = {stream.get(), pk.block_floats, tables.get(), pk.table_stride, token_seq.get()};
    p.candidates = candidates.get();
    p.visible = visible.get();
    p.selected = selected.get();
    p.max_candidates = in.max_candidates;
    p.workspace = workspace.get();
    p.workspace_bytes = kernels::IndexerTopKWorkspaceBytes(p);
  }
  DeviceArray<float> q, weights, stream;
  DeviceArray<int32_t> tables, token_seq, candidates, visible, selected;
  DeviceArray<float> workspace;
  kernels::IndexerTopKParams p;
};

std::vector<int32_t> RunGpu(DeviceInputs* dev, IndexerScoreOrder order) {
  kernels::IndexerTopKParams p = dev->p;
  p.order = order;
  dev->selected.Poison();
  dev->workspace.Poison();
  std::vector<int32_t> got;
  EXPECT_EQ(kernels::IndexerTopKF32(p, nullptr), cudaSuccess);
  EXPECT_EQ(dev->selected.Download(&got), cudaSuccess);
  return got;
}

struct Case {
  std::string name;
  int64_t heads = 64, dim = 128, topk = 512;
  std::vector<Query> queries;
  int64_t block_floats = 0;  // Inputs::block_floats
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class IndexerTopKKernelTest : public ::testing::TestWithParam<Case> {};

TEST_P(IndexerTopKKernelTest, MatchesCpuV4Ops) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << c.name << " seed " << seed);
  Inputs in = MakeInputs(c.heads, c.dim, c.topk, c.queries, seed);
  in.block_floats = c.block_floats;
  const std::vector<int32_t> want = CpuSelection(in);
  DeviceInputs dev(in);
  ASSERT_TRUE(dev.stream.ok() && dev.workspace.ok());
  for (IndexerScoreOrder order : {IndexerScoreOrder::kSequential, IndexerScoreOrder::kFma}) {
    const bool fma = order == IndexerScoreOrder::kFma;
    SCOPED_TRACE(fma ? "kFma" : "kSequential");
    const std::vector<int32_t> got = RunGpu(&dev, order);
    ASSERT_EQ(got.size(), want.size());
    for (int64_t t = 0; t < in.tokens; ++t) {
      EXPECT_TRUE(SelectionOk(in, t, got.data() + t * in.topk, want.data() + t * in.topk,
                              fma ? 1e-4 : 1e-6));
    }
  }
  if (!kernels::IndexerTopKTensorCoreRuns()) {
    ASSERT_FALSE(TensorCoreExpected())
        << "an sm_80+ device, but the tensor-core order does not run";
    return;  // below sm_80 the order does not exist
  }
  // kTensorCoreBf16 against the CPU over the query and keys rounded to bf16 (its operands: the
  // scores then differ by the fp32 sums' order only, tolerance as kFma's).
  Inputs in16 = in;
  for (std::vector<float>* v : {&in16.q, &in16.keys}) {
    for (float& x : *v) x = RoundToBf16(x);
  }
  const std::vector<int32_t> want16 = CpuSelection(in16);
  DeviceInputs dev16(in16);
  ASSERT_TRUE(dev16.stream.ok() && dev16.workspace.ok());
  {
    SCOPED_TRACE("kTensorCoreBf16");
    const std::vector<int32_t> got = RunGpu(&dev16, IndexerScoreOrder::kTensorCoreBf16);
    ASSERT_EQ(got.size(), want16.size());
    for (int64_t t = 0; t < in.tokens; ++t) {
      EXPECT_TRUE(
          SelectionOk(in16, t, got.data() + t * in.topk, want16.data() + t * in.topk, 1e-4));
    }
  }
  // On a query and keys of few significant bits (multiples of 1/8 up to 2: every dot product
  // exact in fp32 whatever the order of its sums), kTensorCoreBf16's scores are kSequential's bit
  // for bit, and so are its selections, ties included.
  Inputs exact = in;
  for (std::vector<float>* v : {&exact.q, &exact.keys}) {
    for (float& x : *v) x = std::clamp(std::round(x * 4.0f), -16.0f, 16.0f) / 8.0f;
  }
  DeviceInputs dev_exact(exact);
  ASSERT_TRUE(dev_exact.stream.ok() && dev_exact.workspace.ok());
  std::vector<float> seq_scores, tc_scores;
  const std::vector<int32_t> seq = RunGpu(&dev_exact, IndexerScoreOrder::kSequential);
  ASSERT_EQ(dev_exact.workspace.Download(&seq_scores), cudaSuccess);
  const std::vector<int32_t> tc = RunGpu(&dev_exact, IndexerScoreOrder::kTensorCoreBf16);
  ASSERT_EQ(dev_exact.workspace.Download(&tc_scores), cudaSuccess);
  EXPECT_EQ(tc, seq) << "exact inputs: kTensorCoreBf16's selection is not kSequential's";
  ASSERT_EQ(tc_scores.size(), seq_scores.size());
  EXPECT_EQ(0, std::memcmp(tc_scores.data(), seq_scores.data(), tc_scores.size() * sizeof(float)))
      << "exact inputs: kTensorCoreBf16's scores are not kSequential's (unscored slots: both "
         "poisoned)";
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  Case c;
  c.name = "flash_decode";  // V4-Flash: 64 heads x 128, top-512; 4 requests
  c.queries = {{2000, 2000}, {512, 512}, {300, 300}, {0, 0}, {513, 513}};
  cases.push_back(c);
  c = Case();
  c.name = "flash_decode_spread";  // each key over two blocks of 64 floats
  c.queries = {{700, 700}, {513, 513}};
  c.block_floats = 64;
  cases.push_back(c);
  c = Case();
  c.name = "flash_decode_32k";  // 8192 entries: a 32K context at ratio 4
  c.queries = {{8192, 8192}, {8192, 8000}};
  cases.push_back(c);
  c = Case();
  c.name = "flash_prefill_chunk";  // one sequence's 40 tokens over its 1000 entries
  for (int32_t i = 0; i < 40; ++i) {
    // Visible grows with the position; half the tokens also see the later entries as
    // candidates (scored -inf on the CPU, never chosen).
    c.queries.push_back({i % 2 == 0 ? 1000 : 25 * (i + 1), 25 * (i + 1), i > 0});
  }
  cases.push_back(c);
  c = Case();
  c.name = "fixture_shape";  // tests/fixtures/dsv4_mix: 4 heads x 32, top-8
  c.heads = 4;
  c.dim = 32;
  c.topk = 8;
  c.queries = {{3, 3}, {8, 8}, {30, 30}, {30, 20, true}, {100, 100}};
  cases.push_back(c);
  c = Case();
  c.name = "odd_shapes";  // 72 heads (two chunks of 64), dim 30 (a tail of 2 in the last 4)
  c.heads = 72;
  c.dim = 30;
  c.topk = 100;
  c.queries = {{700, 700}, {129, 129}, {101, 101}, {100, 100}};
  cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Shapes, IndexerTopKKernelTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

// Exact ties: the keys are 7 distinct rows repeated, so scores tie in groups and the k-th place
// falls inside a group. The GPU must choose a valid top-k, and of the group at the k-th place
// the lowest indices.
TEST(IndexerTopKTest, TiesTakeTheLowestIndices) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Inputs in = MakeInputs(64, 128, 50, {{400, 400}, {333, 300}}, seed);
  for (int64_t t = 0; t < in.tokens; ++t) {
    for (int64_t i = 7; i < in.candidates[t]; ++i) {
      std::copy_n(in.keys.begin() + (in.key_begin[t] + i % 7) * in.dim, in.dim,
                  in.keys.begin() + (in.key_begin[t] + i) * in.dim);
    }
  }
  DeviceInputs dev(in);
  for (IndexerScoreOrder order : {IndexerScoreOrder::kSequential, IndexerScoreOrder::kFma}) {
    const std::vector<int32_t> got = RunGpu(&dev, order);
    for (int64_t t = 0; t < in.tokens; ++t) {
      const std::vector<double> s = Scores(in, t);
      const int32_t* sel = got.data() + t * in.topk;
      // Valid: 50 ascending distinct indices; every chosen score >= every unchosen one (the
      // duplicated rows score identically on the GPU, so no tolerance is needed).
      std::vector<bool> chosen(s.size(), false);
      for (int64_t i = 0; i < in.topk; ++i) {
        ASSERT_GE(sel[i], 0) << "token " << t << " entry " << i;
        ASSERT_LT(sel[i], static_cast<int32_t>(s.size()));
        if (i > 0) {
          ASSERT_GT(sel[i], sel[i - 1]);
        }
        chosen[sel[i]] = true;
      }
      double min_chosen = std::numeric_limits<double>::infinity();
      double max_left = -std::numeric_limits<double>::infinity();
      for (size_t i = 0; i < s.size(); ++i) {
        if (chosen[i]) {
          min_chosen = std::min(min_chosen, s[i]);
        } else {
          max_left = std::max(max_left, s[i]);
        }
      }
      EXPECT_GE(min_chosen, max_left) << "token " << t;
      // The group at the k-th place (scores equal to the smallest chosen) is split: its chosen
      // members are its lowest indices.
      bool left_one = false;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] != min_chosen) continue;
        if (!chosen[i]) left_one = true;
        EXPECT_FALSE(chosen[i] && left_one) << "token " << t << " chose " << i << " past a tie";
      }
    }
  }
}

// A NaN score (a NaN in a key) ranks above every number, as torch.topk and the CPU rank it.
TEST(IndexerTopKTest, NanScoresAreChosenFirst) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Inputs in = MakeInputs(8, 16, 4, {{50, 50}}, 7);
  in.keys[(in.key_begin[0] + 31) * in.dim + 3] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<int32_t> want = CpuSelection(in);
  DeviceInputs dev(in);
  for (IndexerScoreOrder order : {IndexerScoreOrder::kSequential, IndexerScoreOrder::kFma,
                                  IndexerScoreOrder::kTensorCoreBf16}) {
    if (order == IndexerScoreOrder::kTensorCoreBf16 && !kernels::IndexerTopKTensorCoreRuns()) {
      ASSERT_FALSE(TensorCoreExpected())
          << "an sm_80+ device, but the tensor-core order does not run";
      continue;  // below sm_80 the order does not exist
    }
    const std::vector<int32_t> got = RunGpu(&dev, order);
    EXPECT_NE(std::find(got.begin(), got.end(), 31), got.end());
    EXPECT_NE(std::find(want.begin(), want.end(), 31), want.end());
  }
}

TEST(IndexerTopKTest, RejectsBadParams) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Inputs in = MakeInputs(4, 32, 8, {{30, 30}}, 3);
  DeviceInputs dev(in);
  kernels::IndexerTopKParams p = dev.p;
  p.workspace_bytes -= 1;
  EXPECT_EQ(kernels::IndexerTopKF32(p, nullptr), cudaErrorInvalidValue);
  p = dev.p;
  p.topk = 0;
  EXPECT_EQ(kernels::IndexerTopKF32(p, nullptr), cudaErrorInvalidValue);
  p = dev.p;
  p.keys.data = nullptr;
  EXPECT_EQ(kernels::IndexerTopKF32(p, nullptr), cudaErrorInvalidValue);
  p = dev.p;
  p.tokens = 0;
  EXPECT_EQ(kernels::IndexerTopKF32(p, nullptr), cudaSuccess);
}

// A call captured in a CUDA graph and replayed gives the eager call's selection.
TEST(IndexerTopKTest, GraphReplayMatchesEagerCall) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Inputs in = MakeInputs(64, 128, 512, {{3000, 3000}, {700, 650}}, testing::FreshSeed());
  DeviceInputs dev(in);
  cudaStream_t stream;
  DEEPINFER_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  DEEPINFER_CUDA_OK(kernels::IndexerTopKF32(dev.p, stream));
  DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
  std::vector<int32_t> eager, replayed;
  DEEPINFER_CUDA_OK(dev.selected.Download(&eager));
  dev.selected.Poison();
  DEEPINFER_CUDA_OK(cudaDeviceSynchronize());
  cudaGraph_t graph;
  DEEPINFER_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  const cudaError_t launched = kernels::IndexerTopKF32(dev.p, stream);
  DEEPINFER_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  DEEPINFER_CUDA_OK(launched);
  cudaGraphExec_t exec;
  DEEPINFER_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  DEEPINFER_CUDA_OK(cudaGraphLaunch(exec, stream));
  DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
  DEEPINFER_CUDA_OK(dev.selected.Download(&replayed));
  EXPECT_EQ(replayed, eager);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

}  // namespace
}  // namespace deepinfer
