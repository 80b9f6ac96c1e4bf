// WriteLatentCacheF32 and MlaAttentionF32 against the CpuBackend ops: sequences of different
// lengths in shuffled cache blocks, queries that mix prefill (causal) and decode tokens or decode
// tokens alone, contexts longer than one key chunk, head counts that do not fill a head group,
// DeepSeek-V3's 128 heads and latent/rope sizes, context splits chosen automatically or forced
// (with an internal or a caller's workspace), decode batches of 1, 3, 64, 128 and 256 requests
// (both split combines: fewer and more than 8 splits); every variant of the tensor-core kernel (4,
// and 9, the key-split kernel: its shared block-table copy and, past 256 blocks per split, its
// global fallback); every case with an fp32 and with a bf16 cache (the CPU reference reads the same
// bf16 values). Variant 9 (bf16 Q and P, merging its splits in a thread-block cluster) against a
// reference over Q rounded to bf16, within P's rounding bound. The 64-head wgmma kernel (variant
// 10, the default from 16 tokens for multiples of 64 heads on compute capability 9.0) the same
// way, every variant of each case, at 64 and 128 heads: 1, 3, 64 and 128 decode tokens, contexts
// of 1, 17, 64, 1000, 1024 and 4100 keys, blocks of 16 and 64 keys, automatic and forced split
// counts (Wgmma64Heads cases). An FP8 cache (Fp8 cases): the key-split and wgmma kernels over
// host-quantised entries, bit for bit against the same variant over a bf16 cache of the
// host-dequantised values and against the CPU over the FP8 cache, at 16 heads (2, 8, 64, 128
// tokens) and 128 heads (3, 16, 128 tokens). Variant 11 (the key-split ring form) runs every bf16
// and Fp8 case as 9 does (ragged 8-128 request batches at 16, 32 and 48 heads among the Cases).
#include "kernels/attention/mla_attention.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <tuple>
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

