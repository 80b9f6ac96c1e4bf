// MlaDecodeSmall's two forms against CpuBackend::MlaAttention (fp32 dot products, double P·V
// sums) over the same bf16 cache values: 1, 2, 3, 4 and 8 decode tokens over contexts of 1, 2, 3,
// 15, 33, 1024, 1025 and 4096 positions and mixed lengths (the tensor-core form's 32-key tiles
// partly filled), two tokens of one sequence (different context lengths), blocks of 16 and 64 in
// shuffled (random) block tables with blocks no sequence owns, 16 and 128 heads and head counts
// that do not fill a head group (the tensor-core form then runs the CUDA-core one); every
// cluster size and heads-per-block choice; the cache's unwritten slots and the output poisoned
// (NaN); repeated calls and CUDA graph replays give the same bits as the first call; unsupported
// shapes and options are rejected.
//
// Over an FP8 cache (entries written by the host's QuantizeFp8LatentEntry, one scale per token):
// contexts 1, 33, 1000 and 1280 (and two tokens of mixed contexts), 16 and 128 heads, blocks of 16
// and 64, every CUDA-core shape: the output is bit for bit MlaDecodeSmall's over a bf16 cache
// holding the host-dequantised entries rounded to bf16 (DequantizeFp8LatentEntry, nearest even;
// what GatherFp8LatentCacheBf16 writes), and within the bf16 cache's tolerance of
// CpuBackend::MlaAttention reading the FP8 cache itself where every token's scale is a power of
// two (the entries' values are then exact in bf16), of the CPU over the rounded entries where the
// scales are arbitrary. The tensor-core form is not taken for FP8 caches (the CUDA-core one runs).
#include "kernels/attention/mla_decode_small.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/fp8_latent_entry.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::DeviceArray;

constexpr int32_t kLatent = kernels::kMlaDecodeSmallLatent, kRope = kernels::kMlaDecodeSmallRope;
constexpr int32_t kNope = 128;
// As mla_attention_test's bf16-cache bound (the tensor-core kernel's); fp32 CUDA-core math
// lands far inside it.
constexpr double kAtol = 1e-4, kRtol = 5e-4;
constexpr kernels::MlaDecodeSmallForm kCudaCore = kernels::MlaDecodeSmallForm::kCudaCore;
constexpr kernels::MlaDecodeSmallForm kTensorCore = kernels::MlaDecodeSmallForm::kTensorCore;

// The tensor-core form rounds Q and P to bf16 (nearest even) before the MMAs, so it is checked
// against the CPU reference run on Q rounded to bf16 (as mla_attention_test checks the key-split
// kernel): its scores then differ only in fp32 summation order (within kAtol / kRtol, as the
// CUDA-core form), and what remains is P's rounding in the numerator of
// out = sum_j p_j v_j / sum_j p_j (the denominator sums the unrounded fp32 p_j):
// p'_j = p_j (1 + e_j), |e_j| <= 2^-9, so |out' - out| <= 2^-9 max_j |v_j| (v: the cached
// latents). The cluster merge rescales fp32 partials and adds nothing of this order. A wrong
// key, weight or column moves outputs by ~0.1-1 (N(0, 1) data).
double Bf16OperandsAtol(double max_abs_latent) { return max_abs_latent / 512.0 + kAtol; }

struct Query {
  int32_t seq, context;  // the token's sequence and the positions it sees
};

