// CudaBackend's attention ops: rope, the latent cache writes (with the norm, rope and W_uk
// product in one launch at a decode token), MLA attention (the one-launch decode kernel, the
// key-split decode kernels, the tensor-core prefill) and the non-absorbed MLA prefill. An FP8
// latent cache (fp8_latent_entry.h) is written by its own quantising kernel and read by the
// CUDA-core MLA kernel only (decode and prefill alike).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/attention/mha_prefill.h"
#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mla_decode_small.h"
#include "kernels/attention/mla_prefill.h"
#include "kernels/rope/rope.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/op_timer.h"
#include "worker/backend/fp8_latent_entry.h"

namespace deepinfer {
namespace {

kernels::PagedLatentCache KernelCache(const PagedLatentCacheView& v) {
  kernels::PagedLatentCache c;
  c.cache = v.cache;
  c.block_size = v.block_size;
  c.latent_dim = v.latent_dim;
  c.rope_dim = v.rope_dim;
  switch (v.dtype) {
    case WeightDType::kBFloat16:
      c.type = kernels::LatentCacheType::kBFloat16;
      break;
    case WeightDType::kFp8E4M3: {
      c.type = kernels::LatentCacheType::kFp8E4M3;
      const Fp8LatentEntryLayout layout = Fp8LatentLayout(v.latent_dim, v.rope_dim);
      c.fp8_rope_offset = static_cast<int32_t>(layout.rope_offset);
      c.fp8_scale_offset = static_cast<int32_t>(layout.scale_offset);
      c.fp8_entry_bytes = static_cast<int32_t>(layout.bytes);
      break;
    }
    case WeightDType::kFloat32:
      c.type = kernels::LatentCacheType::kFloat32;
      break;
    case WeightDType::kMxfp4E2M1:
      LOG(FATAL) << "a latent cache is never MXFP4 (KvCacheSpec refuses it)";
  }
  return c;
}

kernels::NormRopeCacheParams NormRopeCacheParamsFor(const NormRopeCacheArgs& a) {
  kernels::NormRopeCacheParams p;
  p.tokens = a.tokens;
  p.kv = a.kv;
  p.ld_kv = a.ld_kv;
  p.norm_weight = a.norm_weight;
  p.eps = a.eps;
  p.latent_dim = a.cache.latent_dim;
  p.rope_dim = a.cache.rope_dim;
  p.q = a.q;
  p.q_heads = a.q_heads;
  p.q_token_stride = a.q_token_stride;
  p.q_head_stride = a.q_head_stride;
  p.positions = a.positions;
  p.inv_freq = a.inv_freq;
  p.attention_factor = a.attention_factor;
  p.interleaved = a.interleaved;
  p.slots = a.slots;
  p.cache = a.cache.cache;
  p.cache_bf16 = a.cache.dtype == WeightDType::kBFloat16;
  return p;
}

}  // namespace

bool CudaBackend::SpansTileTheBatch(const char* op, const MlaSequenceSpan* spans, int32_t num_spans,
                                    int32_t num_tokens, int64_t max_context) {
  int32_t next = 0;
  for (int32_t i = 0; i < num_spans; ++i) {
    const MlaSequenceSpan& s = spans[i];
    if (s.first_token != next || s.num_tokens <= 0 || s.num_tokens > s.context_len ||
        (max_context >= 0 && s.context_len > max_context)) {
      Record(absl::InvalidArgumentError(absl::StrCat(
          op, ": sequence ", i, " has first token ", s.first_token, ", ", s.num_tokens,
          " tokens, context ", s.context_len, " (expected first token ", next,
          ", 1 <= tokens <= context",
          max_context >= 0 ? absl::StrCat(" <= the block table's ", max_context) : "", ")")));
      return false;
    }
    next += s.num_tokens;
  }
  if (next != num_tokens) {
    Record(absl::InvalidArgumentError(
        absl::StrCat(op, ": the sequences cover ", next, " tokens, the batch has ", num_tokens)));
    return false;
  }
  return true;
}

void CudaBackend::ApplyRope(int64_t tokens, int64_t heads, float* x, int64_t token_stride,
                            int64_t head_stride, int64_t rope_dim, const int32_t* positions,
                            const float* inv_freq, float attention_factor, bool interleaved) {
  OpTimer timer(this, "ApplyRope");
  Check(kernels::ApplyRopeF32(tokens, heads, x, token_stride, head_stride, rope_dim, positions,
                              inv_freq, attention_factor, interleaved, stream_),
        "kernels::ApplyRopeF32");
}

void CudaBackend::WriteLatentCache(int64_t tokens, const float* latent, int64_t ld_latent,
                                   const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                   const PagedLatentCacheView& cache) {
  OpTimer timer(this, "WriteLatentCache");
  const kernels::PagedLatentCache c = KernelCache(cache);
  Check(
      kernels::WriteLatentCacheF32(tokens, latent, ld_latent, rope_key, ld_rope, slots, c, stream_),
      "kernels::WriteLatentCacheF32");
}

void CudaBackend::NormRopeWriteLatentCache(const NormRopeCacheArgs& a) {
  if (a.cache.dtype == WeightDType::kFp8E4M3) {
    // The ops it stands for, as the CPU backend runs them: the fused kernel writes fp32 and bf16
    // entries only.
    const int64_t T = a.tokens, L = a.cache.latent_dim, R = a.cache.rope_dim;
    if (T <= 0) return;
    auto latent = AllocateScratch(static_cast<size_t>(T * L) * sizeof(float));
    auto key = AllocateScratch(static_cast<size_t>(T * R) * sizeof(float));
    RmsNorm(T, L, a.kv, a.ld_kv, a.norm_weight, a.eps, latent->as<float>(), L);
    {
      OpTimer timer(this, "NormRopeWriteLatentCache");
      Check(cudaMemcpy2DAsync(key->data(), R * sizeof(float), a.kv + L, a.ld_kv * sizeof(float),
                              R * sizeof(float), T, cudaMemcpyDeviceToDevice, stream_),
            "cudaMemcpy2DAsync (rope keys)");
    }
    ApplyRope(T, 1, key->as<float>(), R, 0, R, a.positions, a.inv_freq, a.attention_factor,
              a.interleaved);
    if (a.q_heads > 0) {
      ApplyRope(T, a.q_heads, a.q, a.q_token_stride, a.q_head_stride, R, a.positions, a.inv_freq,
                a.attention_factor, a.interleaved);
    }
    WriteLatentCache(T, latent->as<float>(), L, key->as<float>(), R, a.slots, a.cache);
    return;
  }
  OpTimer timer(this, "NormRopeWriteLatentCache");
  Check(kernels::NormRopeWriteLatentCacheF32(NormRopeCacheParamsFor(a), stream_),
        "kernels::NormRopeWriteLatentCacheF32");
}

void CudaBackend::NormRopeCacheAbsorbQuery(const NormRopeCacheArgs& nr, const AbsorbQueryArgs& aq) {
  if (!tuning_.batch_invariant && nr.tokens >= 1 && nr.tokens <= kNormRopeCacheAbsorbMaxTokens &&
      aq.w_uk.dtype == WeightDType::kBFloat16 && nr.cache.dtype != WeightDType::kFp8E4M3) {
    const kernels::NormRopeCacheParams p = NormRopeCacheParamsFor(nr);
    kernels::AbsorbQueryParams a;
    a.heads = aq.heads;
    a.nope_dim = aq.nope_dim;
    a.latent_dim = aq.latent_dim;
    a.q_nope = aq.q_nope;
    a.q_token_stride = aq.q_token_stride;
    a.q_head_stride = aq.q_head_stride;
    a.w = static_cast<const uint16_t*>(aq.w_uk.data);
    a.out = aq.q_latent;
    if (kernels::NormRopeCacheAbsorbQuerySupported(p, a)) {
      OpTimer timer(this, "NormRopeCacheAbsorbQuery");
      Check(kernels::NormRopeCacheAbsorbQueryF32(p, a, stream_),
            "kernels::NormRopeCacheAbsorbQueryF32");
      return;
    }
  }
  Backend::NormRopeCacheAbsorbQuery(nr, aq);
}

bool CudaBackend::UsesTensorCoreAttention(const MlaSequenceSpan& s) const {
  return !tuning_.batch_invariant && weight_dtype_ == WeightDType::kBFloat16 &&
         s.num_tokens >= kMlaPrefillMinTokens &&
         static_cast<int64_t>(s.num_tokens) * s.context_len >= kMlaPrefillMinWork;
}

int32_t CudaBackend::MlaDecodeContextBreak(int32_t num_tokens) const {
  return !tuning_.batch_invariant && num_tokens >= 1 && num_tokens <= kMlaDecodeSmallMaxTokens
             ? tuning_.mla_decode_small_max_context
             : 0;
}

void CudaBackend::MlaAttention(const MlaAttentionArgs& a) {
  OpTimer timer(this, "MlaAttention");
  kernels::MlaAttentionParams p;
  p.num_tokens = a.num_tokens;
  p.num_heads = a.num_heads;
  p.q_latent = a.q_latent;
  p.q_rope = a.q_rope;
  p.q_rope_token_stride = a.q_rope_token_stride;
  p.q_rope_head_stride = a.q_rope_head_stride;
  p.cache = KernelCache(a.cache);
  p.block_tables = a.block_tables;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.token_seq = a.token_seq;
  p.context_len = a.context_len;
  p.softmax_scale = a.softmax_scale;
  p.out_latent = a.out_latent;
  // Batch-invariant: every token on the fp32 kernel with a fixed split count (its default picks
  // the splits from the token count), each token's context cut by its own length only.
  if (tuning_.batch_invariant) {
    if (a.sequences != nullptr &&
        !SpansTileTheBatch("CudaBackend::MlaAttention", a.sequences, a.num_sequences, a.num_tokens,
                           /*max_context=*/-1)) {
      return;
    }
    p.num_splits = kBatchInvariantMlaSplits;
    Check(kernels::MlaAttentionF32(p, stream_), "kernels::MlaAttentionF32");
    return;
  }
  std::vector<kernels::MlaPrefillSequence> prefill;
  if (a.sequences != nullptr) {
    if (!SpansTileTheBatch("CudaBackend::MlaAttention", a.sequences, a.num_sequences, a.num_tokens,
                           /*max_context=*/-1)) {
      return;
    }
    for (int32_t i = 0; i < a.num_sequences; ++i) {
      const MlaSequenceSpan& s = a.sequences[i];
      // The tensor-core prefill reads fp32 and bf16 caches; FP8 entries go through the
      // CUDA-core kernel, which dequantises them.
      if (a.cache.dtype != WeightDType::kFp8E4M3 && UsesTensorCoreAttention(s)) {
        prefill.push_back({i, s.first_token, s.num_tokens, s.context_len});
      }
    }
  }
  if (prefill.empty()) {
    // One decode token at a short context: one launch of the cluster kernel where it takes the
    // shape (bf16 cache, latent 512 + rope 64, sm_90); a device that cannot schedule its
    // clusters falls back.
    int32_t max_context = a.max_context_hint;
    if (a.sequences != nullptr) {
      max_context = 0;
      for (int32_t i = 0; i < a.num_sequences; ++i) {
        max_context = std::max(max_context, a.sequences[i].context_len);
      }
    }
    if (a.num_tokens <= kMlaDecodeSmallMaxTokens && max_context > 0 &&
        max_context <= tuning_.mla_decode_small_max_context &&
        kernels::MlaDecodeSmallSupported(p)) {
      const cudaError_t e = kernels::MlaDecodeSmall(p, kernels::MlaDecodeSmallOptions(), stream_);
      if (e != cudaErrorNotSupported) {
        Check(e, "kernels::MlaDecodeSmall");
        return;
      }
    }
    Check(kernels::MlaAttentionF32(p, stream_), "kernels::MlaAttentionF32");
    return;
  }
  // The other sequences' tokens go through the fp32 kernel, one launch per run of consecutive
  // tokens between prefill sequences.
  int32_t run_begin = 0;
  auto flush = [&](int32_t run_end) {
    if (run_end > run_begin) {
      kernels::MlaAttentionParams r = p;
      const int64_t t0 = run_begin;
      r.num_tokens = run_end - run_begin;
      r.q_latent = p.q_latent + t0 * a.num_heads * a.cache.latent_dim;
      r.q_rope = p.q_rope + t0 * a.q_rope_token_stride;
      r.token_seq = p.token_seq + t0;
      r.context_len = p.context_len + t0;
      r.out_latent = p.out_latent + t0 * a.num_heads * a.cache.latent_dim;
      Check(kernels::MlaAttentionF32(r, stream_), "kernels::MlaAttentionF32");
    }
  };
  for (const kernels::MlaPrefillSequence& s : prefill) {
    flush(s.first_token);
    run_begin = s.first_token + s.num_tokens;
  }
  flush(a.num_tokens);

  kernels::MlaPrefillParams f;
  f.num_heads = a.num_heads;
  f.q_latent = a.q_latent;
  f.q_rope = a.q_rope;
  f.q_rope_token_stride = a.q_rope_token_stride;
  f.q_rope_head_stride = a.q_rope_head_stride;
  f.cache = a.cache.cache;
  f.cache_dtype = a.cache.dtype == WeightDType::kBFloat16 ? kernels::MlaCacheDType::kBFloat16
                                                          : kernels::MlaCacheDType::kFloat32;
  f.block_size = a.cache.block_size;
  f.latent_dim = a.cache.latent_dim;
  f.rope_dim = a.cache.rope_dim;
  f.block_tables = a.block_tables;
  f.max_blocks_per_seq = a.max_blocks_per_seq;
  f.sequences = prefill.data();
  f.num_sequences = static_cast<int32_t>(prefill.size());
  f.softmax_scale = a.softmax_scale;
  f.out_latent = a.out_latent;
  f.workspace_bytes = kernels::MlaPrefillWorkspaceBytes(f);
  auto workspace = AllocateScratch(std::max<size_t>(f.workspace_bytes, 1));
  f.workspace = workspace->data();
  cublasStatus_t blas = CUBLAS_STATUS_SUCCESS;
  const cudaError_t e = kernels::MlaPrefillBf16(f, cublas_, stream_, &blas);
  CheckKernelOrBlas(e, blas, "kernels::MlaPrefillBf16");
}

bool CudaBackend::MhaPrefillAttention(const MhaPrefillArgs& a) {
  // The kernel reads fp32 and bf16 caches; an FP8 cache's prefill runs the absorbed MlaAttention.
  if (tuning_.batch_invariant || a.kv_b.dtype != WeightDType::kBFloat16 ||
      a.sequences == nullptr || a.cache.dtype == WeightDType::kFp8E4M3) {
    return false;
  }
  if (!SpansTileTheBatch("CudaBackend::MhaPrefillAttention", a.sequences, a.num_sequences,
                         a.num_tokens,
                         static_cast<int64_t>(a.max_blocks_per_seq) * a.cache.block_size)) {
    return true;
  }
  std::vector<kernels::MhaPrefillSequence> seqs;
  for (int32_t i = 0; i < a.num_sequences; ++i) {
    const MlaSequenceSpan& s = a.sequences[i];
    seqs.push_back({i, s.first_token, s.num_tokens, s.context_len});
  }
  kernels::MhaPrefillParams p;
  p.num_heads = a.num_heads;
  p.nope_dim = a.nope_dim;
  p.v_dim = a.v_dim;
  p.q = a.q;
  p.q_token_stride = a.q_token_stride;
  p.q_head_stride = a.q_head_stride;
  p.cache = a.cache.cache;
  p.cache_bf16 = a.cache.dtype == WeightDType::kBFloat16;
  p.block_size = a.cache.block_size;
  p.latent_dim = a.cache.latent_dim;
  p.rope_dim = a.cache.rope_dim;
  p.block_tables = a.block_tables;
  p.max_blocks_per_seq = a.max_blocks_per_seq;
  p.kv_b = static_cast<const uint16_t*>(a.kv_b.data);
  p.sequences = seqs.data();
  p.num_sequences = static_cast<int32_t>(seqs.size());
  p.softmax_scale = a.softmax_scale;
  p.out = a.out;
  p.out_bf16 = a.out_bf16;
  p.out_token_stride = static_cast<int64_t>(a.num_heads) * a.v_dim;
  p.expand_gemm = [this](const kernels::MhaExpandGemm& g, cudaStream_t) {
    const bool ran =
        GemmOnCublasLt(g.keys, g.kv_width, g.latent_dim, g.entries, g.entries_stride,
                       WeightView(g.kv_b, WeightDType::kBFloat16), g.latent_dim, g.kv, g.kv_width,
                       /*c_bf16=*/true, /*accumulate=*/false);
    if (!status().ok()) return cudaErrorUnknown;  // recorded by GemmOnCublasLt
    return ran ? cudaSuccess : cudaErrorNotSupported;
  };
  if (!kernels::MhaPrefillSupported(p)) return false;
  OpTimer timer(this, "MhaPrefillAttention");
  p.workspace_bytes = kernels::MhaPrefillWorkspaceBytes(p);
  auto workspace = AllocateScratch(std::max<size_t>(p.workspace_bytes, 1));
  p.workspace = workspace->data();
  cublasStatus_t blas = CUBLAS_STATUS_SUCCESS;
  const cudaError_t e = kernels::MhaPrefillBf16(p, cublas_, stream_, &blas);
  CheckKernelOrBlas(e, blas, "kernels::MhaPrefillBf16");
  return true;
}

}  // namespace deepinfer