struct Case {
  std::string name;
  int32_t heads, latent, rope, nope;
  int32_t block_size = 16;
  std::vector<int32_t> seq_len = {1, 21, 300};
  bool decode_only = false;  // one query per sequence (seeing all of it) instead of every position
  int32_t num_splits = 0;    // 0: MlaAttentionF32 picks
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

// Tolerances against the CPU reference (fp32 dot products, double P·V sums) over the same cache
// values. fp32 cache: fp32 online softmax on CUDA cores. bf16 cache, tensor-core kernel: Q and P
// enter the MMAs as bf16 hi + lo pairs (about 2^-17 relative each), so a score of these N(0, 1)
// inputs (576 products, sum |q k| ~ 370, x scale 0.07) moves by up to ~1e-4 and an output by a
// few 1e-5; dropping the lo halves (plain bf16 operands) gives errors near 1e-2, far outside.
constexpr double kF32Atol = 2e-5, kF32Rtol = 1e-4;
constexpr double kBf16Atol = 1e-4, kBf16Rtol = 5e-4;

// Variant 9 (MlaAttentionBf16Operands) rounds Q and P to bf16 (nearest even) before the
// MMAs. Against the CPU reference run on the same Q rounded to bf16 (so the scores agree as for
// the hi + lo kernels, within kBf16Atol / kBf16Rtol), what remains is P's rounding in the
// numerator of out = sum_j p_j v_j / sum_j p_j (the denominator sums the unrounded fp32 p_j):
// p'_j = p_j (1 + e_j), |e_j| <= 2^-9, so |out' - out| <= 2^-9 sum_j p_j |v_j| / sum_j p_j
// <= 2^-9 max_j |v_j| (v: the cached latents). The split merge rescales fp32 partials and adds
// nothing of this order. A wrong key, weight or column moves outputs by ~0.1-1 (N(0, 1) data).
double Bf16OperandsAtol(double max_abs_latent) { return max_abs_latent / 512.0 + kBf16Atol; }

class MlaAttentionKernelTest
    : public ::testing::TestWithParam<std::tuple<Case, kernels::LatentCacheType>> {};

TEST_P(MlaAttentionKernelTest, MatchesCpuBackend) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Case s = std::get<0>(GetParam());
  const bool bf16 = std::get<1>(GetParam()) == kernels::LatentCacheType::kBFloat16;
  const double atol = bf16 ? kBf16Atol : kF32Atol, rtol = bf16 ? kBf16Rtol : kF32Rtol;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << s.name << (bf16 ? " bf16" : " fp32") << " seed " << seed);
  CpuBackend cpu(2);
  const int32_t block_size = s.block_size;
  int32_t max_blocks = 0, num_blocks = 0;
  for (int32_t len : s.seq_len) {
    const int32_t n = (len + block_size - 1) / block_size;
    max_blocks = std::max(max_blocks, n);
    num_blocks += n;
  }
  num_blocks += 3;  // a few blocks no sequence owns
  std::mt19937 gen(seed);
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), gen);
  const size_t num_seqs = s.seq_len.size();
  std::vector<int32_t> tables(num_seqs * max_blocks, 0);
  int next = 0;
  for (size_t q = 0; q < num_seqs; ++q) {
    for (int32_t b = 0; b * block_size < s.seq_len[q]; ++b) {
      tables[q * max_blocks + b] = perm[next++];
    }
  }
  // Every cached token of every sequence is written through WriteLatentCache; the queries are
  // every position (causal prefill + decode mix) or each sequence's last position.
  std::vector<int32_t> slots, token_seq, context_len;
  for (size_t q = 0; q < num_seqs; ++q) {
    for (int32_t p = 0; p < s.seq_len[q]; ++p) {
      slots.push_back(tables[q * max_blocks + p / block_size] * block_size + p % block_size);
      if (!s.decode_only || p + 1 == s.seq_len[q]) {
        token_seq.push_back(static_cast<int32_t>(q));
        context_len.push_back(p + 1);
      }
    }
  }
  const int64_t cached = static_cast<int64_t>(slots.size());
  const int64_t tokens = static_cast<int64_t>(token_seq.size());
  const int64_t entry = s.latent + s.rope;
  const int64_t ld_kv = entry + 3;  // [latent | rope] rows with padding, as from the kv_a GEMM
  auto kv = testing::RandomFloats(cached * ld_kv, seed + 1);
  const int64_t qk = s.nope + s.rope, qdim = s.heads * qk;
  auto q_latent = testing::RandomFloats(tokens * s.heads * s.latent, seed + 2);
  auto q = testing::RandomFloats(tokens * qdim, seed + 3);
  const float scale = 0.0721f;

  const size_t cache_elems = static_cast<size_t>(num_blocks) * block_size * entry;
  std::vector<float> cache_cpu(cache_elems, 0.0f);
  std::vector<uint16_t> cache_cpu16(cache_elems, 0);
  PagedLatentCacheView view{cache_cpu.data(), block_size, s.latent, s.rope};
  if (bf16) view = {cache_cpu16.data(), block_size, s.latent, s.rope, WeightDType::kBFloat16};
  cpu.WriteLatentCache(cached, kv.data(), ld_kv, kv.data() + s.latent, ld_kv, slots.data(), view);
  MlaAttentionArgs a;
  a.num_tokens = static_cast<int32_t>(tokens);
  a.num_heads = s.heads;
  a.q_latent = q_latent.data();
  a.q_rope = q.data() + s.nope;
  a.q_rope_token_stride = qdim;
  a.q_rope_head_stride = qk;
  a.cache = view;
  a.block_tables = tables.data();
  a.max_blocks_per_seq = max_blocks;
  a.token_seq = token_seq.data();
  a.context_len = context_len.data();
  a.softmax_scale = scale;
  std::vector<float> want(tokens * s.heads * s.latent);
  a.out_latent = want.data();
  cpu.MlaAttention(a);
  // The reference of the bf16-operand variants (8, 9; the key-split shape with a bf16 cache):
  // the same attention over Q rounded to bf16, and the bound of P's rounding (above).
  const bool key_split_shape = s.latent == 512 && s.rope == 64;
  std::vector<float> want_bf16_q;
  double bf16_ops_atol = 0.0;
  if (bf16 && key_split_shape) {
    std::vector<float> q_latent16(q_latent), q16(q);
    for (float& x : q_latent16) x = RoundToBf16(x);
    for (float& x : q16) x = RoundToBf16(x);
    MlaAttentionArgs a16 = a;
    a16.q_latent = q_latent16.data();
    a16.q_rope = q16.data() + s.nope;
    want_bf16_q.resize(want.size());
    a16.out_latent = want_bf16_q.data();
    cpu.MlaAttention(a16);
    double max_abs = 0.0;
    for (int64_t t = 0; t < cached; ++t) {
      for (int64_t i = 0; i < s.latent; ++i) {
        max_abs = std::max<double>(max_abs,
                                   std::fabs(Bf16BitsToFloat(cache_cpu16[slots[t] * entry + i])));
      }
    }
    bf16_ops_atol = Bf16OperandsAtol(max_abs);
  }

  DeviceArray<float> dkv(kv), dql(q_latent), dq(q), dcache(cache_elems), dout(want.size());
  DeviceArray<uint16_t> dcache16(cache_elems);
  DeviceArray<int32_t> dslots(slots), dseq(token_seq), dlen(context_len), dtables(tables);
  dcache.Poison();  // never-written slots must not be read (0xFFFF is a bf16 NaN too)
  dcache16.Poison();
  kernels::PagedLatentCache cache{dcache.get(), block_size, s.latent, s.rope};
  if (bf16) {
    cache = {dcache16.get(), block_size, s.latent, s.rope, kernels::LatentCacheType::kBFloat16};
  }
  DEEPINFER_CUDA_OK(kernels::WriteLatentCacheF32(cached, dkv.get(), ld_kv, dkv.get() + s.latent,
                                                 ld_kv, dslots.get(), cache, nullptr));
  // The device rounding is the host's bit for bit.
  if (bf16) {
    std::vector<uint16_t> got_cache;
    DEEPINFER_CUDA_OK(dcache16.Download(&got_cache));
    for (int64_t t = 0; t < cached; ++t) {
      for (int64_t i = 0; i < entry; ++i) {
        const int64_t at = slots[t] * entry + i;
        ASSERT_EQ(got_cache[at], cache_cpu16[at]) << "cache slot " << slots[t] << " element " << i;
      }
    }
  } else {
    std::vector<float> got_cache;
    DEEPINFER_CUDA_OK(dcache.Download(&got_cache));
    for (int64_t t = 0; t < cached; ++t) {
      for (int64_t i = 0; i < entry; ++i) {
        const int64_t at = slots[t] * entry + i;
        ASSERT_EQ(got_cache[at], cache_cpu[at]) << "cache slot " << slots[t] << " element " << i;
      }
    }
  }
  kernels::MlaAttentionParams p;
  p.num_tokens = static_cast<int32_t>(tokens);
  p.num_heads = s.heads;
  p.q_latent = dql.get();
  p.q_rope = dq.get() + s.nope;
  p.q_rope_token_stride = qdim;
  p.q_rope_head_stride = qk;
  p.cache = cache;
  p.block_tables = dtables.get();
  p.max_blocks_per_seq = max_blocks;
  p.token_seq = dseq.get();
  p.context_len = dlen.get();
  p.softmax_scale = scale;
  p.out_latent = dout.get();
  p.num_splits = s.num_splits;
  const std::string kernel = kernels::MlaAttentionKernelName(p);
  int device = 0, cc_major = 0, cc_minor = 0;
  DEEPINFER_CUDA_OK(cudaGetDevice(&device));
  DEEPINFER_CUDA_OK(cudaDeviceGetAttribute(&cc_major, cudaDevAttrComputeCapabilityMajor, device));
  DEEPINFER_CUDA_OK(cudaDeviceGetAttribute(&cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  // The 64-head wgmma kernel's domain (variants 0 and 10): bf16 latent 512 + rope 64, heads a
  // multiple of 64, compute capability 9.0 (its sm_90a image).
  const bool wgmma_runs =
      bf16 && key_split_shape && s.heads % 64 == 0 && cc_major == 9 && cc_minor == 0;
  // The tensor-core kernel must be the one tested wherever its shape limits allow it; by
  // default the wgmma one for multiples of 64 heads from kMlaWgmmaDefaultMinTokens tokens, else
  // the key-split one for latent 512 + rope 64 (variant 9: with the cluster merge at 2-3 splits).
  const bool wgmma_default = wgmma_runs && tokens >= kernels::kMlaWgmmaDefaultMinTokens;
  if (wgmma_default) {
    EXPECT_EQ(kernel, "wgmma_bf16_64_heads");
  } else if (bf16 && key_split_shape) {
    EXPECT_TRUE(kernel == "mma_bf16_key_split" || kernel == "mma_bf16_key_split_cluster") << kernel;
  } else if (bf16) {
    EXPECT_EQ(kernel, s.latent <= 512 && (s.latent + s.rope + 15) / 16 * 16 <= 640
                          ? "mma_bf16"
                          : "grouped_bf16");
  } else {
    EXPECT_EQ(kernel, "grouped_f32");
  }
  std::vector<float> got;
  // fp32 online softmax vs the reference's double accumulation.
  // Every variant of the tensor-core kernel (0: the default), with the workspace
  // allocated inside.
  // The key-split kernel's split count under `variant` (9, or 11 for its ring form: the
  // automatic one or the case's), read from the workspace it takes with an output the cluster
  // merge does not write (not 16-byte aligned): both merge 2 to kMlaClusterMergeMaxSplits
  // splits in a cluster on sm_90.
  auto key_split_splits = [&](int variant) {
    if (!bf16 || !key_split_shape) return 1;
    kernels::MlaAttentionParams unmerged = p;
    unmerged.out_latent = dout.get() + 1;
    unmerged.mma_variant = variant;
    size_t bytes = 0;
    EXPECT_EQ(kernels::MlaAttentionWorkspaceBytes(unmerged, &bytes), cudaSuccess);
    return bytes == 0 ? 1
                      : static_cast<int>(bytes / (static_cast<size_t>(tokens) * s.heads *
                                                  (s.latent + 2) * sizeof(float)));
  };
  // The reference and tolerances of the variant p.mma_variant runs.
  auto reference = [&]() -> std::tuple<const std::vector<float>*, double, double> {
    if (kernels::MlaAttentionBf16Operands(p)) {
      EXPECT_FALSE(want_bf16_q.empty()) << "bf16 operands outside the key-split shape";
      return {&want_bf16_q, bf16_ops_atol, kBf16Rtol};
    }
    return {&want, atol, rtol};
  };
  for (int variant = 0; variant <= (bf16 ? kernels::kMaxMlaMmaVariant : 0); ++variant) {
    if (!kernels::MlaMmaVariantIsValid(variant)) continue;  // numbers of removed variants
    SCOPED_TRACE(::testing::Message() << "MlaAttentionF32, mma_variant " << variant);
    p.mma_variant = variant;
    if (bf16 && variant != 4) {  // wgmma or key-split kernel; other shapes run variant 4
      const bool ring = variant == 11;
      const int splits = key_split_splits(ring ? 11 : 9);
      const bool cluster =
          splits >= 2 && splits <= kernels::kMlaClusterMergeMaxSplits && cc_major >= 9;
      const std::string key_split_kernel =
          std::string("mma_bf16_key_split") + (ring ? "_ring" : "") + (cluster ? "_cluster" : "");
      EXPECT_EQ(kernels::MlaAttentionKernelName(p),
                !key_split_shape ? kernel
                : (variant == 10 && wgmma_runs) || (variant == 0 && wgmma_default)
                    ? std::string("wgmma_bf16_64_heads")
                    : key_split_kernel);
      EXPECT_EQ(kernels::MlaAttentionBf16Operands(p), key_split_shape);
    }
    const auto [ref, v_atol, v_rtol] = reference();
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MlaAttentionF32(p, nullptr));
    DEEPINFER_CUDA_OK(dout.Download(&got));
    const ::testing::AssertionResult close = AllClose(got, *ref, v_atol, v_rtol);
    EXPECT_TRUE(close);
    std::cout << "[mla-attention] " << s.name << " " << kernels::MlaAttentionKernelName(p)
              << " variant " << variant << " (atol " << v_atol << "): " << close.message() << "\n";
    if (kernels::MlaAttentionBf16Operands(p)) {
      // How far the bf16 operands move the output from the exact-Q reference (reported, not
      // bounded: Q's rounding moves the scores by up to ~2^-9 of sum |q k|).
      double worst = 0.0;
      for (size_t i = 0; i < got.size(); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
      }
      std::cout << "[mla-attention]   vs the unrounded-Q reference: max abs diff " << worst << "\n";
    }
  }
  p.mma_variant = 0;
  {
    SCOPED_TRACE("MlaAttentionF32, caller's workspace");
    size_t bytes = 0;
    DEEPINFER_CUDA_OK(kernels::MlaAttentionWorkspaceBytes(p, &bytes));
    // The default's cluster merge (variant 9) needs no workspace.
    const bool cluster =
        std::string(kernels::MlaAttentionKernelName(p)) == "mma_bf16_key_split_cluster";
    if (s.num_splits > 1 && !cluster) {
      EXPECT_GT(bytes, 0u);
    }
    if (cluster) {
      EXPECT_EQ(bytes, 0u);
    }
    DeviceArray<float> ws(bytes / sizeof(float));
    ws.Poison();  // partial results must all be written before the combine reads them
    p.workspace = ws.get();
    p.workspace_bytes = bytes;
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MlaAttentionF32(p, nullptr));
    DEEPINFER_CUDA_OK(dout.Download(&got));
    const auto [ref, v_atol, v_rtol] = reference();
    EXPECT_TRUE(AllClose(got, *ref, v_atol, v_rtol));
    if (bytes > 0) {
      p.workspace_bytes = bytes - 1;
      EXPECT_EQ(kernels::MlaAttentionF32(p, nullptr), cudaErrorInvalidValue);
    }
    p.workspace = nullptr;
    p.workspace_bytes = 0;
  }
}

