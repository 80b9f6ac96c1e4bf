// CpuBackend: fp32 reference ops. Loops are split over independent output rows (or heads), so
// results do not depend on the number of threads.
#include "worker/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "worker/backend/bf16.h"
#include "worker/backend/fp8_latent_entry.h"
#include "worker/sampling/sampler.h"

namespace deepinfer {
namespace {

class HostBuffer : public DeviceBuffer {
 public:
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    // 64-byte alignment for vector loads; at least one byte so data() is never null.
    size_t rounded = ((std::max<size_t>(bytes, 1) + 63) / 64) * 64;
    data_ = static_cast<char*>(std::aligned_alloc(64, rounded));
    CHECK(data_ != nullptr) << "out of host memory allocating " << bytes << " bytes";
    std::memset(data_, 0, rounded);
  }
  ~HostBuffer() override { std::free(data_); }
  void* data() override { return data_; }
  const void* data() const override { return data_; }
  size_t size_bytes() const override { return bytes_; }

 private:
  char* data_;
  size_t bytes_;
};

// Dot product with 8 independent partial sums: deterministic order, vectorisable, and closer to
// the pairwise sums BLAS uses than one long serial chain.
inline float Dot(const float* a, const float* b, int64_t k) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    for (int u = 0; u < 8; ++u) acc[u] += a[p + u] * b[p + u];
  }
  for (; p < k; ++p) acc[p & 7] += a[p] * b[p];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// Four rows of a against one row of w: each result uses exactly Dot's summation order (so values
// are bit-identical to Dot), but w is streamed once per four rows.
inline void Dot4(const float* a, int64_t lda, const float* b, int64_t k, float out[4]) {
  float acc[4][8] = {};
  int64_t p = 0;
  for (; p + 8 <= k; p += 8) {
    for (int r = 0; r < 4; ++r) {
      for (int u = 0; u < 8; ++u) acc[r][u] += a[r * lda + p + u] * b[p + u];
    }
  }
  for (; p < k; ++p) {
    for (int r = 0; r < 4; ++r) acc[r][p & 7] += a[r * lda + p] * b[p];
  }
  for (int r = 0; r < 4; ++r) {
    const float* x = acc[r];
    out[r] = ((x[0] + x[1]) + (x[2] + x[3])) + ((x[4] + x[5]) + (x[6] + x[7]));
  }
}

}  // namespace

CpuBackend::CpuBackend(int num_threads, WeightDType weight_dtype)
    : pool_(num_threads), weight_dtype_(weight_dtype) {}

std::unique_ptr<DeviceBuffer> CpuBackend::Allocate(size_t bytes) {
  return std::make_unique<HostBuffer>(bytes);
}

void CpuBackend::CopyToDevice(const void* host, size_t bytes, void* device) {
  if (bytes > 0) std::memcpy(device, host, bytes);
}

void CpuBackend::CopyToHost(const void* device, size_t bytes, void* host) {
  if (bytes > 0) std::memcpy(host, device, bytes);
}

void CpuBackend::CopyDeviceToDevice(const void* src, size_t bytes, void* dst) {
  if (bytes > 0) std::memmove(dst, src, bytes);
}

