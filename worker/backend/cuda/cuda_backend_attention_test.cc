// CudaBackend's attention ops against CpuBackend: MLA decode attention (the key-split kernel and
// the one-launch kernel, chosen by the context, its hint and CudaTuning's break) and the latent
// norm + rope + cache write + W_uk product in one launch.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/backend/bf16.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/cuda_backend_test_fixture.h"

namespace deepinfer {
namespace {

using testing::AllClose;
using testing::CallsOf;
using testing::CudaBackendTest;

// CudaBackendTest with decode-attention cases: the device side of a CpuBackend case and the
// reference of the kernels with bf16 Q and P.
class CudaBackendAttentionTest : public CudaBackendTest {
 protected:
  // CpuBackend's MlaAttention of host args `a` with Q (latent and rope) rounded to bf16: the
  // reference of the decode kernels with bf16 Q and P (kernels::MlaAttentionBf16Operands).
  std::vector<float> CpuMlaOverBf16Q(const MlaAttentionArgs& a, size_t out_size) {
    const size_t ql = static_cast<size_t>(a.num_tokens) * a.num_heads * a.cache.latent_dim;
    const size_t qr = static_cast<size_t>(a.num_tokens) * a.q_rope_token_stride;
    std::vector<float> q_latent16(a.q_latent, a.q_latent + ql), q_rope16(a.q_rope, a.q_rope + qr);
    for (float& x : q_latent16) x = RoundToBf16(x);
    for (float& x : q_rope16) x = RoundToBf16(x);
    MlaAttentionArgs a16 = a;
    a16.q_latent = q_latent16.data();
    a16.q_rope = q_rope16.data();
    std::vector<float> out(out_size);
    a16.out_latent = out.data();
    cpu_.MlaAttention(a16);
    return out;
  }
  // P's rounding bound of those kernels, 2^-9 max |latent| (kernels/attention/mla_attention_test
  // derives it), plus 1e-4, over the `cached` entries of kv (latent then rope, latent_dim first).
  static double Bf16OperandsAtol(const std::vector<float>& kv, int64_t cached, int32_t latent_dim) {
    const int64_t entry = static_cast<int64_t>(kv.size()) / cached;
    double max_latent = 0.0;
    for (int64_t t = 0; t < cached; ++t) {
      for (int32_t i = 0; i < latent_dim; ++i) {
        max_latent = std::max<double>(max_latent, std::fabs(RoundToBf16(kv[t * entry + i])));
      }
    }
    return max_latent / 512.0 + 1e-4;
  }

  // The device side of a decode-attention case whose CpuBackend side `cpu` attends over the
  // `cached` entries of kv (latent then rope, entry_dim() floats each) written at `slots` into
  // a cache of `cache_elems` values (cpu.cache's layout): the same inputs uploaded, the cache
  // written by this backend, and `args` = cpu repointed at them (out_latent left to the caller).
  struct DeviceMla {
    std::vector<std::unique_ptr<DeviceBuffer>> buffers;
    MlaAttentionArgs args;
  };
  DeviceMla UploadMla(const MlaAttentionArgs& cpu, int64_t cached, const std::vector<float>& kv,
                      const std::vector<int32_t>& slots, const std::vector<int32_t>& tables,
                      const std::vector<int32_t>& token_seq,
                      const std::vector<int32_t>& context_len, const std::vector<float>& q_latent,
                      const std::vector<float>& q_rope, size_t cache_elems) {
    DeviceMla d;
    auto keep = [&](std::unique_ptr<DeviceBuffer> b) {
      d.buffers.push_back(std::move(b));
      return d.buffers.back().get();
    };
    auto ints = [&](const std::vector<int32_t>& v) {
      auto buf = gpu_->Allocate(v.size() * sizeof(int32_t));
      gpu_->CopyToDevice(v.data(), v.size() * sizeof(int32_t), buf->data());
      return keep(std::move(buf))->as<int32_t>();
    };
    const float* dkv = keep(Upload(kv))->as<float>();
    const int32_t* dslots = ints(slots);
    PagedLatentCacheView view = cpu.cache;
    view.cache = keep(gpu_->Allocate(cache_elems * WeightDTypeSize(view.dtype)))->data();
    const int32_t entry = view.entry_dim();
    gpu_->WriteLatentCache(cached, dkv, entry, dkv + view.latent_dim, entry, dslots, view);
    d.args = cpu;
    d.args.q_latent = keep(Upload(q_latent))->as<float>();
    d.args.q_rope = keep(Upload(q_rope))->as<float>();
    d.args.cache = view;
    d.args.block_tables = ints(tables);
    d.args.token_seq = ints(token_seq);
    d.args.context_len = ints(context_len);
    return d;
  }