std::vector<Case> Cases() {
  std::vector<Case> c;
  // Prefill + decode mix over sequences of 1, 21 and 300 positions.
  c.push_back({"dsv3_latent_4_heads", 4, 512, 64, 128});
  c.push_back({"tiny_2_heads", 2, 32, 16, 16});
  c.push_back({"latent_1024_3_heads", 3, 1024, 64, 8});
  c.push_back({"odd_dims_block_5", 5, 30, 5, 4, 5});  // rows not float4-aligned, bs 5
  c.push_back({"moonlight_16_heads_block_64", 16, 512, 64, 128, 64});
  c.push_back({"20_heads_split_3", 20, 512, 64, 128, 16, {1, 21, 300}, false, 3});
  // Decode only: few tokens, long contexts, many splits (some empty for the short sequences).
  c.push_back({"decode_16_heads", 16, 512, 64, 128, 16, {1, 37, 1500}, true});
  c.push_back({"decode_128_heads", 128, 512, 64, 128, 16, {1, 37, 1500}, true});
  c.push_back({"decode_split_7_block_1", 16, 512, 64, 128, 1, {1, 37, 700}, true, 7});
  c.push_back({"decode_split_max", 17, 256, 64, 32, 16, {3, 2000}, true, kernels::kMaxMlaSplits});
  // One split of 1025 blocks of 1 key: more block-table entries than variant 9 keeps in shared
  // memory (256), so it reads them from the table in global memory.
  c.push_back({"decode_table_in_global_block_1", 16, 512, 64, 128, 1, {5, 700, 1025}, true, 1});
  // Decode batches of the shapes the benchmark times (Moonlight: 16 heads, latent 512 + rope 64),
  // at the automatic split count: one request whose context is not a whole number of blocks,
  // and 128 / 256 requests of mixed lengths (many empty splits, chunks that end mid-block).
  c.push_back({"decode_1_request_ctx_1025", 16, 512, 64, 128, 16, {1025}, true});
  std::vector<int32_t> mixed64 = {1, 63, 64, 65, 127, 128, 129, 1024, 1023, 1025};
  for (int32_t i = 0; static_cast<int32_t>(mixed64.size()) < 64; ++i) {
    mixed64.push_back(1 + (i * 131) % 1200);
  }
  c.push_back({"decode_64_requests_tile_edges", 16, 512, 64, 128, 16, mixed64, true});
  c.push_back({"decode_64_requests_split_2_block_64", 16, 512, 64, 128, 64, mixed64, true, 2});
  std::vector<int32_t> mixed128, mixed256;
  for (int32_t i = 0; i < 128; ++i) mixed128.push_back(1 + (i * 97) % 1100);
  for (int32_t i = 0; i < 256; ++i) mixed256.push_back(1 + (i * 61) % 700);
  c.push_back({"decode_128_requests_mixed", 16, 512, 64, 128, 16, mixed128, true});
  c.push_back({"decode_256_requests_block_64", 16, 512, 64, 128, 64, mixed256, true});
  // 16, 32 and 48 heads for the ring form (variant 11) beside 9: contexts of 1 and 2 keys, around
  // a 32-key tile (31-33) and the 4-tile ring (127-129), past 1024; 8 requests (splits of 1-3
  // tiles, empty ones), 32, 128 x 1024 (the benchmark's), forced splits 2 (cluster) and 5.
  const std::vector<int32_t> ragged8 = {1, 2, 31, 32, 33, 129, 1000, 1025};
  std::vector<int32_t> ragged32 = {1, 2, 31, 33, 127, 128, 129, 1023};
  for (int32_t i = 0; static_cast<int32_t>(ragged32.size()) < 32; ++i) {
    ragged32.push_back(1 + (i * 173) % 1100);
  }
  c.push_back({"decode_8_requests_ragged", 16, 512, 64, 128, 16, ragged8, true});
  c.push_back({"decode_32_requests_ragged", 16, 512, 64, 128, 16, ragged32, true});
  c.push_back({"decode_128_requests_ctx_1024", 16, 512, 64, 128, 16,
               std::vector<int32_t>(128, 1024), true});
  c.push_back({"decode_32_heads_32_requests", 32, 512, 64, 128, 16, ragged32, true});
  c.push_back({"decode_32_heads_8_requests_split_2", 32, 512, 64, 128, 16, ragged8, true, 2});
  c.push_back({"decode_48_heads_8_requests_split_5", 48, 512, 64, 128, 64, ragged8, true, 5});
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MlaAttentionKernelTest,
    ::testing::Combine(::testing::ValuesIn(Cases()),
                       ::testing::Values(kernels::LatentCacheType::kFloat32,
                                         kernels::LatentCacheType::kBFloat16)),
    [](const ::testing::TestParamInfo<std::tuple<Case, kernels::LatentCacheType>>& info) {
      return std::get<0>(info.param).name +
             (std::get<1>(info.param) == kernels::LatentCacheType::kBFloat16 ? "_bf16" : "_fp32");
    });

