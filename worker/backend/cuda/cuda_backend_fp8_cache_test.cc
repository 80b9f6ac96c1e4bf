// CudaBackend with an FP8 latent KV cache (fp8_latent_entry.h) against CpuBackend, the
// reference: the cache write (the same bytes), the norm + rope + cache write and its form with
// the W_uk product (the same values within the rounding of one e4m3 step where the fp32 inputs
// differ in the last bit), and MLA attention over the same FP8 entries, eager and replayed from
// a recording, decode and prefill-sized spans, and the non-absorbed prefill. Decode reads the FP8
// entries directly (no "fp8-gather" phase in the op report): one token at a context up to
// CudaTuning::mla_decode_small_max_context by kernels::MlaDecodeSmall, other decode calls by the
// key-split or 64-head wgmma kernel; prefill runs over a bf16 copy of the entries
// (kernels::GatherFp8LatentCacheBf16, the "fp8-gather" phases). Either way decode gives the bits
// of the bf16 cache holding the entries rounded to bf16, and every result is within the bf16
// kernels' tolerances of the CPU over the FP8 entries.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/attention/mla_decode_small.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_backend_test_fixture.h"
#include "worker/backend/fp8_latent_entry.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::CallsOf;
using testing::CudaBackendTest;

// The tensor-core prefill kernels' tolerances (kernels/attention/mla_prefill_test.cc and
// mha_prefill_test.cc: q, the keys and P rounded to bf16) for values of about unit scale.
constexpr double kPrefillAtol = 4e-2, kPrefillRtol = 2e-2;

constexpr int32_t kHeads = 16, kLatent = 512, kRope = 64, kBlock = 16, kEntry = kLatent + kRope;
constexpr int64_t kEntryBytes = Fp8LatentLayout(kLatent, kRope).bytes;

// Entries whose latents are scaled by 2^u from token to token, u uniform in [-binades,
// binades] (so every token has its own scale), and rope keys of unit scale.
std::vector<float> VariedEntries(int64_t tokens, uint32_t seed, float binades) {
  std::vector<float> kv = testing::RandomFloats(tokens * kEntry, seed);
  std::mt19937 gen(seed + 100);
  std::uniform_real_distribution<float> exponent(-binades, binades);
  for (int64_t t = 0; t < tokens; ++t) {
    const float m = std::exp2(exponent(gen));
    for (int32_t i = 0; i < kLatent; ++i) kv[t * kEntry + i] *= m;
  }
  return kv;
}

class CudaBackendFp8CacheTest : public CudaBackendTest {
 protected:
  std::vector<uint8_t> DownloadBytes(const DeviceBuffer& buf) {
    std::vector<uint8_t> v(buf.size_bytes());
    gpu_->CopyToHost(buf.data(), v.size(), v.data());
    return v;
  }
  static PagedLatentCacheView View(void* cache) {
    return {cache, kBlock, kLatent, kRope, WeightDType::kFp8E4M3};
  }
  // Every entry of a cache dequantised (as the attention ops read them).
  static std::vector<float> Dequantized(const std::vector<uint8_t>& cache) {
    const int64_t n = static_cast<int64_t>(cache.size()) / kEntryBytes;
    std::vector<float> out(n * kEntry);
    for (int64_t e = 0; e < n; ++e) {
      DequantizeFp8LatentEntry(cache.data() + e * kEntryBytes, kLatent, kRope,
                               out.data() + e * kEntry);
    }
    return out;
  }
  // The bf16 bits of each value of Dequantized(cache): a bf16 cache of the same slots holding
  // what the FP8 attention's copy holds.
  static std::vector<uint16_t> RoundedToBf16(const std::vector<uint8_t>& cache) {
    const std::vector<float> f = Dequantized(cache);
    std::vector<uint16_t> out(f.size());
    for (size_t i = 0; i < f.size(); ++i) out[i] = FloatToBf16Bits(f[i]);
    return out;
  }
  // A host FP8 cache of `entries` entries (zeros) with kv's entries written by the CPU backend
  // into `slots`, its RoundedToBf16 copy, and both uploaded.
  struct Caches {
    std::vector<uint8_t> fp8;
    std::vector<uint16_t> rounded;
    std::unique_ptr<DeviceBuffer> dfp8, drounded;
  };
  Caches WriteCaches(int64_t entries, const std::vector<float>& kv,
                     const std::vector<int32_t>& slots) {
    Caches c;
    c.fp8.assign(static_cast<size_t>(entries) * kEntryBytes, 0);
    cpu_.WriteLatentCache(static_cast<int64_t>(slots.size()), kv.data(), kEntry,
                          kv.data() + kLatent, kEntry, slots.data(), View(c.fp8.data()));
    c.rounded = RoundedToBf16(c.fp8);
    c.dfp8 = gpu_->Allocate(c.fp8.size());
    gpu_->CopyToDevice(c.fp8.data(), c.fp8.size(), c.dfp8->data());
    c.drounded = gpu_->Allocate(c.rounded.size() * sizeof(uint16_t));
    gpu_->CopyToDevice(c.rounded.data(), c.rounded.size() * sizeof(uint16_t),
                       c.drounded->data());
    return c;
  }
  // The largest magnitude of the latent values of bf16 entries.
  static double MaxLatent(const std::vector<uint16_t>& rounded) {
    double m = 0.0;
    for (int64_t e = 0; e < static_cast<int64_t>(rounded.size()) / kEntry; ++e) {
      for (int32_t i = 0; i < kLatent; ++i) {
        m = std::max<double>(m, std::fabs(Bf16BitsToFloat(rounded[e * kEntry + i])));
      }
    }
    return m;
  }
};