struct Case {
  std::string name;
  int32_t heads;
  int32_t block_size;
  std::vector<int32_t> seq_len;
  std::vector<Query> queries;  // empty: one query per sequence, seeing all of it
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Device inputs of a case and the CPU reference's output.
struct Problem {
  kernels::MlaAttentionParams params;
  std::vector<float> want;
  // The reference on Q rounded to bf16, and the tensor-core form's tolerance for it.
  std::vector<float> want_bf16_q;
  double bf16_q_atol = 0;
  std::unique_ptr<DeviceArray<float>> q_latent, q, out;
  std::unique_ptr<DeviceArray<int32_t>> tables, token_seq, context_len;
  std::unique_ptr<DeviceArray<uint16_t>> cache;
};

uint16_t Bf16Bits(float f) {  // nearest even (finite inputs)
  uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

void Build(const Case& s, uint32_t seed, Problem* pr) {
  const int32_t bs = s.block_size;
  int32_t max_blocks = 0, num_blocks = 0;
  for (int32_t len : s.seq_len) {
    const int32_t n = (len + bs - 1) / bs;
    max_blocks = std::max(max_blocks, n);
    num_blocks += n;
  }
  num_blocks += 3;  // blocks no sequence owns (poisoned: must never be read)
  std::mt19937 gen(seed);
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), gen);
  const size_t num_seqs = s.seq_len.size();
  std::vector<int32_t> tables(num_seqs * max_blocks, 0);
  int next = 0;
  for (size_t q = 0; q < num_seqs; ++q) {
    for (int32_t b = 0; b * bs < s.seq_len[q]; ++b) tables[q * max_blocks + b] = perm[next++];
  }
  std::vector<Query> queries = s.queries;
  if (queries.empty()) {
    for (size_t q = 0; q < num_seqs; ++q)
      queries.push_back({static_cast<int32_t>(q), s.seq_len[q]});
  }
  std::vector<int32_t> token_seq, context_len;
  for (const Query& q : queries) {
    token_seq.push_back(q.seq);
    context_len.push_back(q.context);
  }
  const int64_t tokens = static_cast<int64_t>(queries.size());
  const int64_t entry = kLatent + kRope;
  // The cache: every written slot a random bf16 value, the rest 0xFFFF (NaN).
  const size_t cache_elems = static_cast<size_t>(num_blocks) * bs * entry;
  std::vector<uint16_t> cache(cache_elems, 0xFFFFu);
  std::vector<float> values = testing::RandomFloats(cache_elems, seed + 1);
  for (size_t q = 0; q < num_seqs; ++q) {
    for (int32_t p = 0; p < s.seq_len[q]; ++p) {
      const int64_t slot = static_cast<int64_t>(tables[q * max_blocks + p / bs]) * bs + p % bs;
      for (int64_t i = 0; i < entry; ++i) {
        cache[slot * entry + i] = Bf16Bits(values[slot * entry + i]);
      }
    }
  }
  const int64_t qk = kNope + kRope, qdim = s.heads * qk;
  auto q_latent = testing::RandomFloats(tokens * s.heads * kLatent, seed + 2);
  auto q = testing::RandomFloats(tokens * qdim, seed + 3);
  const float scale = 0.0721f;

  CpuBackend cpu(2);
  MlaAttentionArgs a;
  a.num_tokens = static_cast<int32_t>(tokens);
  a.num_heads = s.heads;
  a.q_latent = q_latent.data();
  a.q_rope = q.data() + kNope;
  a.q_rope_token_stride = qdim;
  a.q_rope_head_stride = qk;
  a.cache = {cache.data(), bs, kLatent, kRope, WeightDType::kBFloat16};
  a.block_tables = tables.data();
  a.max_blocks_per_seq = max_blocks;
  a.token_seq = token_seq.data();
  a.context_len = context_len.data();
  a.softmax_scale = scale;
  pr->want.assign(tokens * s.heads * kLatent, 0.0f);
  a.out_latent = pr->want.data();
  cpu.MlaAttention(a);
  std::vector<float> q_latent_bf16 = q_latent, q_bf16 = q;
  for (float& x : q_latent_bf16) x = RoundToBf16(x);
  for (float& x : q_bf16) x = RoundToBf16(x);
  a.q_latent = q_latent_bf16.data();
  a.q_rope = q_bf16.data() + kNope;
  pr->want_bf16_q.assign(pr->want.size(), 0.0f);
  a.out_latent = pr->want_bf16_q.data();
  cpu.MlaAttention(a);
  double max_abs = 0;
  for (size_t q = 0; q < num_seqs; ++q) {
    for (int32_t p = 0; p < s.seq_len[q]; ++p) {
      const int64_t slot = static_cast<int64_t>(tables[q * max_blocks + p / bs]) * bs + p % bs;
      for (int64_t i = 0; i < kLatent; ++i) {
        max_abs = std::max<double>(max_abs, std::fabs(Bf16BitsToFloat(cache[slot * entry + i])));
      }
    }
  }
  pr->bf16_q_atol = Bf16OperandsAtol(max_abs);

