// CudaBackend's attention ops: rope, the latent cache writes (with the norm, rope and W_uk
// product in one launch at a decode token), MLA attention (the one-launch decode kernel, the
// key-split decode kernels, the tensor-core prefill) and the non-absorbed MLA prefill. An FP8
// latent cache (fp8_latent_entry.h) is written by its own quantising kernel. One decode token at
// a context the one-launch kernel takes (kernels::MlaDecodeSmall) is read by that kernel straight
// from the FP8 entries; other decode attention over it runs the key-split or 64-head wgmma kernel
// on the FP8 entries wherever the bf16 cache would run that kernel
// (kernels::MlaAttentionReadsFp8Directly); both give the bits of the bf16 kernels over a bf16
// copy of the entries. The other calls (prefill, shapes those kernels do not take) first
// dequantise the entries the call reads into a bf16 copy laid out as a bf16 paged cache
// (kernels::GatherFp8LatentCacheBf16, scratch reused across layers) and run the bf16 cache's
// kernels on the copy; where the copy would exceed kFp8CopyMaxBytes, and in the batch-invariant
// mode, MlaAttentionF32 reads the FP8 entries itself (the key-split or wgmma kernel, or for shapes
// they do not take the CUDA-core kernel).
#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "kernels/attention/mha_prefill.h"
#include "kernels/attention/mla_attention.h"
#include "kernels/attention/mla_decode_small.h"
#include "kernels/attention/mla_fp8_gather.h"
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

// The most bytes a bf16 copy of an FP8 cache's entries (and its block table) may take for one
// attention call; a call that needs more reads the FP8 entries with MlaAttentionF32 (a decode
// call without spans runs its tokens in chunks that fit first).
constexpr size_t kFp8CopyMaxBytes = static_cast<size_t>(kFp8CacheCopyMaxBytes);

size_t Align256(size_t n) { return (n + 255) / 256 * 256; }

// A bf16 copy of FP8 cache entries (kernels/attention/mla_fp8_gather.h) in one scratch buffer:
// `blocks` blocks of entries, a block table of `rows` x `width`, and `tokens` token rows.
struct Fp8CacheCopy {
  std::unique_ptr<DeviceBuffer> buffer;
  PagedLatentCacheView cache;  // the copy's view: bf16, the source's block size and shape
  int64_t blocks = 0;
  int32_t* block_tables = nullptr;
  int32_t width = 0;             // the copy's max_blocks_per_seq
  int32_t* token_seq = nullptr;  // token rows: the tokens' rows of block_tables
};

size_t Fp8CopyBytes(const PagedLatentCacheView& c, int64_t blocks, int64_t rows, int64_t width,
                    int64_t tokens) {
  return Align256(static_cast<size_t>(blocks) * c.block_size * c.entry_dim() * sizeof(uint16_t)) +
         Align256(static_cast<size_t>(rows * width) * sizeof(int32_t)) +
         Align256(static_cast<size_t>(tokens) * sizeof(int32_t));
}

Fp8CacheCopy AllocateFp8Copy(Backend* backend, const PagedLatentCacheView& source, int64_t blocks,
                             int64_t rows, int32_t width, int64_t tokens) {
  Fp8CacheCopy copy;
  const size_t entries =
      Align256(static_cast<size_t>(blocks) * source.block_size * source.entry_dim() * 2);
  const size_t table = Align256(static_cast<size_t>(rows) * width * sizeof(int32_t));
  copy.buffer = backend->AllocateScratch(Fp8CopyBytes(source, blocks, rows, width, tokens));
  char* base = static_cast<char*>(copy.buffer->data());
  copy.cache = source;
  copy.cache.cache = base;
  copy.cache.dtype = WeightDType::kBFloat16;
  copy.blocks = blocks;
  copy.block_tables = reinterpret_cast<int32_t*>(base + entries);
  copy.width = width;
  copy.token_seq = tokens > 0 ? reinterpret_cast<int32_t*>(base + entries + table) : nullptr;
  return copy;
}