TEST_F(CudaBackendFp8CacheTest, WriteLatentCacheWritesTheHostBytes) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int64_t tokens = 40, slots = 4 * kBlock;
  const std::vector<float> kv = VariedEntries(tokens, seed, /*binades=*/6.0f);
  std::vector<int32_t> slot(slots);
  std::iota(slot.begin(), slot.end(), 0);
  std::shuffle(slot.begin(), slot.end(), std::mt19937(seed));
  slot.resize(tokens);

  std::vector<uint8_t> want(slots * kEntryBytes, 0);
  cpu_.WriteLatentCache(tokens, kv.data(), kEntry, kv.data() + kLatent, kEntry, slot.data(),
                        View(want.data()));
  auto dkv = Upload(kv);
  auto dslot = UploadInts(slot);
  auto dcache = gpu_->Allocate(want.size());
  gpu_->WriteLatentCache(tokens, dkv->as<float>(), kEntry, dkv->as<float>() + kLatent, kEntry,
                         dslot->as<int32_t>(), View(dcache->data()));
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  const std::vector<uint8_t> got = DownloadBytes(*dcache);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t at = static_cast<int64_t>(slot[t]) * kEntryBytes;
    EXPECT_EQ(std::memcmp(got.data() + at, want.data() + at, kEntryBytes), 0)
        << "token " << t << " (slot " << slot[t] << ")";
  }
}

// The norm + rope + cache write (and with the W_uk product, which the CUDA backend then runs as
// the two ops) against CpuBackend's: the rotated query within fp32 rounding, the entries' values
// within one e4m3 step (2^-3 relative; an fp32 input one ulp off may round to the neighbouring
// code) plus the scale's smallest step.
TEST_F(CudaBackendFp8CacheTest, NormRopeWriteLatentCacheMatchesCpu) {
  const int64_t L = kLatent, R = kRope, nh = 4, nope = 128, qk = nope + R, kvw = L + R;
  const int64_t T = 3, slots = kBlock;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const auto kv = testing::RandomFloats(T * kvw, seed, 2.0f);
  const auto q = testing::RandomFloats(T * nh * qk, seed + 1);
  const auto wn = testing::RandomFloats(L, seed + 2);
  const auto wuk = testing::RandomFloats(nh * L * nope, seed + 3, 0.1f);
  std::vector<float> inv_freq(R / 2);
  for (int64_t j = 0; j < R / 2; ++j) inv_freq[j] = std::pow(10000.0f, -2.0f * j / R);
  const std::vector<int32_t> slot = {6, 1, 11}, pos = {1023, 17, 4};
  std::vector<std::unique_ptr<DeviceBuffer>> keep;
  auto fill = [&](float* qv, const float* kvv, const float* w, const float* inv, const int32_t* sl,
                  const int32_t* ps, void* cache, NormRopeCacheArgs* nr, AbsorbQueryArgs* aq,
                  WeightView w_uk, float* out) {
    nr->tokens = T, nr->kv = kvv, nr->ld_kv = kvw, nr->norm_weight = w, nr->eps = 1e-6f;
    nr->q = qv + nope, nr->q_heads = nh, nr->q_token_stride = nh * qk, nr->q_head_stride = qk;
    nr->positions = ps, nr->inv_freq = inv, nr->attention_factor = 1.0f;
    nr->interleaved = true, nr->slots = sl, nr->cache = View(cache);
    aq->heads = nh, aq->nope_dim = nope, aq->latent_dim = L, aq->q_nope = qv;
    aq->q_token_stride = nh * qk, aq->q_head_stride = qk, aq->w_uk = w_uk, aq->q_latent = out;
  };
  std::vector<float> cq = q, cout(T * nh * L);
  std::vector<uint8_t> ccache(slots * kEntryBytes, 0);
  NormRopeCacheArgs nr;
  AbsorbQueryArgs aq;
  fill(cq.data(), kv.data(), wn.data(), inv_freq.data(), slot.data(), pos.data(), ccache.data(),
       &nr, &aq, CpuBf16(wuk, &keep), cout.data());
  cpu16_.NormRopeCacheAbsorbQuery(nr, aq);
  const std::vector<float> want = Dequantized(ccache);

  auto dkv = Upload(kv), dwn = Upload(wn), dinv = Upload(inv_freq);
  auto dslot = UploadInts(slot), dpos = UploadInts(pos);
  const WeightView w_gpu = GpuBf16(wuk, &keep);
  for (bool absorb : {false, true}) {
    SCOPED_TRACE(::testing::Message() << "absorb " << absorb);
    auto dq = Upload(q), dout = Poisoned(T * nh * L);
    auto dcache = gpu_->Allocate(ccache.size());
    fill(dq->as<float>(), dkv->as<float>(), dwn->as<float>(), dinv->as<float>(),
         dslot->as<int32_t>(), dpos->as<int32_t>(), dcache->data(), &nr, &aq, w_gpu,
         dout->as<float>());
    if (absorb) {
      gpu_->NormRopeCacheAbsorbQuery(nr, aq);
    } else {
      gpu_->NormRopeWriteLatentCache(nr);
    }
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    EXPECT_TRUE(AllClose(Download(*dq), cq, 1e-5, 1e-5));
    if (absorb) {
      EXPECT_TRUE(AllClose(Download(*dout), cout, 1e-4, 1e-4));
    }
    const std::vector<uint8_t> bytes = DownloadBytes(*dcache);
    const std::vector<float> got = Dequantized(bytes);
    for (int32_t s : slot) {
      float scale;
      std::memcpy(&scale, ccache.data() + s * kEntryBytes + Fp8LatentLayout(L, R).scale_offset, 4);
      for (int64_t i = 0; i < kvw; ++i) {
        const float g = got[s * kvw + i], w = want[s * kvw + i];
        ASSERT_LE(std::fabs(g - w), std::fabs(w) / 8 + scale / 512 + 1e-6)
            << "slot " << s << " element " << i;
      }
    }
  }
}