  pr->q_latent = std::make_unique<DeviceArray<float>>(q_latent);
  pr->q = std::make_unique<DeviceArray<float>>(q);
  pr->out = std::make_unique<DeviceArray<float>>(pr->want.size());
  pr->tables = std::make_unique<DeviceArray<int32_t>>(tables);
  pr->token_seq = std::make_unique<DeviceArray<int32_t>>(token_seq);
  pr->context_len = std::make_unique<DeviceArray<int32_t>>(context_len);
  pr->cache = std::make_unique<DeviceArray<uint16_t>>(cache);

  kernels::MlaAttentionParams& p = pr->params;
  p.num_tokens = static_cast<int32_t>(tokens);
  p.num_heads = s.heads;
  p.q_latent = pr->q_latent->get();
  p.q_rope = pr->q->get() + kNope;
  p.q_rope_token_stride = qdim;
  p.q_rope_head_stride = qk;
  p.cache = {pr->cache->get(), bs, kLatent, kRope, kernels::LatentCacheType::kBFloat16};
  p.block_tables = pr->tables->get();
  p.max_blocks_per_seq = max_blocks;
  p.token_seq = pr->token_seq->get();
  p.context_len = pr->context_len->get();
  p.softmax_scale = scale;
  p.out_latent = pr->out->get();
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

class MlaDecodeSmallTest : public ::testing::TestWithParam<Case> {};

TEST_P(MlaDecodeSmallTest, MatchesCpuBackendForEveryShape) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Case s = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << s.name << " seed " << seed);
  Problem pr;
  Build(s, seed, &pr);
  if (!kernels::MlaDecodeSmallSupported(pr.params)) {
    GTEST_SKIP() << "no thread-block clusters on this device";
  }
  std::vector<float> got, first;
  for (const kernels::MlaDecodeSmallForm form : {kCudaCore, kTensorCore}) {
    for (int cluster : {0, 1, 2, 4, 8, 16}) {
      for (int heads_per_block : {0, 1, 2, 4}) {
        // The tensor-core form takes 16 heads a block: heads_per_block matters only where it
        // falls back to the CUDA-core form.
        const bool tc_takes = s.heads % 16 == 0;
        if (form == kTensorCore && tc_takes && heads_per_block != 0) continue;
        SCOPED_TRACE(::testing::Message()
                     << (form == kTensorCore ? "tensor-core" : "CUDA-core") << " form, cluster "
                     << cluster << ", heads per block " << heads_per_block);
        const kernels::MlaDecodeSmallOptions o{cluster, heads_per_block, form};
        const bool tc = kernels::MlaDecodeSmallFormFor(pr.params, o) == kTensorCore;
        EXPECT_EQ(tc, form == kTensorCore && tc_takes);
        pr.out->Poison();
        const cudaError_t e = kernels::MlaDecodeSmall(pr.params, o, nullptr);
        if (e == cudaErrorNotSupported) {  // the device cannot schedule this cluster size
          std::cout << "[mla-decode-small] " << s.name << (tc ? " tensor-core" : " CUDA-core")
                    << " cluster " << cluster << ": not schedulable here\n";
          continue;
        }
        DEEPINFER_CUDA_OK(e);
        DEEPINFER_CUDA_OK(pr.out->Download(&got));
        const ::testing::AssertionResult close =
            tc ? AllClose(got, pr.want_bf16_q, pr.bf16_q_atol, kRtol)
               : AllClose(got, pr.want, kAtol, kRtol);
        EXPECT_TRUE(close);
        int shape_cluster = 0, shape_heads = 0;
        DEEPINFER_CUDA_OK(kernels::MlaDecodeSmallShape(pr.params, o, &shape_cluster, &shape_heads));
        // Given values are kept; auto stays within the portable cluster sizes.
        EXPECT_EQ(shape_cluster == cluster, cluster != 0);
        EXPECT_NE(shape_cluster, cluster == 0 ? 16 : 0);
        if (tc) {
          EXPECT_EQ(shape_heads, 16);
        } else {
          EXPECT_EQ(shape_heads == heads_per_block, heads_per_block != 0);
        }
        if (heads_per_block == 0) {
          std::cout << "[mla-decode-small] " << s.name << (tc ? " tensor-core" : " CUDA-core")
                    << " cluster " << shape_cluster << " heads per block " << shape_heads << ": "
                    << close.message() << "\n";
        }
        // The same call again: the same bits (a fixed merge order, nothing timing-dependent).
        pr.out->Poison();
        DEEPINFER_CUDA_OK(kernels::MlaDecodeSmall(pr.params, o, nullptr));
        DEEPINFER_CUDA_OK(pr.out->Download(&first));
        EXPECT_TRUE(SameBits(first, got)) << "a repeated call changed the output";
      }
    }
  }
}