kernels::Fp8GatherParams Fp8GatherParamsFor(const PagedLatentCacheView& source,
                                            const int32_t* block_tables, int32_t max_blocks_per_seq,
                                            const Fp8CacheCopy& copy) {
  kernels::Fp8GatherParams g;
  g.src = KernelCache(source);
  g.block_tables = block_tables;
  g.max_blocks_per_seq = max_blocks_per_seq;
  g.dst = static_cast<uint16_t*>(copy.cache.cache);
  g.dst_blocks = copy.blocks;
  g.dst_tables = copy.block_tables;
  g.table_width = copy.width;
  return g;
}

// One row per span (block-table row i, entries 0 .. context_len - 1), packed one after another;
// false when the copy would exceed kFp8CopyMaxBytes.
bool PlanFp8SpanRows(const PagedLatentCacheView& c, const MlaSequenceSpan* spans, int32_t n,
                     std::vector<kernels::Fp8GatherRow>* rows, int64_t* blocks, int32_t* width) {
  int64_t next = 0;
  int64_t w = 1;
  for (int32_t i = 0; i < n; ++i) {
    const int64_t nb =
        (static_cast<int64_t>(spans[i].context_len) + c.block_size - 1) / c.block_size;
    if (next > 0x7fffffff) return false;
    rows->push_back({i, spans[i].context_len, static_cast<int32_t>(next)});
    next += std::max<int64_t>(nb, 1);
    w = std::max(w, nb);
  }
  *blocks = next;
  *width = static_cast<int32_t>(w);
  return next <= 0x7fffffff && Fp8CopyBytes(c, next, n, w, 0) <= kFp8CopyMaxBytes;
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

// The copy of the spans' rows (PlanFp8SpanRows): *copy allocated and the gather launched on
// `stream` when the rows fit (*fits), nothing done otherwise.
cudaError_t CopyFp8Spans(Backend* backend, cudaStream_t stream, const PagedLatentCacheView& cache,
                         const int32_t* block_tables, int32_t max_blocks_per_seq,
                         const MlaSequenceSpan* spans, int32_t n, Fp8CacheCopy* copy, bool* fits) {
  std::vector<kernels::Fp8GatherRow> rows;
  int64_t blocks = 0;
  int32_t width = 0;
  *fits = PlanFp8SpanRows(cache, spans, n, &rows, &blocks, &width);
  if (!*fits) return cudaSuccess;
  *copy = AllocateFp8Copy(backend, cache, blocks, n, width, 0);
  kernels::Fp8GatherParams g = Fp8GatherParamsFor(cache, block_tables, max_blocks_per_seq, *copy);
  g.rows = rows.data();
  g.num_rows = n;
  return kernels::GatherFp8LatentCacheBf16(g, stream);
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
    p.mma_variant = kBatchInvariantMlaVariant;
    Check(kernels::MlaAttentionF32(p, stream_), "kernels::MlaAttentionF32");
    return;
  }
  // Tokens [t0, t0 + n) of params q (their query, context and output rows).
  auto token_rows = [&](const kernels::MlaAttentionParams& q, int64_t t0, int32_t n) {
    kernels::MlaAttentionParams r = q;
    r.num_tokens = n;
    r.q_latent = q.q_latent + t0 * a.num_heads * a.cache.latent_dim;
    r.q_rope = q.q_rope + t0 * a.q_rope_token_stride;
    r.token_seq = q.token_seq + t0;
    r.context_len = q.context_len + t0;
    r.out_latent = q.out_latent + t0 * a.num_heads * a.cache.latent_dim;
    return r;
  };
  // An FP8 cache: `cache` is the view the kernels read (the FP8 entries, or the bf16 copy of the
  // entries the call reads, on which the bf16 cache's kernels below run).
  const bool fp8 = a.cache.dtype == WeightDType::kFp8E4M3;
  Fp8CacheCopy copy;
  PagedLatentCacheView cache = a.cache;
  auto use_copy = [&](kernels::MlaAttentionParams* q) {
    cache = copy.cache;
    q->cache = KernelCache(copy.cache);
    q->block_tables = copy.block_tables;
    q->max_blocks_per_seq = copy.width;
  };
  std::vector<kernels::MlaPrefillSequence> prefill;
  if (a.sequences != nullptr &&
      !SpansTileTheBatch("CudaBackend::MlaAttention", a.sequences, a.num_sequences, a.num_tokens,
                         /*max_context=*/-1)) {
    return;
  }
  // The longest context the call reads: the spans', else the recorded step's bound (0: unknown).
  int32_t max_context = a.max_context_hint;
  if (a.sequences != nullptr) {
    max_context = 0;
    for (int32_t i = 0; i < a.num_sequences; ++i) {
      max_context = std::max(max_context, a.sequences[i].context_len);
    }
  }
  // One decode token at a short context: one launch of the cluster kernel where it takes the
  // shape (a bf16 or FP8 cache of latent 512 + rope 64, sm_90); false (nothing launched) where it
  // does not, or where the device cannot schedule its clusters.
  auto decode_small = [&](const kernels::MlaAttentionParams& q) {
    if (q.num_tokens <= kMlaDecodeSmallMaxTokens && max_context > 0 &&
        max_context <= tuning_.mla_decode_small_max_context &&
        kernels::MlaDecodeSmallSupported(q)) {
      const cudaError_t e = kernels::MlaDecodeSmall(q, kernels::MlaDecodeSmallOptions(), stream_);
      if (e != cudaErrorNotSupported) {
        Check(e, "kernels::MlaDecodeSmall");
        return true;
      }
    }
    return false;
  };
  // Such a token over an FP8 cache: the kernel reads the FP8 entries, no copy (a span of
  // kMlaDecodeSmallMaxTokens tokens is never a tensor-core prefill).
  static_assert(kMlaDecodeSmallMaxTokens < kMlaPrefillMinTokens,
                "a one-launch decode call has no prefill spans");
  if (fp8 && decode_small(p)) return;
  // Other decode calls over an FP8 cache that MlaAttentionF32 runs as it would run a bf16 cache
  // read the FP8 entries directly (fp8_direct); the rest read them as the bf16 copy.
  const bool fp8_direct = fp8 && kernels::MlaAttentionReadsFp8Directly(p);
  if (a.sequences != nullptr) {
    bool any_prefill = false;
    for (int32_t i = 0; i < a.num_sequences; ++i) {
      any_prefill = any_prefill || UsesTensorCoreAttention(a.sequences[i]);
    }
    bool copied = false;
    if (fp8 && (any_prefill || !fp8_direct)) {
      PhaseTimer phase(this, "MlaAttention/fp8-gather", true);
      if (!Check(CopyFp8Spans(this, stream_, a.cache, a.block_tables, a.max_blocks_per_seq,
                              a.sequences, a.num_sequences, &copy, &copied),
                 "kernels::GatherFp8LatentCacheBf16")) {
        return;
      }
      if (copied) use_copy(&p);
    }
    for (int32_t i = 0; i < a.num_sequences; ++i) {
      const MlaSequenceSpan& s = a.sequences[i];
      // The tensor-core prefill reads fp32 and bf16 caches (an FP8 cache through its copy).
      if ((!fp8 || copied) && UsesTensorCoreAttention(s)) {
        prefill.push_back({i, s.first_token, s.num_tokens, s.context_len});
      }
    }
  }
  if (prefill.empty()) {
    auto decode = [&](const kernels::MlaAttentionParams& q) {
      if (!fp8_direct && decode_small(q)) return;
      Check(kernels::MlaAttentionF32(q, stream_), "kernels::MlaAttentionF32");
    };
    if (fp8 && !fp8_direct && a.sequences == nullptr && a.max_blocks_per_seq > 0) {
      // No spans (a recorded decode step): token t's row of the copy holds its own context, up
      // to the block table's width, and the tokens run in as few equal chunks as keep the copy
      // within kFp8CopyMaxBytes (the chunks reuse one copy, in stream order).
      const int32_t width = a.max_blocks_per_seq;
      const size_t per_token = Fp8CopyBytes(a.cache, width, 1, width, 1);
      const int64_t fit = static_cast<int64_t>(kFp8CopyMaxBytes / per_token);
      if (fit >= 1) {
        const int64_t chunks = (a.num_tokens + fit - 1) / fit;
        const int32_t chunk = static_cast<int32_t>((a.num_tokens + chunks - 1) / chunks);
        copy = AllocateFp8Copy(this, a.cache, int64_t{chunk} * width, chunk, width, chunk);
        for (int32_t t0 = 0; t0 < a.num_tokens; t0 += chunk) {
          const int32_t n = std::min(chunk, a.num_tokens - t0);
          kernels::MlaAttentionParams r = token_rows(p, t0, n);
          {
            PhaseTimer phase(this, "MlaAttention/fp8-gather", true);
            kernels::Fp8GatherParams g =
                Fp8GatherParamsFor(a.cache, a.block_tables, a.max_blocks_per_seq, copy);
            g.token_seq = r.token_seq;
            g.context_len = r.context_len;
            g.token_seq_out = copy.token_seq;
            g.num_rows = n;
            if (!Check(kernels::GatherFp8LatentCacheBf16(g, stream_),
                       "kernels::GatherFp8LatentCacheBf16")) {
              return;
            }
          }
          use_copy(&r);
          r.token_seq = copy.token_seq;
          decode(r);
        }
        return;
      }
    }
    decode(p);
    return;
  }
  // The other sequences' tokens go through the fp32 kernel, one launch per run of consecutive
  // tokens between prefill sequences.
  int32_t run_begin = 0;
  auto flush = [&](int32_t run_end) {
    if (run_end > run_begin) {
      Check(kernels::MlaAttentionF32(token_rows(p, run_begin, run_end - run_begin), stream_),
            "kernels::MlaAttentionF32");
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
  f.cache = cache.cache;
  f.cache_dtype = cache.dtype == WeightDType::kBFloat16 ? kernels::MlaCacheDType::kBFloat16
                                                        : kernels::MlaCacheDType::kFloat32;
  f.block_size = cache.block_size;
  f.latent_dim = cache.latent_dim;
  f.rope_dim = cache.rope_dim;
  f.block_tables = p.block_tables;
  f.max_blocks_per_seq = p.max_blocks_per_seq;
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
  // The kernel reads fp32 and bf16 caches, an FP8 cache through its bf16 copy (declined where
  // the copy would exceed kFp8CopyMaxBytes: the absorbed MlaAttention then runs).
  if (tuning_.batch_invariant || a.kv_b.dtype != WeightDType::kBFloat16 || a.sequences == nullptr) {
    return false;
  }
  const bool fp8 = a.cache.dtype == WeightDType::kFp8E4M3;
  if (fp8) {
    std::vector<kernels::Fp8GatherRow> rows;
    int64_t blocks = 0;
    int32_t width = 0;
    if (!PlanFp8SpanRows(a.cache, a.sequences, a.num_sequences, &rows, &blocks, &width)) {
      return false;
    }
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
  p.cache_bf16 = a.cache.dtype != WeightDType::kFloat32;  // FP8: its bf16 copy, below
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
  Fp8CacheCopy copy;
  if (fp8) {
    PhaseTimer phase(this, "MhaPrefillAttention/fp8-gather", true);
    bool copied = false;
    if (!Check(CopyFp8Spans(this, stream_, a.cache, a.block_tables, a.max_blocks_per_seq,
                            a.sequences, a.num_sequences, &copy, &copied),
               "kernels::GatherFp8LatentCacheBf16")) {
      return true;
    }
    p.cache = copy.cache.cache;
    p.block_tables = copy.block_tables;
    p.max_blocks_per_seq = copy.width;
  }
  p.workspace_bytes = kernels::MhaPrefillWorkspaceBytes(p);
  auto workspace = AllocateScratch(std::max<size_t>(p.workspace_bytes, 1));
  p.workspace = workspace->data();
  cublasStatus_t blas = CUBLAS_STATUS_SUCCESS;
  const cudaError_t e = kernels::MhaPrefillBf16(p, cublas_, stream_, &blas);
  CheckKernelOrBlas(e, blas, "kernels::MhaPrefillBf16");
  return true;
}

}  // namespace deepinfer