  // A decode case of Moonlight's attention shape (16 heads, latent 512 + rope 64, bf16 cache,
  // blocks of 16): one token per sequence, sequence q with lens[q] cached positions in shuffled
  // blocks (max_blocks a sequence), random cache entries and queries; `cpu` the CpuBackend's args
  // over it (out_latent left to the caller) and `device` the same case on gpu_.
  static constexpr int32_t kHeads = 16, kLatent = 512, kRope = 64, kBlock = 16;
  static constexpr int32_t kEntry = kLatent + kRope;
  struct MlaCase {
    std::vector<int32_t> tables, slots, token_seq, context_len;
    std::vector<float> kv, q_latent, q_rope;
    std::vector<uint16_t> cache_cpu;
    int64_t cached = 0;
    MlaAttentionArgs cpu;
    DeviceMla device;
  };
  std::unique_ptr<MlaCase> MakeMlaCase(const std::vector<int32_t>& lens, int32_t max_blocks,
                                       uint32_t seed) {
    auto c = std::make_unique<MlaCase>();
    const int32_t seqs = static_cast<int32_t>(lens.size()), num_blocks = seqs * max_blocks;
    std::mt19937 gen(seed);
    c->tables.resize(num_blocks);  // sequence q owns row q
    std::iota(c->tables.begin(), c->tables.end(), 0);
    std::shuffle(c->tables.begin(), c->tables.end(), gen);
    for (int32_t q = 0; q < seqs; ++q) {
      for (int32_t p = 0; p < lens[q]; ++p) {
        c->slots.push_back(c->tables[q * max_blocks + p / kBlock] * kBlock + p % kBlock);
      }
      c->token_seq.push_back(q);
      c->context_len.push_back(lens[q]);
    }
    c->cached = static_cast<int64_t>(c->slots.size());
    c->kv = testing::RandomFloats(c->cached * kEntry, seed + 1);
    c->q_latent = testing::RandomFloats(int64_t{seqs} * kHeads * kLatent, seed + 2);
    c->q_rope = testing::RandomFloats(int64_t{seqs} * kHeads * kRope, seed + 3);
    const size_t cache_elems = static_cast<size_t>(num_blocks) * kBlock * kEntry;
    c->cache_cpu.assign(cache_elems, 0);
    const PagedLatentCacheView cpu_view{c->cache_cpu.data(), kBlock, kLatent, kRope,
                                        WeightDType::kBFloat16};
    cpu_.WriteLatentCache(c->cached, c->kv.data(), kEntry, c->kv.data() + kLatent, kEntry,
                          c->slots.data(), cpu_view);
    MlaAttentionArgs& a = c->cpu;
    a.num_tokens = seqs;
    a.num_heads = kHeads;
    a.q_latent = c->q_latent.data();
    a.q_rope = c->q_rope.data();
    a.q_rope_token_stride = kHeads * kRope;
    a.q_rope_head_stride = kRope;
    a.cache = cpu_view;
    a.block_tables = c->tables.data();
    a.max_blocks_per_seq = max_blocks;
    a.token_seq = c->token_seq.data();
    a.context_len = c->context_len.data();
    a.softmax_scale = 0.0721f;
    c->device = UploadMla(a, c->cached, c->kv, c->slots, c->tables, c->token_seq, c->context_len,
                          c->q_latent, c->q_rope, cache_elems);
    return c;
  }
};

// Decode attention of 3 tokens (bf16 cache, Moonlight's 16 heads of latent 512 + rope 64,
// shuffled blocks of 16; the key-split kernel with bf16 Q and P) against CpuBackend over the same
// cache values and Q rounded to bf16, within P's rounding bound 2^-9 max |latent|
// (kernels/attention/mla_attention_test.cc derives it).
TEST_F(CudaBackendAttentionTest, MlaDecodeMatchesCpu) {
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::unique_ptr<MlaCase> c = MakeMlaCase({37, 300, 1}, 19, seed);
  const std::vector<float> want16 = CpuMlaOverBf16Q(c->cpu, 3 * kHeads * kLatent);
  MlaAttentionArgs g = c->device.args;
  auto out = Poisoned(want16.size());
  g.out_latent = out->as<float>();
  gpu_->MlaAttention(g);
  EXPECT_TRUE(AllClose(Download(*out), want16, Bf16OperandsAtol(c->kv, c->cached, kLatent), 5e-4));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// CudaTuning::mla_decode_small_max_context: checked at Create (>= 1), reported as the one-token
// context break (more tokens: always the key-split kernel, no break).
TEST_F(CudaBackendAttentionTest, MlaDecodeSmallMaxContextIsCheckedAndReportedAsTheBreak) {
  for (int32_t bad : {0, -1}) {
    CudaTuning t;
    t.mla_decode_small_max_context = bad;
    const absl::Status st = CudaBackend::Create(0, WeightDType::kBFloat16, t).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(
        st.message().find("mla_decode_small_max_context must be >= 1, got " + std::to_string(bad)),
        absl::string_view::npos)
        << st;
  }
  EXPECT_EQ(gpu_->MlaDecodeContextBreak(1), gpu_->tuning().mla_decode_small_max_context);
  EXPECT_EQ(gpu_->MlaDecodeContextBreak(2), 0);
  CudaTuning t;
  t.mla_decode_small_max_context = 300;
  auto b = CudaBackend::Create(0, WeightDType::kBFloat16, t);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ((*b)->MlaDecodeContextBreak(1), 300);
  EXPECT_EQ((*b)->MlaDecodeContextBreak(2), 0);
}

// One decode token (300 positions, Moonlight's attention shape): the kernel is chosen by the
// longest context, from the spans where given, else from max_context_hint (a recorded step's
// class bound), never from an unknown one; either kernel matches CpuBackend. The two kernels'
// bits differ, so equal bits tell which one ran.
TEST_F(CudaBackendAttentionTest, OneTokenDecodeKernelFollowsTheContextOrItsHint) {
  constexpr int32_t kLen = 300;
  const uint32_t seed = testing::FreshSeed();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const std::unique_ptr<MlaCase> c = MakeMlaCase({kLen}, 19, seed);
  std::vector<float> want(kHeads * kLatent);
  MlaAttentionArgs a = c->cpu;
  a.out_latent = want.data();
  cpu_.MlaAttention(a);
  const DeviceMla& device = c->device;

  const MlaSequenceSpan span{0, 1, kLen};
  // A backend whose one-launch kernel takes contexts up to max_context (gpu_ holds the buffers).
  std::vector<std::unique_ptr<CudaBackend>> backends;
  auto with_max_context = [&](int32_t max_context) {
    CudaTuning t;
    t.mla_decode_small_max_context = max_context;
    auto b = CudaBackend::Create(0, WeightDType::kBFloat16, t);
    EXPECT_TRUE(b.ok()) << b.status();
    backends.push_back(std::move(*b));
    return backends.back().get();
  };
  auto run = [&](CudaBackend* be, const MlaSequenceSpan* spans, int32_t hint) {
    MlaAttentionArgs g = device.args;
    g.sequences = spans;
    g.num_sequences = spans != nullptr ? 1 : 0;
    g.max_context_hint = hint;
    auto out = Poisoned(want.size());
    g.out_latent = out->as<float>();
    gpu_->Synchronize();  // be's stream does not wait for gpu_'s copies
    be->MlaAttention(g);
    be->Synchronize();
    EXPECT_TRUE(be->status().ok()) << be->status();
    return Download(*out);
  };
  CudaBackend* below = with_max_context(kLen - 1);
  CudaBackend* at = with_max_context(kLen);
  CudaBackend* any = with_max_context(1 << 20);
  // The references: the key-split kernel (the context above the one-launch kernel's maximum;
  // bf16 Q and P: against the CPU over Q rounded to bf16, as MlaDecodeMatchesCpu), and the
  // one-launch kernel for any context (fp32 Q and P).
  const std::vector<float> key_split = run(below, &span, 0);
  const std::vector<float> small = run(any, &span, 0);
  const std::vector<float> want16 = CpuMlaOverBf16Q(c->cpu, want.size());
  EXPECT_TRUE(AllClose(key_split, want16, Bf16OperandsAtol(c->kv, kLen, kLatent), 5e-4));
  EXPECT_TRUE(AllClose(small, want, 1e-4, 5e-4));
  ASSERT_NE(std::memcmp(key_split.data(), small.data(), small.size() * sizeof(float)), 0)
      << "the two kernels gave the same bits: this test cannot tell them apart";
  auto same = [](const std::vector<float>& x, const std::vector<float>& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  };

  EXPECT_TRUE(same(run(at, &span, 0), small));               // spans: the real context, at the max
  EXPECT_TRUE(same(run(at, &span, kLen + 1), small));        // spans win over the hint
  EXPECT_TRUE(same(run(at, nullptr, kLen), small));          // a class bound at the max
  EXPECT_TRUE(same(run(at, nullptr, kLen + 1), key_split));  // above it
  EXPECT_TRUE(same(run(at, nullptr, 0), key_split));         // unknown
  EXPECT_TRUE(same(run(below, &span, 0), key_split));        // the real context above the max
  EXPECT_TRUE(same(run(below, &span, 1), key_split));
  EXPECT_TRUE(gpu_->status().ok()) << gpu_->status();
}

// One decode token's latent norm + rope + cache write and W_uk product: the fused launch gives
// the bits of the two launches (Backend's ops on this backend), and both are within fp32
// rounding of CpuBackend's two ops with the same bf16 weights. Two tokens take the two launches
// (the same bits either way).
TEST_F(CudaBackendAttentionTest, NormRopeCacheAbsorbQueryMatchesTheTwoOpsAndCpu) {
  const int64_t L = 512, R = 64, nh = 16, nope = 128, qk = nope + R, kvw = L + R, slots = 8;
  for (int64_t T : {1, 2}) {
    const uint32_t seed = testing::FreshSeed();
    SCOPED_TRACE(::testing::Message() << "tokens " << T << " seed " << seed);
    const auto kv = testing::RandomFloats(T * kvw, seed, 2.0f);
    const auto q = testing::RandomFloats(T * nh * qk, seed + 1);
    const auto wn = testing::RandomFloats(L, seed + 2);
    const auto wuk = testing::RandomFloats(nh * L * nope, seed + 3, 0.1f);
    std::vector<float> inv_freq(R / 2);
    for (int64_t j = 0; j < R / 2; ++j) inv_freq[j] = std::pow(10000.0f, -2.0f * j / R);
    const std::vector<int32_t> slot = {6, 1}, pos = {1023, 17};
    std::vector<std::unique_ptr<DeviceBuffer>> keep;

    auto args = [&](float* qv, const float* kvv, const float* w, const float* inv,
                    const int32_t* sl, const int32_t* ps, void* cache, NormRopeCacheArgs* nr,
                    AbsorbQueryArgs* aq, WeightView w_uk, float* out) {
      nr->tokens = T, nr->kv = kvv, nr->ld_kv = kvw, nr->norm_weight = w, nr->eps = 1e-6f;
      nr->q = qv + nope, nr->q_heads = nh, nr->q_token_stride = nh * qk, nr->q_head_stride = qk;
      nr->positions = ps, nr->inv_freq = inv, nr->attention_factor = 1.0f;
      nr->interleaved = true, nr->slots = sl;
      nr->cache.cache = cache, nr->cache.block_size = 4, nr->cache.latent_dim = L;
      nr->cache.rope_dim = R, nr->cache.dtype = WeightDType::kBFloat16;
      aq->heads = nh, aq->nope_dim = nope, aq->latent_dim = L, aq->q_nope = qv;
      aq->q_token_stride = nh * qk, aq->q_head_stride = qk, aq->w_uk = w_uk, aq->q_latent = out;
    };

    // CPU: Backend's default, the two ops.
    std::vector<float> cq = q, cout(T * nh * L);
    std::vector<uint16_t> ccache(slots * kvw, 0);
    NormRopeCacheArgs nr;
    AbsorbQueryArgs aq;
    args(cq.data(), kv.data(), wn.data(), inv_freq.data(), slot.data(), pos.data(), ccache.data(),
         &nr, &aq, CpuBf16(wuk, &keep), cout.data());
    cpu16_.NormRopeCacheAbsorbQuery(nr, aq);

    auto ints = [&](const std::vector<int32_t>& v) {
      keep.push_back(gpu_->Allocate(v.size() * sizeof(int32_t)));
      gpu_->CopyToDevice(v.data(), v.size() * sizeof(int32_t), keep.back()->data());
      return keep.back()->as<int32_t>();
    };
    const WeightView w_gpu = GpuBf16(wuk, &keep);
    auto dkv = Upload(kv), dwn = Upload(wn), dinv = Upload(inv_freq);
    const int32_t* dslot = ints(slot);
    const int32_t* dpos = ints(pos);
    std::vector<float> got[2][3];  // [fused][q, cache bits, q_latent]
    for (int fused = 0; fused < 2; ++fused) {
      SCOPED_TRACE(::testing::Message() << "fused " << fused);
      auto dq = Upload(q), dout = Poisoned(T * nh * L);
      auto dcache = Upload(std::vector<float>(slots * kvw / 2, 0.0f));  // bf16 zeros
      args(dq->as<float>(), dkv->as<float>(), dwn->as<float>(), dinv->as<float>(), dslot, dpos,
           dcache->data(), &nr, &aq, w_gpu, dout->as<float>());
      if (fused == 1) {
        gpu_->NormRopeCacheAbsorbQuery(nr, aq);
      } else {
        gpu_->Backend::NormRopeCacheAbsorbQuery(nr, aq);  // the two ops
      }
      ASSERT_TRUE(gpu_->status().ok()) << gpu_->status();
      got[fused][0] = Download(*dq);
      got[fused][1] = Download(*dcache);
      got[fused][2] = Download(*dout);
      EXPECT_TRUE(AllClose(got[fused][0], cq, 1e-5, 1e-5));
      EXPECT_TRUE(AllClose(got[fused][2], cout, 1e-4, 1e-4));
      std::vector<float> cache_values(slots * kvw), want_values(slots * kvw);
      for (int64_t i = 0; i < slots * kvw; ++i) {
        uint16_t b;
        std::memcpy(&b, reinterpret_cast<const char*>(got[fused][1].data()) + 2 * i, 2);
        cache_values[i] = Bf16BitsToFloat(b);
        want_values[i] = Bf16BitsToFloat(ccache[i]);
      }
      // A 1e-5-close fp32 value can round to the neighbouring bf16 value.
      EXPECT_TRUE(AllClose(cache_values, want_values, 1e-5, 1.0 / 128));
    }
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(std::memcmp(got[0][i].data(), got[1][i].data(), got[0][i].size() * 4), 0)
          << "output " << i << " differs between the fused launch and the two launches";
    }
  }
}

}  // namespace
}  // namespace deepinfer