std::vector<Case> Cases() {
  std::vector<Case> c;
  c.push_back({"1_token_ctx_1", 16, 16, {1}, {}});
  c.push_back({"1_token_ctx_15", 16, 16, {15}, {}});
  c.push_back({"1_token_ctx_1024", 16, 16, {1024}, {}});
  c.push_back({"1_token_ctx_1025_block_64", 16, 64, {1025}, {}});
  c.push_back({"1_token_ctx_4096", 16, 16, {4096}, {}});
  c.push_back({"2_tokens_ctx_1024_4096", 16, 16, {1024, 4096}, {}});
  c.push_back({"3_tokens_mixed_3_heads", 3, 16, {1, 15, 1025}, {}});
  c.push_back({"8_tokens_mixed_block_64", 16, 64, {1, 15, 33, 100, 1024, 1025, 2000, 4096}, {}});
  c.push_back({"8_tokens_ctx_1024_20_heads", 20, 16, std::vector<int32_t>(8, 1024), {}});
  c.push_back({"8_heads_4_tokens", 8, 16, {7, 64, 513, 1024}, {}});
  // Two tokens of one sequence (speculative / multi-token decode): contexts 999 and 1000.
  c.push_back({"2_tokens_one_sequence", 16, 16, {1000}, {{0, 999}, {0, 1000}}});
  // Contexts that are not whole 32-key tiles of the tensor-core form; 128 heads (8 groups).
  c.push_back({"1_token_ctx_2", 16, 16, {2}, {}});
  c.push_back({"1_token_ctx_3_block_64", 16, 64, {3}, {}});
  c.push_back({"1_token_ctx_33", 16, 16, {33}, {}});
  c.push_back({"4_tokens_mixed_32_heads", 32, 16, {31, 32, 65, 777}, {}});
  c.push_back({"1_token_ctx_1000_128_heads", 128, 16, {1000}, {}});
  c.push_back({"2_tokens_ctx_5_3001_128_heads", 128, 64, {5, 3001}, {}});
  return c;
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaDecodeSmallTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// Captured into a CUDA graph (as the decode step runs it) and replayed: the bits of an eager
// call, also after the contexts change between replays (the grid does not depend on them). The
// tensor-core form is launched with programmatic dependent launch, in the graph too.
class MlaDecodeSmallGraphTest : public ::testing::TestWithParam<kernels::MlaDecodeSmallForm> {};

TEST_P(MlaDecodeSmallGraphTest, ReplayEqualsEagerBitForBit) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  Problem pr;
  Build({"graph", 16, 16, {1024, 300}, {}}, seed, &pr);
  if (!kernels::MlaDecodeSmallSupported(pr.params)) GTEST_SKIP() << "no thread-block clusters";
  const kernels::MlaDecodeSmallOptions o{0, 0, GetParam()};
  const bool tc = kernels::MlaDecodeSmallFormFor(pr.params, o) == kTensorCore;
  EXPECT_EQ(tc, GetParam() == kTensorCore);
  std::vector<float> eager, replayed;
  DEEPINFER_CUDA_OK(kernels::MlaDecodeSmall(pr.params, o, nullptr));
  DEEPINFER_CUDA_OK(pr.out->Download(&eager));
  EXPECT_TRUE(tc ? AllClose(eager, pr.want_bf16_q, pr.bf16_q_atol, kRtol)
                 : AllClose(eager, pr.want, kAtol, kRtol));

  cudaStream_t stream;
  DEEPINFER_CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  DEEPINFER_CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const cudaError_t launched = kernels::MlaDecodeSmall(pr.params, o, stream);
  DEEPINFER_CUDA_OK(cudaStreamEndCapture(stream, &graph));
  DEEPINFER_CUDA_OK(launched);
  DEEPINFER_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  for (int r = 0; r < 3; ++r) {
    pr.out->Poison();
    DEEPINFER_CUDA_OK(cudaGraphLaunch(exec, stream));
    DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
    DEEPINFER_CUDA_OK(pr.out->Download(&replayed));
    EXPECT_TRUE(SameBits(replayed, eager)) << "replay " << r;
  }
  // Shorter contexts in the same graph: equal to an eager call on them.
  const std::vector<int32_t> shorter = {17, 1};
  pr.context_len->Upload(shorter);
  DEEPINFER_CUDA_OK(kernels::MlaDecodeSmall(pr.params, o, nullptr));
  DEEPINFER_CUDA_OK(pr.out->Download(&eager));
  pr.out->Poison();
  DEEPINFER_CUDA_OK(cudaGraphLaunch(exec, stream));
  DEEPINFER_CUDA_OK(cudaStreamSynchronize(stream));
  DEEPINFER_CUDA_OK(pr.out->Download(&replayed));
  EXPECT_TRUE(SameBits(replayed, eager)) << "replay after the contexts changed";
  DEEPINFER_CUDA_OK(cudaGraphExecDestroy(exec));
  DEEPINFER_CUDA_OK(cudaGraphDestroy(graph));
  DEEPINFER_CUDA_OK(cudaStreamDestroy(stream));
}