// MLA attention over one FP8 cache (the CPU's bytes uploaded, so both read the same entries;
// contexts of 1 .. 300 positions in shuffled blocks): decode tokens (eager with spans, and
// replayed from a recording without them) and prefill-sized spans. Decode reads the FP8 entries
// directly (the key-split kernel; no gather phase in the op report of the eager call) and gives
// the bits of the same call over a bf16 cache holding the entries rounded to bf16 (the same
// kernel on the same values); prefill spans run the bf16 copy's gather (its phase, once) and the
// tensor-core prefill. Every result is within the bf16 kernels' tolerances of the CPU over those
// rounded entries. (Against the CPU over the unrounded FP8 entries the random scores
// here are sensitive enough that the entries' bf16 rounding alone moved 12 of 3M prefill outputs
// by ~0.05: no bound at the kernels' tolerances holds.)
TEST_F(CudaBackendFp8CacheTest, MlaAttentionMatchesCpuOverTheSameEntries) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::vector<int32_t> lens = {37, 300, 1, 129};
  const int32_t seqs = static_cast<int32_t>(lens.size()), max_blocks = 19;
  const int32_t num_blocks = seqs * max_blocks;
  std::mt19937 gen(seed);
  std::vector<int32_t> tables(num_blocks), slots;
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), gen);
  for (int32_t s = 0; s < seqs; ++s) {
    for (int32_t p = 0; p < lens[s]; ++p) {
      slots.push_back(tables[s * max_blocks + p / kBlock] * kBlock + p % kBlock);
    }
  }
  const int64_t cached = static_cast<int64_t>(slots.size());
  const std::vector<float> kv = VariedEntries(cached, seed + 1, /*binades=*/1.0f);
  // The same slots also as a bf16 cache of the entries rounded to bf16.
  Caches c = WriteCaches(int64_t{num_blocks} * kBlock, kv, slots);
  std::vector<uint8_t>& cache = c.fp8;
  std::vector<uint16_t>& rounded = c.rounded;
  auto& dcache = c.dfp8;
  auto& drounded = c.drounded;
  auto dtables = UploadInts(tables);
  const PagedLatentCacheView rounded_view{rounded.data(), kBlock, kLatent, kRope,
                                          WeightDType::kBFloat16};
  const double max_latent = MaxLatent(rounded);
  // The key-split kernel's bound (bf16 Q and P; cuda_backend_attention_test's Bf16OperandsAtol).
  const double key_split_atol = max_latent / 512.0 + 1e-4;

  // Query tokens: `per_seq[s]` last positions of sequence s.
  auto run = [&](const std::vector<int32_t>& per_seq, bool replay) {
    std::vector<int32_t> token_seq, context_len;
    std::vector<MlaSequenceSpan> spans;
    bool decode = true;
    for (int32_t s = 0; s < seqs; ++s) {
      spans.push_back({static_cast<int32_t>(token_seq.size()), per_seq[s], lens[s]});
      decode = decode && per_seq[s] == 1;
      for (int32_t i = 0; i < per_seq[s]; ++i) {
        token_seq.push_back(s);
        context_len.push_back(lens[s] - per_seq[s] + i + 1);
      }
    }
    const int32_t tokens = static_cast<int32_t>(token_seq.size());
    const auto q_latent = testing::RandomFloats(int64_t{tokens} * kHeads * kLatent, seed + 2);
    const auto q_rope = testing::RandomFloats(int64_t{tokens} * kHeads * kRope, seed + 3);
    MlaAttentionArgs a;
    a.num_tokens = tokens;
    a.num_heads = kHeads;
    a.q_latent = q_latent.data();
    a.q_rope = q_rope.data();
    a.q_rope_token_stride = kHeads * kRope;
    a.q_rope_head_stride = kRope;
    a.cache = View(cache.data());
    a.block_tables = tables.data();
    a.max_blocks_per_seq = max_blocks;
    a.token_seq = token_seq.data();
    a.context_len = context_len.data();
    a.softmax_scale = 0.0721f;
    a.sequences = replay ? nullptr : spans.data();
    a.num_sequences = replay ? 0 : seqs;
    const size_t out_size = static_cast<size_t>(tokens) * kHeads * kLatent;
    std::vector<float> want_rounded(out_size);
    // Over the rounded entries; for decode also with Q rounded to bf16 (the key-split kernel).
    std::vector<float> q_latent16 = q_latent, q_rope16 = q_rope;
    if (decode) {
      for (float& x : q_latent16) x = RoundToBf16(x);
      for (float& x : q_rope16) x = RoundToBf16(x);
    }
    MlaAttentionArgs ar = a;
    ar.cache = rounded_view;
    ar.q_latent = q_latent16.data();
    ar.q_rope = q_rope16.data();
    ar.out_latent = want_rounded.data();
    cpu_.MlaAttention(ar);

    auto dql = Upload(q_latent), dqr = Upload(q_rope);
    auto out = Poisoned(out_size), out_bf16_cache = Poisoned(out_size);
    auto dseq = UploadInts(token_seq), dctx = UploadInts(context_len);
    MlaAttentionArgs g = a;
    g.q_latent = dql->as<float>();
    g.q_rope = dqr->as<float>();
    g.cache = View(dcache->data());
    g.block_tables = dtables->as<int32_t>();
    g.token_seq = dseq->as<int32_t>();
    g.context_len = dctx->as<int32_t>();
    MlaAttentionArgs g16 = g;
    g16.cache = {drounded->data(), kBlock, kLatent, kRope, WeightDType::kBFloat16};
    g.out_latent = out->as<float>();
    g16.out_latent = out_bf16_cache->as<float>();
    if (replay) {
      g.max_context_hint = 300;
      g16.max_context_hint = 300;
      auto ops = Record([&] {
        gpu_->MlaAttention(g);
        gpu_->MlaAttention(g16);
        return true;
      });
      ASSERT_NE(ops, nullptr);
      ASSERT_TRUE(ops->Replay().ok());
    } else {
      gpu_->SetOpTiming(true);
      gpu_->MlaAttention(g);
      const std::string report = gpu_->TakeOpTimingReport();
      gpu_->SetOpTiming(false);
      // (-1: no such line in the report.)
      EXPECT_EQ(CallsOf(report, "MlaAttention/fp8-gather"), decode ? -1 : 1) << report;
      EXPECT_EQ(CallsOf(report, "MlaAttention"), 1) << report;
      gpu_->MlaAttention(g16);
    }
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    const std::vector<float> got = Download(*out);
    if (decode) {
      EXPECT_TRUE(testing::SameBits(got, Download(*out_bf16_cache), out_size));
      EXPECT_TRUE(AllClose(got, want_rounded, key_split_atol, 5e-4));
    } else {
      EXPECT_TRUE(AllClose(got, want_rounded, kPrefillAtol, kPrefillRtol));
    }
  };
  {
    SCOPED_TRACE("decode");
    run({1, 1, 1, 1}, /*replay=*/false);
  }
  {
    SCOPED_TRACE("decode, replayed");
    run({1, 1, 1, 1}, /*replay=*/true);
  }
  {
    SCOPED_TRACE("prefill spans");
    run({37, 200, 1, 129}, /*replay=*/false);
  }
}