// The 64-head wgmma kernel's cases (bf16 cache only; DeepSeek-V3's latent 512 + rope 64, 64 or 128
// heads), decode tokens seeing their whole sequence: contexts of 1 (one key: the tile's other
// 63 rows zeroed), 17 and 64 (one tile, partial and whole), 1000, 1024 and 4100 (many tiles, the
// last partial; several splits), blocks of 16 and 64 keys, automatic and forced splits (1, 2, 5,
// and 64: more splits than tiles, so empty splits).
std::vector<Case> WgmmaCases() {
  std::vector<Case> c;
  for (int32_t heads : {64, 128}) {
    const std::string h = std::to_string(heads) + "_heads_";
    c.push_back({h + "1_token_ctx_1", heads, 512, 64, 128, 16, {1}, true});
    c.push_back({h + "1_token_ctx_17_block_64", heads, 512, 64, 128, 64, {17}, true});
    c.push_back({h + "1_token_ctx_64_split_1", heads, 512, 64, 128, 16, {64}, true, 1});
    c.push_back({h + "1_token_ctx_4100", heads, 512, 64, 128, 16, {4100}, true});
    c.push_back({h + "1_token_ctx_1000_split_64", heads, 512, 64, 128, 64, {1000}, true, 64});
    c.push_back({h + "3_tokens_block_64", heads, 512, 64, 128, 64, {1, 1000, 4100}, true});
    c.push_back({h + "3_tokens_split_5", heads, 512, 64, 128, 16, {17, 1024, 4100}, true, 5});
    std::vector<int32_t> mixed64 = {1, 17, 63, 64, 65, 1000, 1023, 1024, 1025};
    for (int32_t i = 0; static_cast<int32_t>(mixed64.size()) < 64; ++i) {
      mixed64.push_back(1 + (i * 131) % 1100);
    }
    c.push_back({h + "64_tokens_mixed", heads, 512, 64, 128, 16, mixed64, true});
    c.push_back({h + "64_tokens_split_2_block_64", heads, 512, 64, 128, 64, mixed64, true, 2});
    c.push_back({h + "128_tokens_ctx_1024", heads, 512, 64, 128, 64,
                 std::vector<int32_t>(128, 1024), true});
  }
  // A prefill + decode mix (every position of 1, 21 and 300 keys queries: causal contexts).
  c.push_back({"128_heads_prefill_mix", 128, 512, 64, 128, 16, {1, 21, 300}});
  return c;
}