INSTANTIATE_TEST_SUITE_P(Forms, MlaDecodeSmallGraphTest, ::testing::Values(kCudaCore, kTensorCore),
                         [](const ::testing::TestParamInfo<kernels::MlaDecodeSmallForm>& info) {
                           return std::string(info.param == kTensorCore ? "TensorCore"
                                                                        : "CudaCore");
                         });

// An FP8 case: the sequences' lengths (one decode token each, seeing all of it), and whether
// every token's scale is a power of two.
struct Fp8Case {
  std::string name;
  int32_t heads;
  int32_t block_size;
  std::vector<int32_t> seq_len;
  bool pow2_scales;
};

void PrintTo(const Fp8Case& c, std::ostream* os) { *os << c.name; }

constexpr kernels::LatentCacheType kFp8Type = kernels::LatentCacheType::kFp8E4M3;
constexpr Fp8LatentEntryLayout kFp8Layout = Fp8LatentLayout(kLatent, kRope);

// The same cached tokens as an FP8 cache and as a bf16 cache of its dequantised entries rounded
// to bf16, with one set of queries, block tables and outputs; `want` is the CPU over the FP8
// cache (pow2_scales) or over the bf16 one.
struct Fp8Problem {
  kernels::MlaAttentionParams fp8, bf16;  // out_latent: out, out_bf16
  std::vector<float> want;
  std::unique_ptr<DeviceArray<float>> q_latent, q, out, out_bf16;
  std::unique_ptr<DeviceArray<int32_t>> tables, token_seq, context_len;
  std::unique_ptr<DeviceArray<uint8_t>> cache;
  std::unique_ptr<DeviceArray<uint16_t>> rounded;
};