// One decode token at contexts 1, 33, 129 and 300 (<= CudaTuning::mla_decode_small_max_context):
// MlaDecodeSmall reads the FP8 entries itself: no gather phase in the op report, the bits of the
// same call over a bf16 cache of the entries rounded to bf16 (the one-launch kernel there too, at
// the same cluster shape), within fp32 tolerances of the CPU over those rounded entries (the
// kernel's math is fp32 on the exact rounded values), and the same bits replayed from a
// recording whose class bound (max_context_hint) is at most the maximum. With a bound above it
// the recording runs the key-split kernel (on the FP8 entries): the bits of that kernel over the
// bf16 cache, and not the one-launch kernel's (which tells the two paths apart).
TEST_F(CudaBackendFp8CacheTest, OneDecodeTokenReadsTheFp8EntriesWithoutACopy) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int32_t kMaxBlocks = 19;
  const int32_t max_context = gpu_->tuning().mla_decode_small_max_context;
  ASSERT_GE(max_context, 300) << "the contexts below are meant to be within the maximum";
  std::mt19937 gen(seed);
  std::vector<int32_t> table(kMaxBlocks + 5);  // 5 blocks the sequence does not own
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), gen);
  const int32_t num_blocks = static_cast<int32_t>(table.size());
  table.resize(kMaxBlocks);
  std::vector<int32_t> slots;
  for (int32_t p = 0; p < kMaxBlocks * kBlock; ++p) {
    slots.push_back(table[p / kBlock] * kBlock + p % kBlock);
  }
  const int64_t cached = static_cast<int64_t>(slots.size());
  const std::vector<float> kv = VariedEntries(cached, seed + 1, /*binades=*/1.0f);
  Caches c = WriteCaches(int64_t{num_blocks} * kBlock, kv, slots);
  std::vector<uint16_t>& rounded = c.rounded;
  auto& dcache = c.dfp8;
  auto& drounded = c.drounded;
  auto dtable = UploadInts(table), dseq = UploadInts({0});
  const auto q_latent = testing::RandomFloats(int64_t{kHeads} * kLatent, seed + 2);
  const auto q_rope = testing::RandomFloats(int64_t{kHeads} * kRope, seed + 3);
  auto dql = Upload(q_latent), dqr = Upload(q_rope);
  const size_t out_size = static_cast<size_t>(kHeads) * kLatent;
  auto out = Poisoned(out_size), out16 = Poisoned(out_size);

  // The kernel's cluster shape over each cache (the same: the two forms' kernels have the same
  // shared memory and occupancy), for the bit-for-bit comparison below.
  kernels::MlaAttentionParams kp;
  kp.num_tokens = 1;
  kp.num_heads = kHeads;
  kp.q_latent = dql->as<float>();
  kp.out_latent = out->as<float>();
  constexpr Fp8LatentEntryLayout kLayout = Fp8LatentLayout(kLatent, kRope);
  kp.cache = {dcache->data(),
              kBlock,
              kLatent,
              kRope,
              kernels::LatentCacheType::kFp8E4M3,
              static_cast<int32_t>(kLayout.rope_offset),
              static_cast<int32_t>(kLayout.scale_offset),
              static_cast<int32_t>(kLayout.bytes)};
  if (!kernels::MlaDecodeSmallSupported(kp)) GTEST_SKIP() << "no thread-block clusters";
  kernels::MlaAttentionParams kp16 = kp;
  kp16.cache = {drounded->data(), kBlock, kLatent, kRope, kernels::LatentCacheType::kBFloat16};
  int cluster = 0, heads = 0, cluster16 = 0, heads16 = 0;
  ASSERT_EQ(kernels::MlaDecodeSmallShape(kp, {}, &cluster, &heads), cudaSuccess);
  ASSERT_EQ(kernels::MlaDecodeSmallShape(kp16, {}, &cluster16, &heads16), cudaSuccess);
  ASSERT_EQ(cluster, cluster16);
  ASSERT_EQ(heads, heads16);

  for (const int32_t len : {1, 33, 129, 300}) {
    SCOPED_TRACE(::testing::Message() << "context " << len);
    const std::vector<int32_t> ctx = {len};
    auto dctx = UploadInts(ctx);
    const MlaSequenceSpan span{0, 1, len};
    MlaAttentionArgs a;
    a.num_tokens = 1;
    a.num_heads = kHeads;
    a.q_latent = q_latent.data();
    a.q_rope = q_rope.data();
    a.q_rope_token_stride = kHeads * kRope;
    a.q_rope_head_stride = kRope;
    a.cache = {rounded.data(), kBlock, kLatent, kRope, WeightDType::kBFloat16};
    a.block_tables = table.data();
    a.max_blocks_per_seq = kMaxBlocks;
    const std::vector<int32_t> token_seq = {0};
    a.token_seq = token_seq.data();
    a.context_len = ctx.data();
    a.softmax_scale = 0.0721f;
    std::vector<float> want(out_size);
    a.out_latent = want.data();
    cpu_.MlaAttention(a);

    MlaAttentionArgs g = a;
    g.q_latent = dql->as<float>();
    g.q_rope = dqr->as<float>();
    g.cache = View(dcache->data());
    g.block_tables = dtable->as<int32_t>();
    g.token_seq = dseq->as<int32_t>();
    g.context_len = dctx->as<int32_t>();
    MlaAttentionArgs g16 = g;
    g16.cache = {drounded->data(), kBlock, kLatent, kRope, WeightDType::kBFloat16};
    // Fresh NaN outputs for a call and its bf16-cache twin.
    auto poison = [&](MlaAttentionArgs* x, MlaAttentionArgs* x16) {
      out = Poisoned(out_size);
      out16 = Poisoned(out_size);
      x->out_latent = out->as<float>();
      x16->out_latent = out16->as<float>();
    };

    // Eager, with the span.
    g.sequences = g16.sequences = &span;
    g.num_sequences = g16.num_sequences = 1;
    poison(&g, &g16);
    gpu_->SetOpTiming(true);
    gpu_->MlaAttention(g);
    const std::string report = gpu_->TakeOpTimingReport();
    gpu_->SetOpTiming(false);
    EXPECT_EQ(CallsOf(report, "MlaAttention"), 1) << report;
    EXPECT_LT(CallsOf(report, "MlaAttention/fp8-gather"), 1) << report;  // no such line
    gpu_->MlaAttention(g16);
    ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
    const std::vector<float> eager = Download(*out);
    EXPECT_TRUE(testing::SameBits(eager, Download(*out16), out_size));
    EXPECT_TRUE(AllClose(eager, want, 1e-4, 5e-4));

    // Replayed without spans: the class bound at the maximum (the one-launch kernel), then above
    // it (the key-split kernel).
    for (const int32_t hint : {max_context, max_context + 1}) {
      SCOPED_TRACE(::testing::Message() << "replayed, max_context_hint " << hint);
      MlaAttentionArgs r = g, r16 = g16;
      r.sequences = r16.sequences = nullptr;
      r.num_sequences = r16.num_sequences = 0;
      r.max_context_hint = r16.max_context_hint = hint;
      poison(&r, &r16);
      auto ops = Record([&] {
        gpu_->MlaAttention(r);
        gpu_->MlaAttention(r16);
        return true;
      });
      ASSERT_NE(ops, nullptr);
      ASSERT_TRUE(ops->Replay().ok());
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      const std::vector<float> got = Download(*out);
      EXPECT_TRUE(testing::SameBits(got, Download(*out16), out_size));
      if (hint <= max_context) {
        EXPECT_TRUE(testing::SameBits(got, eager, out_size));
      } else if (len > 1) {  // (one key: both give its latent exactly)
        EXPECT_NE(std::memcmp(got.data(), eager.data(), out_size * sizeof(float)), 0)
            << "the key-split path gave the one-launch kernel's bits: the paths are not told apart";
      }
    }
  }
}