void CpuBackend::Gemm(int64_t m, int64_t n, int64_t k, ActivationView av, int64_t lda,
                      WeightView wv, int64_t ldw, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  std::vector<float> widened;  // a bf16 a as fp32 (exact; rounding it again changes nothing)
  const float* a = static_cast<const float*>(av.data);
  if (av.dtype == WeightDType::kBFloat16) {
    const uint16_t* a16 = static_cast<const uint16_t*>(av.data);
    widened.resize(m * k);
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t p = 0; p < k; ++p) widened[i * k + p] = Bf16BitsToFloat(a16[i * lda + p]);
    }
    a = widened.data();
    lda = k;
  }
  // fp32 kernel on rows [i0, i1) x columns [j0, j1); w row j is at w + (j - j0) * ldw.
  auto f32 = [&](const float* a_rows, int64_t a_ld, int64_t i0, int64_t i1, const float* w,
                 int64_t w_ld, int64_t j0, int64_t j1) {
    int64_t i = i0;
    for (; i + 4 <= i1; i += 4) {
      const float* ar = a_rows + (i - i0) * a_ld;
      for (int64_t j = j0; j < j1; ++j) {
        float v[4];
        Dot4(ar, a_ld, w + (j - j0) * w_ld, k, v);
        for (int r = 0; r < 4; ++r) {
          float* cr = c + (i + r) * ldc + j;
          *cr = accumulate ? *cr + v[r] : v[r];
        }
      }
    }
    for (; i < i1; ++i) {
      const float* ar = a_rows + (i - i0) * a_ld;
      float* cr = c + i * ldc;
      for (int64_t j = j0; j < j1; ++j) {
        float v = Dot(ar, w + (j - j0) * w_ld, k);
        cr[j] = accumulate ? cr[j] + v : v;
      }
    }
  };
  auto body = [&](int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    if (wv.dtype == WeightDType::kFloat32) {
      const float* w = static_cast<const float*>(wv.data);
      f32(a + i0 * lda, lda, i0, i1, w + j0 * ldw, ldw, j0, j1);
      return;
    }
    // bf16: widen tiles of ~64 KiB (bf16-rounded a rows, weight rows) and run the fp32 kernel,
    // so the result equals the fp32 GEMM of the rounded operands bit for bit.
    const uint16_t* w = static_cast<const uint16_t*>(wv.data);
    const int64_t tile = std::max<int64_t>(4, 16384 / std::max<int64_t>(1, k));
    std::vector<float> at(tile * k), wt(tile * k);
    for (int64_t it = i0; it < i1; it += tile) {
      const int64_t ie = std::min(i1, it + tile);
      for (int64_t i = it; i < ie; ++i) {
        for (int64_t p = 0; p < k; ++p) at[(i - it) * k + p] = RoundToBf16(a[i * lda + p]);
      }
      for (int64_t jt = j0; jt < j1; jt += tile) {
        const int64_t je = std::min(j1, jt + tile);
        for (int64_t j = jt; j < je; ++j) {
          for (int64_t p = 0; p < k; ++p) wt[(j - jt) * k + p] = Bf16BitsToFloat(w[j * ldw + p]);
        }
        f32(at.data(), k, it, ie, wt.data(), k, jt, je);
      }
    }
  };
  // Split the larger dimension; each output element is computed by exactly one thread.
  int64_t min_chunk = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, k));
  if (m >= 4 * pool_.num_threads()) {
    pool_.ParallelFor(m, std::max<int64_t>(1, min_chunk / std::max<int64_t>(1, n)),
                      [&](int64_t b, int64_t e) { body(b, e, 0, n); });
  } else {
    pool_.ParallelFor(n, min_chunk, [&](int64_t b, int64_t e) { body(0, m, b, e); });
  }
}

void CpuBackend::BatchedGemm(int64_t batch, int64_t m, int64_t n, int64_t k, ActivationView a,
                             int64_t lda, int64_t stride_a, WeightView w, int64_t ldw,
                             int64_t stride_w, float* c, int64_t ldc, int64_t stride_c) {
  for (int64_t b = 0; b < batch; ++b) {
    const ActivationView ab =
        a.dtype == WeightDType::kBFloat16
            ? ActivationView::Bf16(static_cast<const uint16_t*>(a.data) + b * stride_a)
            : ActivationView(static_cast<const float*>(a.data) + b * stride_a);
    Gemm(m, n, k, ab, lda, w.Offset(b * stride_w), ldw, c + b * stride_c, ldc, false);
  }
}

void CpuBackend::GroupedGemm(const std::vector<int64_t>& offsets,
                             const std::vector<WeightView>& weights, int64_t n, int64_t k,
                             const float* a, float* c) {
  CHECK_EQ(offsets.size(), weights.size() + 1);
  for (size_t g = 0; g < weights.size(); ++g) {
    int64_t rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    Gemm(rows, n, k, a + offsets[g] * k, k, weights[g], k, c + offsets[g] * n, n, false);
  }
}