void BuildFp8(const Fp8Case& s, uint32_t seed, Fp8Problem* pr) {
  const int32_t bs = s.block_size;
  const int32_t seqs = static_cast<int32_t>(s.seq_len.size());
  int32_t max_blocks = 0, num_blocks = 3;  // 3 blocks no sequence owns (poisoned)
  for (int32_t len : s.seq_len) {
    max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
    num_blocks += (len + bs - 1) / bs;
  }
  std::mt19937 gen(seed);
  std::vector<int32_t> perm(num_blocks), tables(static_cast<size_t>(seqs) * max_blocks, 0);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), gen);
  int next = 0;
  for (int32_t q = 0; q < seqs; ++q) {
    for (int32_t b = 0; b * bs < s.seq_len[q]; ++b) tables[q * max_blocks + b] = perm[next++];
  }
  // Every written entry quantised from a random row (latent scaled per token, so that the
  // scales differ); unwritten bytes 0xFF (NaN codes, a NaN scale) and unwritten bf16 values NaN.
  const int64_t slots = static_cast<int64_t>(num_blocks) * bs, entry = kLatent + kRope;
  std::vector<uint8_t> cache(static_cast<size_t>(slots * kFp8Layout.bytes), 0xFFu);
  std::vector<uint16_t> rounded(static_cast<size_t>(slots * entry), 0xFFFFu);
  std::uniform_real_distribution<float> binades(-1.0f, 1.0f);
  std::vector<float> row(entry);
  for (int32_t q = 0; q < seqs; ++q) {
    for (int32_t p = 0; p < s.seq_len[q]; ++p) {
      const int64_t slot = static_cast<int64_t>(tables[q * max_blocks + p / bs]) * bs + p % bs;
      row = testing::RandomFloats(entry, seed + 10 + static_cast<uint32_t>(slot));
      if (s.pow2_scales) {
        // amax = 448 * 2^e: the scale is 2^e, and every value e4m3(q) * 2^e is exact in bf16.
        int32_t at = 0;
        for (int32_t i = 1; i < kLatent; ++i) {
          if (std::fabs(row[i]) > std::fabs(row[at])) at = i;
        }
        const float amax = std::ldexp(kFp8E4M3Max, (gen() & 1) != 0 ? -8 : -7);
        const float m = amax / std::fabs(row[at]);
        for (int32_t i = 0; i < kLatent; ++i) {
          row[i] = std::copysign(std::min(std::fabs(row[i] * m), amax), row[i]);
        }
        row[at] = std::copysign(amax, row[at]);
      } else {
        const float m = std::exp2(binades(gen));
        for (int32_t i = 0; i < kLatent; ++i) row[i] *= m;
      }
      uint8_t* e = cache.data() + slot * kFp8Layout.bytes;
      QuantizeFp8LatentEntry(row.data(), kLatent, row.data() + kLatent, kRope, e);
      DequantizeFp8LatentEntry(e, kLatent, kRope, row.data());
      for (int64_t i = 0; i < entry; ++i) rounded[slot * entry + i] = FloatToBf16Bits(row[i]);
    }
  }
  std::vector<int32_t> token_seq(seqs), context_len = s.seq_len;
  std::iota(token_seq.begin(), token_seq.end(), 0);
  const int64_t qk = kNope + kRope, qdim = s.heads * qk;
  const auto q_latent = testing::RandomFloats(int64_t{seqs} * s.heads * kLatent, seed + 2);
  const auto q = testing::RandomFloats(int64_t{seqs} * qdim, seed + 3);
  const float scale = 0.0721f;

  CpuBackend cpu(2);
  MlaAttentionArgs a;
  a.num_tokens = seqs;
  a.num_heads = s.heads;
  a.q_latent = q_latent.data();
  a.q_rope = q.data() + kNope;
  a.q_rope_token_stride = qdim;
  a.q_rope_head_stride = qk;
  a.cache = s.pow2_scales
                ? PagedLatentCacheView{cache.data(), bs, kLatent, kRope, WeightDType::kFp8E4M3}
                : PagedLatentCacheView{rounded.data(), bs, kLatent, kRope, WeightDType::kBFloat16};
  a.block_tables = tables.data();
  a.max_blocks_per_seq = max_blocks;
  a.token_seq = token_seq.data();
  a.context_len = context_len.data();
  a.softmax_scale = scale;
  pr->want.assign(static_cast<size_t>(seqs) * s.heads * kLatent, 0.0f);
  a.out_latent = pr->want.data();
  cpu.MlaAttention(a);

  pr->q_latent = std::make_unique<DeviceArray<float>>(q_latent);
  pr->q = std::make_unique<DeviceArray<float>>(q);
  pr->out = std::make_unique<DeviceArray<float>>(pr->want.size());
  pr->out_bf16 = std::make_unique<DeviceArray<float>>(pr->want.size());
  pr->tables = std::make_unique<DeviceArray<int32_t>>(tables);
  pr->token_seq = std::make_unique<DeviceArray<int32_t>>(token_seq);
  pr->context_len = std::make_unique<DeviceArray<int32_t>>(context_len);
  pr->cache = std::make_unique<DeviceArray<uint8_t>>(cache);
  pr->rounded = std::make_unique<DeviceArray<uint16_t>>(rounded);

  kernels::MlaAttentionParams& p = pr->fp8;
  p.num_tokens = seqs;
  p.num_heads = s.heads;
  p.q_latent = pr->q_latent->get();
  p.q_rope = pr->q->get() + kNope;
  p.q_rope_token_stride = qdim;
  p.q_rope_head_stride = qk;
  p.cache.cache = pr->cache->get();
  p.cache.block_size = bs;
  p.cache.latent_dim = kLatent;
  p.cache.rope_dim = kRope;
  p.cache.type = kFp8Type;
  p.cache.fp8_rope_offset = static_cast<int32_t>(kFp8Layout.rope_offset);
  p.cache.fp8_scale_offset = static_cast<int32_t>(kFp8Layout.scale_offset);
  p.cache.fp8_entry_bytes = static_cast<int32_t>(kFp8Layout.bytes);
  p.block_tables = pr->tables->get();
  p.max_blocks_per_seq = max_blocks;
  p.token_seq = pr->token_seq->get();
  p.context_len = pr->context_len->get();
  p.softmax_scale = scale;
  p.out_latent = pr->out->get();
  pr->bf16 = p;
  pr->bf16.cache = {pr->rounded->get(), bs, kLatent, kRope, kernels::LatentCacheType::kBFloat16};
  pr->bf16.out_latent = pr->out_bf16->get();
}