INSTANTIATE_TEST_SUITE_P(
    Wgmma64Heads, MlaAttentionKernelTest,
    ::testing::Combine(::testing::ValuesIn(WgmmaCases()),
                       ::testing::Values(kernels::LatentCacheType::kBFloat16)),
    [](const ::testing::TestParamInfo<std::tuple<Case, kernels::LatentCacheType>>& info) {
      return std::get<0>(info.param).name + "_bf16";
    });

// ---- FP8 cache (PagedLatentCache kFp8E4M3, worker/backend/fp8_latent_entry.h) ----
//
// Decode tokens (one per sequence, seeing all of it) over an FP8 cache whose entries the host
// quantised (QuantizeFp8LatentEntry), each token's latent at its own scale. The key-split kernel
// (variant 9, and 0 / 10 where they run it) and the 64-head wgmma kernel (variant 10, and 0 from
// 16 tokens, for 128 heads on compute capability 9.0) read the FP8 entries themselves: each
// variant's output is bit for bit the same variant's over a bf16 cache holding the
// host-dequantised values (DequantizeFp8LatentEntry, then bf16 rounding: the values
// GatherFp8LatentCacheBf16 copies), on the corresponding kernel, and within the bf16-operand
// bound (Bf16OperandsAtol) of CpuBackend::MlaAttention over Q rounded to bf16. pow2_scales: each
// token's amax is 448 * 2^k, so its scale is 2^k and every dequantised value is a bf16 value: the
// reference is the CPU over the FP8 cache itself (it dequantises the entries on its own). Other
// scales: the fp32 products e4m3 * s carry more bits than bf16, and those roundings move random
// scores by more than the bound, so the reference is the CPU over the bf16 cache of rounded values
// (the bit-for-bit check above covers the conversion). Variant 4 runs the CUDA-core kernel over the
// FP8 entries (fp32 math, the CPU over the FP8 cache with the fp32 tolerances).
struct Fp8Case {
  std::string name;
  int32_t heads = 16;
  int32_t block_size = 16;
  std::vector<int32_t> seq_len;
  int32_t num_splits = 0;
  bool pow2_scales = true;
};

void PrintTo(const Fp8Case& c, std::ostream* os) { *os << c.name; }

class MlaAttentionFp8CacheTest : public ::testing::TestWithParam<Fp8Case> {};

TEST_P(MlaAttentionFp8CacheTest, TensorCoreKernelsReadTheFp8Entries) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  const Fp8Case s = GetParam();
  constexpr int32_t L = 512, R = 64, E = L + R;
  const Fp8LatentEntryLayout layout = Fp8LatentLayout(L, R);
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << s.name << " seed " << seed);
  CpuBackend cpu(2);
  const int32_t bs = s.block_size;
  int32_t max_blocks = 0, num_blocks = 3;  // a few blocks no sequence owns
  for (int32_t len : s.seq_len) {
    max_blocks = std::max(max_blocks, (len + bs - 1) / bs);
    num_blocks += (len + bs - 1) / bs;
  }
  std::mt19937 gen(seed);
  std::vector<int32_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), gen);
  const int32_t tokens = static_cast<int32_t>(s.seq_len.size());
  std::vector<int32_t> tables(static_cast<size_t>(tokens) * max_blocks, 0), slots, token_seq;
  int next = 0;
  for (int32_t q = 0; q < tokens; ++q) {
    for (int32_t b = 0; b * bs < s.seq_len[q]; ++b) tables[q * max_blocks + b] = perm[next++];
    for (int32_t p = 0; p < s.seq_len[q]; ++p) {
      slots.push_back(tables[q * max_blocks + p / bs] * bs + p % bs);
    }
    token_seq.push_back(q);
  }
  // Entries: N(0, 1) latents scaled per token by 2^u (u in [-2, 2]), or to amax 448 * 2^k
  // (k in [-7, -5]); unit rope keys. Slots no sequence owns stay 0xFF (NaN codes, NaN scale;
  // 0xFFFF, a bf16 NaN, in the bf16 cache): never read.
  const size_t num_slots = static_cast<size_t>(num_blocks) * bs;
  std::vector<uint8_t> fp8(num_slots * layout.bytes, 0xFF);
  std::vector<uint16_t> bf16(num_slots * E, 0xFFFF);
  std::uniform_real_distribution<float> binade(-2.0f, 2.0f);
  std::uniform_int_distribution<int> pow2(-7, -5);
  double max_abs = 0.0;
  for (size_t t = 0; t < slots.size(); ++t) {
    std::vector<float> kv = testing::RandomFloats(E, seed + 1 + static_cast<uint32_t>(t));
    if (s.pow2_scales) {
      int at = 0;
      for (int i = 0; i < L; ++i) at = std::fabs(kv[i]) > std::fabs(kv[at]) ? i : at;
      const float amax = std::ldexp(448.0f, pow2(gen)), c = amax / std::fabs(kv[at]);
      for (int i = 0; i < L; ++i) {
        kv[i] = std::copysign(std::min(std::fabs(kv[i] * c), amax), kv[i]);
      }
      kv[at] = kv[at] < 0 ? -amax : amax;
    } else {
      const float m = std::exp2(binade(gen));
      for (int i = 0; i < L; ++i) kv[i] *= m;
    }
    uint8_t* entry = fp8.data() + static_cast<size_t>(slots[t]) * layout.bytes;
    QuantizeFp8LatentEntry(kv.data(), L, kv.data() + L, R, entry);
    float values[E];
    DequantizeFp8LatentEntry(entry, L, R, values);
    for (int i = 0; i < E; ++i) {
      bf16[static_cast<size_t>(slots[t]) * E + i] = FloatToBf16Bits(values[i]);
      if (i < L) max_abs = std::max<double>(max_abs, std::fabs(values[i]));
      if (s.pow2_scales) {
        ASSERT_EQ(RoundToBf16(values[i]), values[i]) << "a bf16 value";
      }
    }
  }
  std::vector<int32_t> context_len(s.seq_len);
  const auto q_latent = testing::RandomFloats(static_cast<size_t>(tokens) * s.heads * L, seed + 2);
  const auto q_rope = testing::RandomFloats(static_cast<size_t>(tokens) * s.heads * R, seed + 3);
  std::vector<float> q_latent16(q_latent), q_rope16(q_rope);
  for (float& x : q_latent16) x = RoundToBf16(x);
  for (float& x : q_rope16) x = RoundToBf16(x);
  const float scale = 0.0721f;

  // The references: over Q rounded to bf16 (the FP8 cache, or the rounded bf16 cache), and
  // over Q itself and the FP8 cache (the CUDA-core kernel, variant 4).
  const size_t out_size = static_cast<size_t>(tokens) * s.heads * L;
  const PagedLatentCacheView fp8_view{fp8.data(), bs, L, R, WeightDType::kFp8E4M3};
  const PagedLatentCacheView bf16_view{bf16.data(), bs, L, R, WeightDType::kBFloat16};
  auto cpu_attention = [&](const PagedLatentCacheView& view, const std::vector<float>& ql,
                           const std::vector<float>& qr) {
    MlaAttentionArgs a;
    a.num_tokens = tokens;
    a.num_heads = s.heads;
    a.q_latent = ql.data();
    a.q_rope = qr.data();
    a.q_rope_token_stride = int64_t{s.heads} * R;
    a.q_rope_head_stride = R;
    a.cache = view;
    a.block_tables = tables.data();
    a.max_blocks_per_seq = max_blocks;
    a.token_seq = token_seq.data();
    a.context_len = context_len.data();
    a.softmax_scale = scale;
    std::vector<float> out(out_size);
    a.out_latent = out.data();
    cpu.MlaAttention(a);
    return out;
  };
  const std::vector<float> want16 =
      cpu_attention(s.pow2_scales ? fp8_view : bf16_view, q_latent16, q_rope16);
  const std::vector<float> want_f32 = cpu_attention(fp8_view, q_latent, q_rope);
  const double atol = Bf16OperandsAtol(max_abs);

  DeviceArray<uint8_t> dfp8(fp8);
  DeviceArray<uint16_t> dbf16(bf16);
  DeviceArray<float> dql(q_latent), dqr(q_rope), dout(out_size), dout16(out_size);
  DeviceArray<int32_t> dtables(tables), dseq(token_seq), dlen(context_len);
  kernels::MlaAttentionParams p;
  p.num_tokens = tokens;
  p.num_heads = s.heads;
  p.q_latent = dql.get();
  p.q_rope = dqr.get();
  p.q_rope_token_stride = int64_t{s.heads} * R;
  p.q_rope_head_stride = R;
  p.cache = {dfp8.get(),
             bs,
             L,
             R,
             kernels::LatentCacheType::kFp8E4M3,
             static_cast<int32_t>(layout.rope_offset),
             static_cast<int32_t>(layout.scale_offset),
             static_cast<int32_t>(layout.bytes)};
  p.block_tables = dtables.get();
  p.max_blocks_per_seq = max_blocks;
  p.token_seq = dseq.get();
  p.context_len = dlen.get();
  p.softmax_scale = scale;
  p.out_latent = dout.get();
  p.num_splits = s.num_splits;
  kernels::MlaAttentionParams p16 = p;
  p16.cache = {dbf16.get(), bs, L, R, kernels::LatentCacheType::kBFloat16};
  p16.out_latent = dout16.get();
  // Every variant of the default's choice over the FP8 cache runs the kernel, split count and
  // merge the bf16 cache runs: no caller needs the bf16 copy.
  EXPECT_TRUE(kernels::MlaAttentionReadsFp8Directly(p));
  EXPECT_FALSE(kernels::MlaAttentionReadsFp8Directly(p16));
  std::vector<float> got16, got;
  for (int variant : {0, 9, 10, 11, 4}) {
    SCOPED_TRACE(::testing::Message() << "mma_variant " << variant);
    p.mma_variant = variant;
    p16.mma_variant = variant;
    const std::string kernel = kernels::MlaAttentionKernelName(p);
    const std::string kernel16 = kernels::MlaAttentionKernelName(p16);
    dout.Poison();
    DEEPINFER_CUDA_OK(kernels::MlaAttentionF32(p, nullptr));
    DEEPINFER_CUDA_OK(dout.Download(&got));
    EXPECT_EQ(kernels::MlaAttentionReadsFp8Directly(p), variant != 4);
    if (variant == 4) {
      EXPECT_EQ(kernel, "grouped_fp8");
      // (The fp32 tolerance scaled to these latents, up to ~16 against the N(0, 1) of Cases.)
      EXPECT_TRUE(AllClose(got, want_f32, kF32Atol * std::max(1.0, max_abs), kF32Rtol));
      continue;
    }
    // The bf16 cache's kernel under this variant (the wgmma or the key-split kernel, the latter
    // in either form, with or without the cluster merge), in its FP8 form.
    const size_t at = kernel16.find("_bf16_");
    ASSERT_TRUE(at != std::string::npos && kernel16 != "mma_bf16") << kernel16;
    EXPECT_EQ(kernel, kernel16.substr(0, at) + "_fp8_" + kernel16.substr(at + 6)) << kernel16;
    EXPECT_EQ(kernel.find("key_split_ring") != std::string::npos, variant == 11) << kernel;
    EXPECT_TRUE(kernels::MlaAttentionBf16Operands(p));
    dout16.Poison();
    DEEPINFER_CUDA_OK(kernels::MlaAttentionF32(p16, nullptr));
    DEEPINFER_CUDA_OK(dout16.Download(&got16));
    EXPECT_TRUE(testing::SameBits(got, got16, out_size));
    const ::testing::AssertionResult close = AllClose(got, want16, atol, kBf16Rtol);
    EXPECT_TRUE(close);
    std::cout << "[mla-attention-fp8] " << s.name << " " << kernel << " variant " << variant
              << " (atol " << atol << "): " << close.message() << "\n";
  }
  // A caller's workspace (where the split count needs one); got16: variant 0's output over the
  // bf16 cache.
  p.mma_variant = 0;
  p16.mma_variant = 0;
  dout16.Poison();
  DEEPINFER_CUDA_OK(kernels::MlaAttentionF32(p16, nullptr));
  DEEPINFER_CUDA_OK(dout16.Download(&got16));
  size_t bytes = 0;
  DEEPINFER_CUDA_OK(kernels::MlaAttentionWorkspaceBytes(p, &bytes));
  DeviceArray<float> ws(bytes / sizeof(float));
  ws.Poison();
  p.workspace = ws.get();
  p.workspace_bytes = bytes;
  dout.Poison();
  DEEPINFER_CUDA_OK(kernels::MlaAttentionF32(p, nullptr));
  DEEPINFER_CUDA_OK(dout.Download(&got));
  EXPECT_TRUE(testing::SameBits(got, got16, out_size));
}

std::vector<Fp8Case> Fp8Cases() {
  std::vector<Fp8Case> c;
  std::vector<int32_t> ragged8 = {1, 2, 31, 32, 33, 95, 1000, 1025};
  std::vector<int32_t> mixed64 = {1, 63, 64, 65, 127, 128, 129, 1024, 1023, 1025};
  for (int32_t i = 0; static_cast<int32_t>(mixed64.size()) < 64; ++i) {
    mixed64.push_back(1 + (i * 131) % 1200);
  }
  std::vector<int32_t> mixed128;
  for (int32_t i = 0; i < 128; ++i) mixed128.push_back(1 + (i * 97) % 1100);
  c.push_back({"2_tokens_ctx_1_and_1500", 16, 16, {1, 1500}});
  c.push_back({"2_tokens_ctx_33_and_100_scales_any", 16, 16, {33, 100}, 0, false});
  c.push_back({"8_tokens_ragged", 16, 16, ragged8});
  c.push_back({"8_tokens_ragged_block_64_scales_any", 16, 64, ragged8, 0, false});
  c.push_back({"8_tokens_split_2", 16, 16, ragged8, 2, false});  // the cluster merge
  c.push_back({"8_tokens_split_3", 16, 16, ragged8, 3});
  c.push_back({"8_tokens_split_5", 16, 16, ragged8, 5, false});  // workspace + combine
  c.push_back({"64_tokens_mixed", 16, 16, mixed64});
  c.push_back({"64_tokens_mixed_block_64_scales_any", 16, 64, mixed64, 0, false});
  c.push_back({"128_tokens_mixed", 16, 16, mixed128});
  c.push_back(
      {"128_tokens_ctx_1024_scales_any", 16, 16, std::vector<int32_t>(128, 1024), 0, false});
  // One split of 1025 blocks of 1 key: the block table read from global memory.
  c.push_back({"2_tokens_table_in_global_block_1", 16, 1, {5, 1025}, 1, false});
  // 128 heads: below 16 tokens the default runs the key-split kernel (8 head groups), from 16
  // the 64-head wgmma kernel (compute capability 9.0), variant 10 always the wgmma one there:
  // contexts of 1, within one 64-key tile and past several, and forced splits.
  c.push_back({"128_heads_3_tokens", 128, 16, {1, 37, 1025}});
  c.push_back({"128_heads_3_tokens_split_5_block_64", 128, 64, {1, 64, 4100}, 5, false});
  std::vector<int32_t> mixed128h;
  for (int32_t i = 0; i < 128; ++i) mixed128h.push_back(1 + (i * 97) % 1100);
  c.push_back({"128_heads_128_tokens_mixed", 128, 16, mixed128h});
  c.push_back({"128_heads_128_tokens_ctx_1024_block_64_scales_any", 128, 64,
               std::vector<int32_t>(128, 1024), 0, false});
  c.push_back({"128_heads_16_tokens_scales_any",
               128,
               16,
               {1, 17, 32, 33, 64, 100, 511, 512, 513, 700, 1000, 1023, 1024, 1025, 300, 2},
               0,
               false});
  return c;
}

INSTANTIATE_TEST_SUITE_P(Fp8, MlaAttentionFp8CacheTest, ::testing::ValuesIn(Fp8Cases()),
                         [](const ::testing::TestParamInfo<Fp8Case>& info) {
                           return info.param.name;
                         });

TEST(MlaAttentionKernelLimitsTest, RejectsTooWideLatent) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  kernels::MlaAttentionParams p;
  p.num_tokens = 1;
  p.num_heads = 1;
  p.cache.latent_dim = kernels::kMaxMlaLatentDim + 1;
  EXPECT_EQ(kernels::MlaAttentionF32(p, nullptr), cudaErrorInvalidValue);
}

TEST(MlaAttentionKernelLimitsTest, ValidMmaVariants) {
  // The kept numbers keep their meaning; the removed variants' numbers are not reused.
  for (int32_t v = -2; v <= kernels::kMaxMlaMmaVariant + 2; ++v) {
    const bool kept = v == 0 || v == 4 || v == 9 || v == 10 || v == 11;
    EXPECT_EQ(kernels::MlaMmaVariantIsValid(v), kept) << "variant " << v;
  }
  EXPECT_STREQ(kernels::kMlaMmaVariantList, "0, 4, 9, 10, 11");
}

// Variant 11 (the key-split kernel's ring form) takes what 9 takes, at any head count: latent
// 512 + rope 64, a 16-byte aligned bf16 cache, or an FP8 one whose rope key is 16-byte aligned
// in the entry. Other shapes and caches run what 9 runs there (variant 4's kernel, or the
// CUDA-core kernels), by name; the FP8 cache it does not take is not read directly.
TEST(MlaAttentionKernelLimitsTest, KeySplitRingTakesTheKeySplitShapes) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  kernels::MlaAttentionParams p;
  p.num_tokens = 8;
  p.num_splits = 1;  // no cluster merge: one name per cache type
  p.mma_variant = 11;
  const kernels::PagedLatentCache bf16{nullptr, 16, 512, 64, kernels::LatentCacheType::kBFloat16};
  const Fp8LatentEntryLayout layout = Fp8LatentLayout(512, 64);
  kernels::PagedLatentCache fp8 = bf16;
  fp8.type = kernels::LatentCacheType::kFp8E4M3;
  fp8.fp8_rope_offset = static_cast<int32_t>(layout.rope_offset);
  fp8.fp8_scale_offset = static_cast<int32_t>(layout.scale_offset);
  fp8.fp8_entry_bytes = static_cast<int32_t>(layout.bytes);
  for (int32_t heads : {1, 16, 20, 32, 48, 64, 128}) {
    SCOPED_TRACE(::testing::Message() << heads << " heads");
    p.num_heads = heads;
    p.cache = bf16;
    EXPECT_STREQ(kernels::MlaAttentionKernelName(p), "mma_bf16_key_split_ring");
    EXPECT_TRUE(kernels::MlaAttentionBf16Operands(p));
    p.cache = fp8;
    EXPECT_STREQ(kernels::MlaAttentionKernelName(p), "mma_fp8_key_split_ring");
    EXPECT_TRUE(kernels::MlaAttentionReadsFp8Directly(p));
  }
  p.num_heads = 16;
  // Shapes and caches the kernel does not take.
  struct Refused {
    const char* what;
    kernels::PagedLatentCache cache;
    const char* kernel;
  };
  kernels::PagedLatentCache latent256 = bf16, rope32 = bf16, unaligned = bf16, f32 = bf16,
                            fp8_rope_unaligned = fp8;
  latent256.latent_dim = 256;
  rope32.rope_dim = 32;
  unaligned.cache = reinterpret_cast<void*>(uintptr_t{8});
  f32.type = kernels::LatentCacheType::kFloat32;
  fp8_rope_unaligned.fp8_rope_offset = 520;  // valid (even, before the scale), not 16-aligned
  fp8_rope_unaligned.fp8_scale_offset = 648;
  ASSERT_TRUE(kernels::Fp8LatentCacheLayoutValid(fp8_rope_unaligned));
  for (const Refused& r :
       {Refused{"latent 256", latent256, "mma_bf16"}, Refused{"rope 32", rope32, "mma_bf16"},
        Refused{"cache not 16-byte aligned", unaligned, "mma_bf16"},
        Refused{"fp32 cache", f32, "grouped_f32"},
        Refused{"FP8 rope key not 16-byte aligned", fp8_rope_unaligned, "grouped_fp8"}}) {
    SCOPED_TRACE(r.what);
    p.cache = r.cache;
    EXPECT_STREQ(kernels::MlaAttentionKernelName(p), r.kernel);
    EXPECT_FALSE(kernels::MlaAttentionBf16Operands(p));
    EXPECT_FALSE(kernels::MlaAttentionReadsFp8Directly(p));
  }
}

TEST(MlaAttentionKernelLimitsTest, RejectsUnknownMmaVariant) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  kernels::MlaAttentionParams p;
  p.num_tokens = 1;
  p.num_heads = 1;
  p.cache = {nullptr, 16, 512, 64, kernels::LatentCacheType::kBFloat16};
  // Out of range, and the numbers of removed variants.
  for (int32_t v : {-1, 1, 2, 3, 5, 6, 7, 8, kernels::kMaxMlaMmaVariant + 1}) {
    SCOPED_TRACE(::testing::Message() << "mma_variant " << v);
    p.mma_variant = v;
    EXPECT_EQ(kernels::MlaAttentionF32(p, nullptr), cudaErrorInvalidValue);
    EXPECT_STREQ(kernels::MlaAttentionKernelName(p), "invalid");
    EXPECT_FALSE(kernels::MlaAttentionBf16Operands(p));
    size_t bytes = 0;
    EXPECT_EQ(kernels::MlaAttentionWorkspaceBytes(p, &bytes), cudaErrorInvalidValue);
  }
}

TEST(MlaAttentionKernelLimitsTest, RejectsTooManySplits) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  kernels::MlaAttentionParams p;
  p.num_tokens = 1;
  p.num_heads = 1;
  p.cache.latent_dim = 512;
  p.cache.rope_dim = 64;
  p.num_splits = kernels::kMaxMlaSplits + 1;
  EXPECT_EQ(kernels::MlaAttentionF32(p, nullptr), cudaErrorInvalidValue);
  size_t bytes = 0;
  EXPECT_EQ(kernels::MlaAttentionWorkspaceBytes(p, &bytes), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace deepinfer