void CpuBackend::RmsNorm(int64_t rows, int64_t dim, const float* x, int64_t ldx,
                         const float* weight, float eps, float* out, int64_t ldout) {
  pool_.ParallelFor(rows, 16, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* xr = x + r * ldx;
      float* orow = out + r * ldout;
      float ss = Dot(xr, xr, dim);
      float inv = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
      for (int64_t i = 0; i < dim; ++i) orow[i] = weight[i] * (xr[i] * inv);
    }
  });
}

void CpuBackend::AddRmsNorm(int64_t rows, int64_t dim, float* x, const float* y,
                            const float* weight, float eps, float* out, uint16_t* out_bf16) {
  // Exactly Add, then RmsNorm, then the rounding of a bf16 Gemm operand.
  if (y != nullptr) Add(rows * dim, x, y, x);
  std::vector<float> scratch(out == nullptr ? rows * dim : 0);
  float* normed = out != nullptr ? out : scratch.data();
  RmsNorm(rows, dim, x, dim, weight, eps, normed, dim);
  if (out_bf16 != nullptr) {
    for (int64_t i = 0; i < rows * dim; ++i) out_bf16[i] = FloatToBf16Bits(normed[i]);
  }
}

void CpuBackend::RmsNormBf16(int64_t rows, int64_t dim, const float* x, int64_t ldx,
                             const float* weight, float eps, uint16_t* out_bf16) {
  // AddRmsNorm's steps without the add: RmsNorm, then the rounding of a bf16 Gemm operand.
  std::vector<float> normed(rows * dim);
  RmsNorm(rows, dim, x, ldx, weight, eps, normed.data(), dim);
  for (int64_t i = 0; i < rows * dim; ++i) out_bf16[i] = FloatToBf16Bits(normed[i]);
}

void CpuBackend::Add(int64_t n, const float* a, const float* b, float* out) {
  pool_.ParallelFor(n, 1 << 14, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) out[i] = a[i] + b[i];
  });
}

void CpuBackend::SiluMul(int64_t rows, int64_t inter, const float* x, float* out) {
  pool_.ParallelFor(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, inter)),
                    [&](int64_t b, int64_t e) {
                      for (int64_t r = b; r < e; ++r) {
                        const float* g = x + r * 2 * inter;
                        const float* u = g + inter;
                        float* o = out + r * inter;
                        for (int64_t i = 0; i < inter; ++i) {
                          o[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
                        }
                      }
                    });
}

void CpuBackend::NormRopeWriteLatentCache(const NormRopeCacheArgs& a) {
  // The four ops it stands for, in order (the reference for the fused GPU kernel).
  const int64_t T = a.tokens, L = a.cache.latent_dim, R = a.cache.rope_dim;
  if (T <= 0) return;
  std::vector<float> latent(T * L), key(T * R);
  RmsNorm(T, L, a.kv, a.ld_kv, a.norm_weight, a.eps, latent.data(), L);
  for (int64_t t = 0; t < T; ++t) {
    std::memcpy(key.data() + t * R, a.kv + t * a.ld_kv + L, R * sizeof(float));
  }
  ApplyRope(T, 1, key.data(), R, 0, R, a.positions, a.inv_freq, a.attention_factor, a.interleaved);
  if (a.q_heads > 0) {
    ApplyRope(T, a.q_heads, a.q, a.q_token_stride, a.q_head_stride, R, a.positions, a.inv_freq,
              a.attention_factor, a.interleaved);
  }
  WriteLatentCache(T, latent.data(), L, key.data(), R, a.slots, a.cache);
}

void CpuBackend::FillDummy(const DummyFill& fill, int64_t n, WeightDType dtype, void* out) {
  const bool bf16 = dtype == WeightDType::kBFloat16;
  pool_.ParallelFor(n, int64_t{1} << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float v = DummyFillValue(fill, i);
      if (bf16) {
        static_cast<uint16_t*>(out)[i] = FloatToBf16Bits(v);
      } else {
        static_cast<float*>(out)[i] = v;
      }
    }
  });
}