class MlaDecodeSmallFp8Test : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(MlaDecodeSmallFp8Test, EqualsTheBf16FormOverTheRoundedEntriesAndMatchesCpu) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Fp8Case s = GetParam();
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << s.name << " seed " << seed);
  Fp8Problem pr;
  BuildFp8(s, seed, &pr);
  ASSERT_TRUE(kernels::Fp8LatentCacheLayoutValid(pr.fp8.cache));
  if (!kernels::MlaDecodeSmallSupported(pr.fp8)) {
    GTEST_SKIP() << "no thread-block clusters on this device";
  }
  std::vector<float> got, want_bits, again;
  for (int cluster : {0, 1, 2, 4, 8, 16}) {
    for (int heads_per_block : {0, 1, 2, 4}) {
      SCOPED_TRACE(::testing::Message()
                   << "cluster " << cluster << ", heads per block " << heads_per_block);
      const kernels::MlaDecodeSmallOptions o{cluster, heads_per_block, kCudaCore};
      int shape_cluster = 0, shape_heads = 0;
      const cudaError_t shaped =
          kernels::MlaDecodeSmallShape(pr.fp8, o, &shape_cluster, &shape_heads);
      if (shaped == cudaErrorNotSupported) {
        std::cout << "[mla-decode-small] " << s.name << " FP8 cluster " << cluster
                  << ": not schedulable here\n";
        continue;
      }
      DEEPINFER_CUDA_OK(shaped);
      // The bf16 form at the shape the FP8 call runs (the same sums in the same order).
      const kernels::MlaDecodeSmallOptions same{shape_cluster, shape_heads, kCudaCore};
      pr.out->Poison();
      pr.out_bf16->Poison();
      DEEPINFER_CUDA_OK(kernels::MlaDecodeSmall(pr.fp8, o, nullptr));
      DEEPINFER_CUDA_OK(kernels::MlaDecodeSmall(pr.bf16, same, nullptr));
      DEEPINFER_CUDA_OK(pr.out->Download(&got));
      DEEPINFER_CUDA_OK(pr.out_bf16->Download(&want_bits));
      EXPECT_TRUE(testing::SameBits(got, want_bits, got.size()));
      const ::testing::AssertionResult close = AllClose(got, pr.want, kAtol, kRtol);
      EXPECT_TRUE(close);
      if (heads_per_block == 0) {
        std::cout << "[mla-decode-small] " << s.name << " FP8 cluster " << shape_cluster
                  << " heads per block " << shape_heads << ": " << close.message() << "\n";
      }
      // A tensor-core request runs the CUDA-core form on an FP8 cache: the same bits.
      const kernels::MlaDecodeSmallOptions tc{cluster, heads_per_block, kTensorCore};
      EXPECT_EQ(kernels::MlaDecodeSmallFormFor(pr.fp8, tc), kCudaCore);
      pr.out->Poison();
      DEEPINFER_CUDA_OK(kernels::MlaDecodeSmall(pr.fp8, tc, nullptr));
      DEEPINFER_CUDA_OK(pr.out->Download(&again));
      EXPECT_TRUE(testing::SameBits(again, got, got.size())) << "tensor-core request";
    }
  }
}