// Decode tokens replayed from a recording whose block table is wider than the bf16 copy's cap
// allows (kFp8CopyMaxBytes, 512 MiB: at 2^14 blocks of 16 a row the copy takes 288 MiB a token,
// at 2^16 1.125 GiB). 16 heads at 2 tokens (the key-split kernel) and 128 heads at 16 tokens
// (the 64-head wgmma kernel on compute capability 9.0): the kernel reads the FP8 entries whatever
// the width (no copy), the bits of the same call over a bf16 cache of the rounded entries. One
// token at a short context: the one-token kernel reads the FP8 entries at both widths (the bits
// of the bf16 cache's call). Every result is within the bf16-operand bound of the CPU over the
// rounded entries with Q rounded to bf16 (the one-token kernel: within fp32 tolerances of the CPU
// over unrounded Q).
TEST_F(CudaBackendFp8CacheTest, WideTablesReadTheFp8Entries) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const int32_t used_blocks = 19;
  struct Shape {
    int32_t heads, seqs;
    bool short_hint;  // max_context_hint 300: the one-token kernel's range
  };
  for (const Shape& shape : {Shape{16, 2, false}, Shape{128, 16, false}, Shape{16, 1, true}}) {
    const int32_t heads = shape.heads, seqs = shape.seqs;
    SCOPED_TRACE(::testing::Message() << heads << " heads, " << seqs << " tokens");
    std::vector<int32_t> lens;
    for (int32_t s = 0; s < seqs; ++s) lens.push_back(s == 0 ? 300 : 1 + (s * 45) % 300);
    const int32_t num_blocks = seqs * used_blocks;
    std::mt19937 gen(seed);
    std::vector<int32_t> perm(num_blocks), slots;
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), gen);
    int64_t cached = 0;
    for (int32_t len : lens) cached += len;
    const std::vector<float> kv = VariedEntries(cached, seed + 1, /*binades=*/1.0f);
    const auto q_latent = testing::RandomFloats(int64_t{seqs} * heads * kLatent, seed + 2);
    const auto q_rope = testing::RandomFloats(int64_t{seqs} * heads * kRope, seed + 3);
    std::vector<float> q_latent16 = q_latent, q_rope16 = q_rope;
    for (float& x : q_latent16) x = RoundToBf16(x);
    for (float& x : q_rope16) x = RoundToBf16(x);
    std::vector<int32_t> token_seq(seqs);
    std::iota(token_seq.begin(), token_seq.end(), 0);
    auto dql = Upload(q_latent), dqr = Upload(q_rope);
    auto dseq = UploadInts(token_seq), dctx = UploadInts(lens);
    for (const int32_t width : {1 << 14, 1 << 16}) {
      SCOPED_TRACE(::testing::Message() << "table width " << width);
      std::vector<int32_t> tables(static_cast<size_t>(seqs) * width, 0);
      slots.clear();
      for (int32_t s = 0; s < seqs; ++s) {
        for (int32_t b = 0; b < used_blocks; ++b) tables[s * width + b] = perm[s * used_blocks + b];
        for (int32_t p = 0; p < lens[s]; ++p) {
          slots.push_back(tables[s * width + p / kBlock] * kBlock + p % kBlock);
        }
      }
      Caches c = WriteCaches(int64_t{num_blocks} * kBlock, kv, slots);
      std::vector<uint16_t>& rounded = c.rounded;
      auto& dcache = c.dfp8;
      auto& drounded = c.drounded;
      auto dtables = UploadInts(tables);
      const size_t out_size = static_cast<size_t>(seqs) * heads * kLatent;
      auto out = Poisoned(out_size), out16 = Poisoned(out_size);
      MlaAttentionArgs g;
      g.num_tokens = seqs;
      g.num_heads = heads;
      g.q_latent = dql->as<float>();
      g.q_rope = dqr->as<float>();
      g.q_rope_token_stride = int64_t{heads} * kRope;
      g.q_rope_head_stride = kRope;
      g.cache = View(dcache->data());
      g.block_tables = dtables->as<int32_t>();
      g.max_blocks_per_seq = width;
      g.token_seq = dseq->as<int32_t>();
      g.context_len = dctx->as<int32_t>();
      g.softmax_scale = 0.0721f;
      g.max_context_hint = shape.short_hint ? 300 : width * kBlock;
      MlaAttentionArgs g16 = g;
      g16.cache = {drounded->data(), kBlock, kLatent, kRope, WeightDType::kBFloat16};
      g.out_latent = out->as<float>();
      g16.out_latent = out16->as<float>();
      auto ops = Record([&] {
        gpu_->MlaAttention(g);
        gpu_->MlaAttention(g16);
        return true;
      });
      ASSERT_NE(ops, nullptr);
      ASSERT_TRUE(ops->Replay().ok());
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      const std::vector<float> got = Download(*out), got16 = Download(*out16);
      const double max_latent = MaxLatent(rounded);
      std::vector<float> want(out_size);
      MlaAttentionArgs a = g;
      a.q_latent = q_latent16.data();
      a.q_rope = q_rope16.data();
      a.cache = {rounded.data(), kBlock, kLatent, kRope, WeightDType::kBFloat16};
      a.block_tables = tables.data();
      a.token_seq = token_seq.data();
      a.context_len = lens.data();
      a.out_latent = want.data();
      cpu_.MlaAttention(a);
      const double atol = max_latent / 512.0 + 1e-4;
      if (!shape.short_hint) {
        EXPECT_TRUE(AllClose(got, want, atol, 5e-4));
        EXPECT_TRUE(AllClose(got16, want, atol, 5e-4));
        EXPECT_TRUE(testing::SameBits(got, got16, out_size));
        continue;
      }
      // One token: both calls run the one-token kernel (fp32 math on Q itself: within fp32
      // tolerances of the CPU over unrounded Q), or on a device without it the key-split kernel
      // (the bound above); the FP8 call on the FP8 entries, with the bf16 call's bits.
      std::vector<float> want_f32(out_size);
      a.q_latent = q_latent.data();
      a.q_rope = q_rope.data();
      a.out_latent = want_f32.data();
      cpu_.MlaAttention(a);
      EXPECT_TRUE(AllClose(got16, want_f32, 1e-4, 1e-4) || AllClose(got16, want, atol, 5e-4));
      EXPECT_TRUE(testing::SameBits(got, got16, out_size));
    }
  }
}

// The non-absorbed prefill over an FP8 cache: taken (its gather phase in the op report), within
// the tensor-core prefill's tolerance of the CPU over the FP8 entries, and of the same call over
// a bf16 cache of the entries rounded to bf16.
TEST_F(CudaBackendFp8CacheTest, MhaPrefillRunsOnTheBf16CopyAndMatchesCpu) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  constexpr int32_t kNope = 128, kV = 128, kQk = kNope + kRope;
  // (cached before, new tokens) per sequence.
  const std::vector<std::pair<int32_t, int32_t>> seq_shapes = {{100, 37}, {0, 200}, {63, 65}};
  const int32_t seqs = static_cast<int32_t>(seq_shapes.size()), max_blocks = 19;
  std::mt19937 gen(seed);
  std::vector<int32_t> tables(seqs * max_blocks), slots;
  std::iota(tables.begin(), tables.end(), 0);
  std::shuffle(tables.begin(), tables.end(), gen);
  std::vector<MlaSequenceSpan> spans;
  int32_t tokens = 0;
  for (int32_t s = 0; s < seqs; ++s) {
    const int32_t len = seq_shapes[s].first + seq_shapes[s].second;
    spans.push_back({tokens, seq_shapes[s].second, len});
    tokens += seq_shapes[s].second;
    for (int32_t p = 0; p < len; ++p) {
      slots.push_back(tables[s * max_blocks + p / kBlock] * kBlock + p % kBlock);
    }
  }
  const int64_t cached = static_cast<int64_t>(slots.size());
  const std::vector<float> kv = VariedEntries(cached, seed + 1, /*binades=*/0.5f);
  Caches c = WriteCaches(int64_t{seqs} * max_blocks * kBlock, kv, slots);
  std::vector<uint8_t>& cache = c.fp8;
  const std::vector<float> q = testing::RandomFloats(int64_t{tokens} * kHeads * kQk, seed + 2);
  const std::vector<float> w =
      testing::RandomFloats(static_cast<size_t>(kHeads) * (kNope + kV) * kLatent, seed + 3,
                            1.0f / std::sqrt(static_cast<float>(kLatent)));
  std::vector<uint16_t> kv_b(w.size());
  for (size_t i = 0; i < w.size(); ++i) kv_b[i] = FloatToBf16Bits(w[i]);

  MhaPrefillArgs a;
  a.num_tokens = tokens;
  a.num_heads = kHeads;
  a.nope_dim = kNope;
  a.v_dim = kV;
  a.q = q.data();
  a.q_token_stride = int64_t{kHeads} * kQk;
  a.q_head_stride = kQk;
  a.cache = View(cache.data());
  a.block_tables = tables.data();
  a.max_blocks_per_seq = max_blocks;
  a.kv_b = WeightView(kv_b.data(), WeightDType::kBFloat16);
  a.sequences = spans.data();
  a.num_sequences = seqs;
  a.softmax_scale = 0.0721f;
  const size_t out_size = static_cast<size_t>(tokens) * kHeads * kV;
  std::vector<float> want(out_size);
  a.out = want.data();
  ASSERT_TRUE(cpu16_.MhaPrefillAttention(a));
  ASSERT_TRUE(cpu16_.status().ok()) << cpu16_.status();

  auto dq = Upload(q);
  auto& dcache = c.dfp8;
  auto& drounded = c.drounded;
  auto dtables = UploadInts(tables);
  auto dkv_b = gpu_->Allocate(kv_b.size() * sizeof(uint16_t));
  gpu_->CopyToDevice(kv_b.data(), kv_b.size() * sizeof(uint16_t), dkv_b->data());
  auto out = Poisoned(out_size), out16 = Poisoned(out_size);
  MhaPrefillArgs g = a;
  g.q = dq->as<float>();
  g.cache = View(dcache->data());
  g.block_tables = dtables->as<int32_t>();
  g.kv_b = WeightView(static_cast<const void*>(dkv_b->data()), WeightDType::kBFloat16);
  g.out = out->as<float>();
  gpu_->SetOpTiming(true);
  ASSERT_TRUE(gpu_->MhaPrefillAttention(g));
  const std::string report = gpu_->TakeOpTimingReport();
  gpu_->SetOpTiming(false);
  EXPECT_EQ(CallsOf(report, "MhaPrefillAttention"), 1) << report;
  EXPECT_EQ(CallsOf(report, "MhaPrefillAttention/fp8-gather"), 1) << report;
  MhaPrefillArgs g16 = g;
  g16.cache = {drounded->data(), kBlock, kLatent, kRope, WeightDType::kBFloat16};
  g16.out = out16->as<float>();
  ASSERT_TRUE(gpu_->MhaPrefillAttention(g16));
  ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
  const std::vector<float> got = Download(*out);
  EXPECT_TRUE(AllClose(got, want, kPrefillAtol, kPrefillRtol));
  EXPECT_TRUE(AllClose(got, Download(*out16), kPrefillAtol, kPrefillRtol));
}

}  // namespace
}  // namespace deepinfer