void CpuBackend::SiluMulBf16(int64_t rows, int64_t inter, const float* x, uint16_t* out) {
  std::vector<float> act(rows * inter);
  SiluMul(rows, inter, x, act.data());
  for (int64_t i = 0; i < rows * inter; ++i) out[i] = FloatToBf16Bits(act[i]);
}

void CpuBackend::GatherRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                            float* dst) {
  pool_.ParallelFor(rows, 8, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      std::memcpy(dst + r * dim, src + static_cast<int64_t>(idx[r]) * dim, dim * sizeof(float));
    }
  });
}

void CpuBackend::ScatterAddRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                                const float* weight, float* dst) {
  // Several rows may hit one destination, so split columns, not rows: each destination element
  // still receives its contributions in row order.
  pool_.ParallelFor(dim, 256, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < rows; ++r) {
      float* d = dst + static_cast<int64_t>(idx[r]) * dim;
      const float* s = src + r * dim;
      float w = weight == nullptr ? 1.0f : weight[r];
      for (int64_t c = c0; c < c1; ++c) d[c] += w * s[c];
    }
  });
}

void CpuBackend::ApplyRope(int64_t tokens, int64_t heads, float* x, int64_t token_stride,
                           int64_t head_stride, int64_t rope_dim, const int32_t* positions,
                           const float* inv_freq, float attention_factor, bool interleaved) {
  const int64_t half = rope_dim / 2;
  pool_.ParallelFor(tokens, 4, [&](int64_t b, int64_t e) {
    std::vector<float> cs(half), sn(half);
    for (int64_t t = b; t < e; ++t) {
      for (int64_t j = 0; j < half; ++j) {
        // The angle is formed in fp32 as in HF (position * inv_freq), cos/sin evaluated exactly.
        float angle = static_cast<float>(positions[t]) * inv_freq[j];
        cs[j] = static_cast<float>(std::cos(static_cast<double>(angle))) * attention_factor;
        sn[j] = static_cast<float>(std::sin(static_cast<double>(angle))) * attention_factor;
      }
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x + t * token_stride + h * head_stride;
        for (int64_t j = 0; j < half; ++j) {
          int64_t i0 = interleaved ? 2 * j : j;
          int64_t i1 = interleaved ? 2 * j + 1 : j + half;
          float x0 = v[i0], x1 = v[i1];
          v[i0] = x0 * cs[j] - x1 * sn[j];
          v[i1] = x1 * cs[j] + x0 * sn[j];
        }
      }
    }
  });
}

void CpuBackend::WriteLatentCache(int64_t tokens, const float* latent, int64_t ld_latent,
                                  const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                  const PagedLatentCacheView& cache) {
  const int64_t entry = cache.entry_dim();
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t at = static_cast<int64_t>(slots[t]) * entry;
    const float* l = latent + t * ld_latent;
    const float* r = rope_key + t * ld_rope;
    if (cache.dtype == WeightDType::kFp8E4M3) {
      QuantizeFp8LatentEntry(l, cache.latent_dim, r, cache.rope_dim,
                             static_cast<uint8_t*>(cache.cache) +
                                 static_cast<int64_t>(slots[t]) * cache.entry_bytes());
    } else if (cache.dtype == WeightDType::kBFloat16) {
      uint16_t* dst = static_cast<uint16_t*>(cache.cache) + at;
      for (int64_t i = 0; i < cache.latent_dim; ++i) dst[i] = FloatToBf16Bits(l[i]);
      for (int64_t i = 0; i < cache.rope_dim; ++i)
        dst[cache.latent_dim + i] = FloatToBf16Bits(r[i]);
    } else {
      float* dst = static_cast<float*>(cache.cache) + at;
      std::memcpy(dst, l, cache.latent_dim * sizeof(float));
      std::memcpy(dst + cache.latent_dim, r, cache.rope_dim * sizeof(float));
    }
  }
}

void CpuBackend::MlaAttention(const MlaAttentionArgs& args) {
  const int64_t latent = args.cache.latent_dim;
  const int64_t rope = args.cache.rope_dim;
  const int64_t entry = args.cache.entry_dim();
  const int64_t bs = args.cache.block_size;
  const bool bf16 = args.cache.dtype == WeightDType::kBFloat16;
  const bool fp8 = args.cache.dtype == WeightDType::kFp8E4M3;
  const int64_t work = static_cast<int64_t>(args.num_tokens) * args.num_heads;
  pool_.ParallelFor(work, 1, [&](int64_t b, int64_t e) {
    std::vector<float> scores, widened(bf16 || fp8 ? entry : 0);
    std::vector<double> acc(latent);
    // Cache entry j of the token's sequence as fp32 (bf16 entries widened exactly, FP8 entries
    // dequantised).
    auto key = [&](const int32_t* table, int64_t j) -> const float* {
      const int64_t slot = static_cast<int64_t>(table[j / bs]) * bs + j % bs;
      if (fp8) {
        DequantizeFp8LatentEntry(
            static_cast<const uint8_t*>(args.cache.cache) + slot * args.cache.entry_bytes(), latent,
            rope, widened.data());
        return widened.data();
      }
      const int64_t at = slot * entry;
      if (!bf16) return static_cast<const float*>(args.cache.cache) + at;
      const uint16_t* src = static_cast<const uint16_t*>(args.cache.cache) + at;
      for (int64_t i = 0; i < entry; ++i) widened[i] = Bf16BitsToFloat(src[i]);
      return widened.data();
    };
    for (int64_t w = b; w < e; ++w) {
      const int64_t t = w / args.num_heads;
      const int64_t h = w % args.num_heads;
      const float* ql = args.q_latent + (t * args.num_heads + h) * latent;
      const float* qr = args.q_rope + t * args.q_rope_token_stride + h * args.q_rope_head_stride;
      const int32_t* table =
          args.block_tables + static_cast<int64_t>(args.token_seq[t]) * args.max_blocks_per_seq;
      const int64_t len = args.context_len[t];
      scores.resize(len);
      float mx = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < len; ++j) {
        const float* kv = key(table, j);
        float s = (Dot(ql, kv, latent) + Dot(qr, kv + latent, rope)) * args.softmax_scale;
        scores[j] = s;
        mx = std::max(mx, s);
      }
      double denom = 0;
      for (int64_t j = 0; j < len; ++j) {
        scores[j] = std::exp(scores[j] - mx);
        denom += scores[j];
      }
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < len; ++j) {
        const float* kv = key(table, j);
        const double p = scores[j];
        for (int64_t c = 0; c < latent; ++c) acc[c] += p * kv[c];
      }
      float* out = args.out_latent + (t * args.num_heads + h) * latent;
      for (int64_t c = 0; c < latent; ++c) out[c] = static_cast<float>(acc[c] / denom);
    }
  });
}

bool CpuBackend::MhaPrefillAttention(const MhaPrefillArgs& a) {
  const int64_t latent = a.cache.latent_dim, rope = a.cache.rope_dim;
  const int64_t entry = a.cache.entry_dim(), bs = a.cache.block_size;
  const int64_t nh = a.num_heads, nope = a.nope_dim, vd = a.v_dim, head_w = nope + vd;
  const int64_t kv_w = nh * head_w;
  const bool bf16 = a.cache.dtype == WeightDType::kBFloat16;
  const bool fp8 = a.cache.dtype == WeightDType::kFp8E4M3;
  if ((a.out == nullptr) == (a.out_bf16 == nullptr) || a.sequences == nullptr) {
    Record(absl::InvalidArgumentError(
        "CpuBackend::MhaPrefillAttention: needs the host spans and exactly one of out, out_bf16"));
    return true;
  }
  int32_t next = 0;
  for (int32_t i = 0; i < a.num_sequences; ++i) {
    const MlaSequenceSpan& s = a.sequences[i];
    if (s.first_token != next || s.num_tokens <= 0 || s.num_tokens > s.context_len ||
        s.context_len > static_cast<int64_t>(a.max_blocks_per_seq) * bs) {
      Record(absl::InvalidArgumentError(absl::StrCat(
          "CpuBackend::MhaPrefillAttention: sequence ", i, " has first token ", s.first_token, ", ",
          s.num_tokens, " tokens, context ", s.context_len, " (expected first token ", next,
          ", 1 <= tokens <= context <= the block table's ", a.max_blocks_per_seq * bs, ")")));
      return true;
    }
    next += s.num_tokens;
  }
  if (next != a.num_tokens) {
    Record(absl::InvalidArgumentError(absl::StrCat("CpuBackend::MhaPrefillAttention: the spans ",
                                                   "cover ", next, " tokens, the batch has ",
                                                   a.num_tokens)));
    return true;
  }
  for (int32_t i = 0; i < a.num_sequences; ++i) {
    const MlaSequenceSpan& s = a.sequences[i];
    const int64_t len = s.context_len, past = len - s.num_tokens;
    const int32_t* table = a.block_tables + static_cast<int64_t>(i) * a.max_blocks_per_seq;
    // The sequence's cached latents and rope keys as fp32 (bf16 widened exactly).
    std::vector<float> lat(len * latent), k_rope(len * rope), dequantized(fp8 ? entry : 0);
    for (int64_t j = 0; j < len; ++j) {
      const int64_t slot = static_cast<int64_t>(table[j / bs]) * bs + j % bs;
      const int64_t at = slot * entry;
      if (fp8) {
        DequantizeFp8LatentEntry(
            static_cast<const uint8_t*>(a.cache.cache) + slot * a.cache.entry_bytes(), latent, rope,
            dequantized.data());
      }
      for (int64_t c = 0; c < entry; ++c) {
        const float v = fp8 ? dequantized[c]
                        : bf16
                            ? Bf16BitsToFloat(static_cast<const uint16_t*>(a.cache.cache)[at + c])
                            : static_cast<const float*>(a.cache.cache)[at + c];
        if (c < latent) {
          lat[j * latent + c] = v;
        } else {
          k_rope[j * rope + c - latent] = v;
        }
      }
    }
    std::vector<float> kv(len * kv_w);  // [keys, heads, K_nope | V]
    Gemm(len, kv_w, latent, lat.data(), latent, a.kv_b, latent, kv.data(), kv_w, false);
    pool_.ParallelFor(s.num_tokens * nh, 1, [&](int64_t b, int64_t e) {
      std::vector<float> scores;
      std::vector<double> acc(vd);
      for (int64_t w = b; w < e; ++w) {
        const int64_t t = s.first_token + w / nh, h = w % nh, visible = past + w / nh + 1;
        const float* q = a.q + t * a.q_token_stride + h * a.q_head_stride;
        scores.resize(visible);
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < visible; ++j) {
          const float sc = (Dot(q, kv.data() + j * kv_w + h * head_w, nope) +
                            Dot(q + nope, k_rope.data() + j * rope, rope)) *
                           a.softmax_scale;
          scores[j] = sc;
          mx = std::max(mx, sc);
        }
        double denom = 0;
        for (int64_t j = 0; j < visible; ++j) {
          scores[j] = std::exp(scores[j] - mx);
          denom += scores[j];
        }
        std::fill(acc.begin(), acc.end(), 0.0);
        for (int64_t j = 0; j < visible; ++j) {
          const float* v = kv.data() + j * kv_w + h * head_w + nope;
          const double p = scores[j];
          for (int64_t c = 0; c < vd; ++c) acc[c] += p * v[c];
        }
        const int64_t at = (t * nh + h) * vd;
        for (int64_t c = 0; c < vd; ++c) {
          const float o = static_cast<float>(acc[c] / denom);
          if (a.out != nullptr) {
            a.out[at + c] = o;
          } else {
            a.out_bf16[at + c] = FloatToBf16Bits(o);
          }
        }
      }
    });
  }
  return true;
}

void CpuBackend::AccumulateExpertCounts(int64_t n, const int32_t* ids, int64_t num_experts,
                                        const int32_t* count_limit, int64_t* counts) {
  if (count_limit != nullptr) n = std::min<int64_t>(n, std::max<int32_t>(0, *count_limit));
  // Sequential: n is tokens x top_k of one step, far cheaper than the router GEMM before it.
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] >= 0 && ids[i] < num_experts) ++counts[ids[i]];
  }
}

void CpuBackend::NoauxTcRoute(const NoauxTcRouteArgs& a) {
  const int64_t per_group = a.num_experts / a.num_groups;
  pool_.ParallelFor(a.num_tokens, 16, [&](int64_t b, int64_t e) {
    std::vector<float> score(a.num_experts), choice(a.num_experts), group_score(a.num_groups);
    std::vector<int32_t> order(std::max<int64_t>(a.num_experts, a.num_groups));
    for (int64_t t = b; t < e; ++t) {
      const float* lg = a.router_logits + t * a.num_experts;
      for (int64_t x = 0; x < a.num_experts; ++x) {
        score[x] = 1.0f / (1.0f + std::exp(-lg[x]));
        choice[x] = score[x] + (a.correction_bias ? a.correction_bias[x] : 0.0f);
      }
      // A group's strength is the sum of its two best biased scores (one if the group has one).
      for (int64_t g = 0; g < a.num_groups; ++g) {
        const float* s = choice.data() + g * per_group;
        float best = -std::numeric_limits<float>::infinity(), second = best;
        for (int64_t i = 0; i < per_group; ++i) {
          if (s[i] > best) {
            second = best;
            best = s[i];
          } else if (s[i] > second) {
            second = s[i];
          }
        }
        group_score[g] = per_group >= 2 ? best + second : best;
      }
      // Stable ordering: on equal values the lower index wins (a fixed, documented rule).
      std::iota(order.begin(), order.begin() + a.num_groups, 0);
      std::stable_sort(order.begin(), order.begin() + a.num_groups,
                       [&](int32_t x, int32_t y) { return group_score[x] > group_score[y]; });
      std::vector<char> keep(a.num_groups, 0);
      for (int64_t i = 0; i < a.topk_groups; ++i) keep[order[i]] = 1;
      for (int64_t x = 0; x < a.num_experts; ++x) {
        if (!keep[x / per_group]) choice[x] = -std::numeric_limits<float>::infinity();
      }
      std::iota(order.begin(), order.begin() + a.num_experts, 0);
      std::partial_sort(order.begin(), order.begin() + a.top_k, order.begin() + a.num_experts,
                        [&](int32_t x, int32_t y) {
                          return choice[x] > choice[y] || (choice[x] == choice[y] && x < y);
                        });
      std::sort(order.begin(), order.begin() + a.top_k);
      float sum = 0;
      for (int64_t i = 0; i < a.top_k; ++i) sum += score[order[i]];
      // Weights use the unbiased scores: the bias only steers selection (load balancing).
      const float denom = a.normalize ? sum + 1e-20f : 1.0f;
      for (int64_t i = 0; i < a.top_k; ++i) {
        a.topk_ids[t * a.top_k + i] = order[i];
        a.topk_weights[t * a.top_k + i] = score[order[i]] / denom * a.scaling_factor;
      }
    }
  });
}

void CpuBackend::ArgmaxRows(int64_t rows, int64_t vocab, const float* logits, int32_t* out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * vocab;
    out[r] = static_cast<int32_t>(std::max_element(l, l + vocab) - l);
  }
}

void CpuBackend::GreedySampleRows(int64_t rows, int64_t vocab, const float* logits, int32_t* token,
                                  float* logprob) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * vocab;
    const int64_t best = std::max_element(l, l + vocab) - l;
    const double mx = l[best];
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(l[i]) - mx);
    token[r] = static_cast<int32_t>(best);
    logprob[r] = static_cast<float>(l[best] - (mx + std::log(sum)));
  }
}

void CpuBackend::MaskLogitsRows(int64_t n, int64_t vocab, float* logits, const int32_t* rows,
                                const uint32_t* masks) {
  const int64_t words = (vocab + 31) / 32;
  for (int64_t i = 0; i < n; ++i) {
    float* row = logits + static_cast<int64_t>(rows[i]) * vocab;
    const uint32_t* m = masks + i * words;
    for (int64_t t = 0; t < vocab; ++t) {
      if (!(m[t >> 5] >> (t & 31) & 1u)) row[t] = -std::numeric_limits<float>::infinity();
    }
  }
}

// Row by row through Sampler itself, so the CPU op is Sampler by construction.
void CpuBackend::SampleRows(int64_t rows, int64_t vocab, const float* logits,
                            const RowSamplingParams* params, int32_t* token, float* logprob) {
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max()) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("SampleRows: vocab must be in [1, 2^31), got ", vocab)));
    return;
  }
  pool_.ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      SamplingParams sp;
      sp.temperature = params[r].temperature;
      sp.top_k = params[r].top_k;
      sp.top_p = params[r].top_p;
      sp.seed = params[r].seed;
      auto s =
          Sampler::Sample(logits + r * vocab, static_cast<int32_t>(vocab), sp, params[r].position);
      token[r] = s.ok() ? s->token : -1;
      logprob[r] = s.ok() ? s->logprob : std::numeric_limits<float>::quiet_NaN();
    }
  });
}

void CpuBackend::TopLogprobsRows(int64_t rows, int64_t vocab, const float* logits, int32_t n,
                                 int32_t* ids, float* logprobs) {
  if (n < 1 || n > kMaxTopLogprobs) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("TopLogprobsRows: n must be in [1, ", kMaxTopLogprobs, "], got ", n)));
    return;
  }
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max()) {
    Record(absl::InvalidArgumentError(
        absl::StrCat("TopLogprobsRows: vocab must be in [1, 2^31), got ", vocab)));
    return;
  }
  pool_.ParallelFor(rows, 1, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      SamplingParams sp;  // greedy: only top_logprobs is used
      sp.num_logprobs = n;
      auto s = Sampler::Sample(logits + r * vocab, static_cast<int32_t>(vocab), sp, 0);
      CHECK(s.ok()) << s.status();  // the arguments were checked above
      for (int32_t j = 0; j < n; ++j) {
        const bool have = j < static_cast<int32_t>(s->top_logprobs.size());
        ids[r * n + j] = have ? s->top_logprobs[j].first : -1;
        logprobs[r * n + j] =
            have ? s->top_logprobs[j].second : -std::numeric_limits<float>::infinity();
      }
    }
  });
}

void CpuBackend::AdjustLogits(int64_t rows, int64_t vocab, float* logits, int64_t n,
                              const LogitAdjustment* adjustments, const int32_t* count) {
  if (count != nullptr) n = std::min<int64_t>(n, *count);
  for (int64_t i = 0; i < n; ++i) {
    const LogitAdjustment& a = adjustments[i];
    if (a.row < 0 || a.row >= rows || a.token < 0 || a.token >= vocab) continue;
    float& l = logits[a.row * vocab + a.token];
    l = AdjustLogit(l, a);
  }
}

void CpuBackend::TokenLogprobRows(int64_t rows, int64_t vocab, const float* logits,
                                  const int32_t* token, float* logprob) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* l = logits + r * vocab;
    if (token[r] < 0 || token[r] >= vocab) {
      logprob[r] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    const double mx = *std::max_element(l, l + vocab);
    double sum = 0;
    for (int64_t i = 0; i < vocab; ++i) sum += std::exp(static_cast<double>(l[i]) - mx);
    logprob[r] = static_cast<float>(l[token[r]] - (mx + std::log(sum)));
  }
}

void CpuBackend::Record(const absl::Status& st) {
  absl::MutexLock lock(&mu_);
  if (status_.ok()) status_ = st;
}

absl::Status CpuBackend::status() const {
  absl::MutexLock lock(&mu_);
  return status_;
}

}  // namespace deepinfer