std::vector<Fp8Case> Fp8Cases() {
  std::vector<Fp8Case> c;
  for (const bool pow2 : {true, false}) {
    const std::string scales = pow2 ? "_pow2_scales" : "_any_scales";
    for (const int32_t heads : {16, 128}) {
      const std::string h = "_" + std::to_string(heads) + "_heads";
      for (const int32_t ctx : {1, 33, 1000, 1280}) {
        c.push_back({"1_token_ctx_" + std::to_string(ctx) + h + scales, heads, 16, {ctx}, pow2});
      }
    }
    c.push_back({"2_tokens_ctx_33_1000_block_64" + scales, 16, 64, {33, 1000}, pow2});
  }
  return c;
}

INSTANTIATE_TEST_SUITE_P(Cases, MlaDecodeSmallFp8Test, ::testing::ValuesIn(Fp8Cases()),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) {
                           return info.param.name;
                         });

TEST(MlaDecodeSmallLimitsTest, RejectsOtherShapesAndOptions) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  Problem pr;
  Build({"limits", 16, 16, {40}, {}}, 7, &pr);
  if (!kernels::MlaDecodeSmallSupported(pr.params)) GTEST_SKIP() << "no thread-block clusters";
  kernels::MlaAttentionParams p = pr.params;
  p.cache.type = kernels::LatentCacheType::kFloat32;
  EXPECT_FALSE(kernels::MlaDecodeSmallSupported(p));
  EXPECT_EQ(kernels::MlaDecodeSmall(p, {}, nullptr), cudaErrorInvalidValue);
  p = pr.params;
  p.cache.latent_dim = 256;
  EXPECT_FALSE(kernels::MlaDecodeSmallSupported(p));
  p = pr.params;
  p.cache.rope_dim = 32;
  EXPECT_FALSE(kernels::MlaDecodeSmallSupported(p));
  p = pr.params;
  p.q_latent += 1;  // not 16-byte aligned
  EXPECT_FALSE(kernels::MlaDecodeSmallSupported(p));
  for (int cluster : {-1, 3, 32}) {
    EXPECT_EQ(kernels::MlaDecodeSmall(pr.params, {cluster, 0}, nullptr), cudaErrorInvalidValue)
        << "cluster " << cluster;
  }
  for (int heads : {-1, 3, 8}) {
    EXPECT_EQ(kernels::MlaDecodeSmall(pr.params, {0, heads}, nullptr), cudaErrorInvalidValue)
        << "heads per block " << heads;
    EXPECT_EQ(kernels::MlaDecodeSmall(pr.params, {0, heads, kTensorCore}, nullptr),
              cudaErrorInvalidValue)
        << "heads per block " << heads;
  }
  EXPECT_EQ(kernels::MlaDecodeSmall(pr.params, {0, 0, static_cast<kernels::MlaDecodeSmallForm>(2)},
                                    nullptr),
            cudaErrorInvalidValue);
  // Head counts that are not a multiple of 16 run the CUDA-core form.
  p = pr.params;
  for (int heads : {1, 8, 24}) {
    p.num_heads = heads;
    EXPECT_EQ(kernels::MlaDecodeSmallFormFor(p, {0, 0, kTensorCore}), kCudaCore) << heads;
  }
  EXPECT_EQ(kernels::MlaDecodeSmallFormFor(pr.params, {}), kCudaCore);
  // FP8 layouts the lanes' loads cannot take.
  Fp8Problem f;
  BuildFp8({"limits_fp8", 16, 16, {40}, true}, 7, &f);
  ASSERT_TRUE(kernels::MlaDecodeSmallSupported(f.fp8));
  p = f.fp8;
  p.cache.fp8_rope_offset += 2;  // 2-byte aligned only
  p.cache.fp8_scale_offset += 4;
  EXPECT_FALSE(kernels::MlaDecodeSmallSupported(p));
  p = f.fp8;
  p.cache.fp8_entry_bytes += 8;  // entries not 16-byte aligned
  EXPECT_FALSE(kernels::MlaDecodeSmallSupported(p));
  p = f.fp8;
  p.cache.fp8_scale_offset = p.cache.fp8_rope_offset;  // overlaps the rope key
  EXPECT_FALSE(kernels::MlaDecodeSmallSupported(p));
  EXPECT_EQ(kernels::MlaDecodeSmall(p, {}, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepinfer
