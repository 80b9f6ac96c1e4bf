// MlaPrefillBf16: absorbed MLA for prefill as two cuBLAS GEMMs per chunk of queries (see
// mla_prefill.h). The kernels here only move data (gather the paged cache, pack the queries) and
// run the causal softmax; the FLOPs are cuBLAS's bf16 tensor-core GEMMs.
#include <cuda_bf16.h>
#include <math.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/attention/mla_prefill.h"

namespace deepinfer {
namespace kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 8;  // elements per thread-step of the copy kernels (16 bytes of bf16)
// Soft cap on the workspace: sequences of a batch and query rows of a chunk are cut down until
// the chunk's buffers fit (never below one sequence and one token).
constexpr size_t kWorkspaceBudget = size_t{256} << 20;
constexpr size_t kAlign = 256;

size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }
int64_t RoundUp8(int64_t v) { return (v + 7) / 8 * 8; }

// Eight cache elements as fp32.
__device__ __forceinline__ void LoadEight(const float* src, float* v) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = src[i];
}
__device__ __forceinline__ void LoadEight(const uint16_t* src, float* v) {
#pragma unroll
  for (int i = 0; i < kVec; ++i) v[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
}

__device__ __forceinline__ void StoreEightBf16(__nv_bfloat16* dst, const float* v) {
  __align__(16) __nv_bfloat16 b[kVec];
#pragma unroll
  for (int i = 0; i < kVec; ++i) b[i] = __float2bfloat16_rn(v[i]);
  *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(b);
}

// keys[g, j, :] = bf16(cache entry j of sequence seq0 + g), j < len, for g < batch.
template <typename T>
__global__ void GatherKeysKernel(const T* cache, int block_size, int dim, const int32_t* tables,
                                 int max_blocks, int seq0, int64_t len, int64_t batch,
                                 __nv_bfloat16* keys) {
  const int vecs = dim / kVec;
  const int64_t total = batch * len * vecs;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = v / vecs;
    const int c = static_cast<int>(v - row * vecs) * kVec;
    const int64_t g = row / len, j = row - g * len;
    const int32_t block = tables[(seq0 + g) * max_blocks + j / block_size];
    const T* src = cache + (static_cast<int64_t>(block) * block_size + j % block_size) * dim + c;
    float e[kVec];
    LoadEight(src, e);
    StoreEightBf16(keys + row * dim + c, e);
  }
}

// q[g, r, :] = bf16([q_latent | q_rope] of query row r of this chunk of sequence g), where row r
// is token first_token + g * seq_stride + r / heads, head r % heads.
__global__ void PackQueriesKernel(MlaPrefillParams p, int64_t first_token, int64_t seq_stride,
                                  int64_t rows, int64_t batch, __nv_bfloat16* q) {
  const int latent = p.latent_dim, dim = latent + p.rope_dim, vecs = dim / kVec;
  const int64_t total = batch * rows * vecs;
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = v / vecs;
    const int c = static_cast<int>(v - row * vecs) * kVec;
    const int64_t g = row / rows, r = row - g * rows;
    const int64_t t = first_token + g * seq_stride + r / p.num_heads, h = r % p.num_heads;
    const float* src =
        c < latent ? p.q_latent + (t * p.num_heads + h) * latent + c
                   : p.q_rope + t * p.q_rope_token_stride + h * p.q_rope_head_stride + (c - latent);
    float e[kVec];
    LoadEight(src, e);
    StoreEightBf16(q + row * dim + c, e);
  }
}

__device__ __forceinline__ float BlockReduce(float v, bool is_max, float* shared) {
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __syncthreads();  // shared is reused by consecutive reductions
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < kThreads / 32 ? shared[lane] : (is_max ? -INFINITY : 0.0f);
  for (int o = 16; o > 0; o >>= 1) {
    const float w = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, w) : v + w;
  }
  return v;
}

// One block per query row of the chunk (all sequences of the batch): P = softmax of the row's
// visible scores (keys 0 .. past + token), rounded to bf16, zero for the masked keys up to ld.
// Row r of sequence g is token first + (r % rows) / heads of that sequence.
__global__ void __launch_bounds__(kThreads)
    CausalSoftmaxKernel(const float* scores, int64_t ld, int64_t rows, int heads,
                        int64_t visible_base, __nv_bfloat16* probs) {
  __shared__ float shared[kThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t visible = visible_base + (row % rows) / heads;
  const float* s = scores + row * ld;
  __nv_bfloat16* out = probs + row * ld;
  float mx = -INFINITY;
  for (int64_t j = threadIdx.x; j < visible; j += kThreads) mx = fmaxf(mx, s[j]);
  mx = BlockReduce(mx, true, shared);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < visible; j += kThreads) sum += expf(s[j] - mx);
  sum = BlockReduce(sum, false, shared);
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < ld; j += kThreads) {
    out[j] = __float2bfloat16_rn(j < visible ? expf(s[j] - mx) * inv : 0.0f);
  }
}

unsigned GridFor(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(blocks, 1), 65535 * 16));
}

// A run of `count` sequences starting at sequences[first], all with the same shape, sharing
// every launch; query chunks of `chunk_tokens` tokens.
struct Batch {
  int32_t first = 0, count = 0;
  int64_t tokens = 0, context = 0, chunk_tokens = 0;
};

// Buffer offsets inside the workspace for one batch.
struct Layout {
  size_t keys = 0, queries = 0, scores = 0, probs = 0, total = 0;
};

Layout LayoutFor(const MlaPrefillParams& p, const Batch& b) {
  const int64_t dim = p.latent_dim + p.rope_dim;
  const int64_t rows = b.chunk_tokens * p.num_heads;
  const int64_t ld = RoundUp8(b.context);
  Layout l;
  l.keys = 0;
  l.queries = AlignUp(static_cast<size_t>(b.count * b.context * dim) * 2);
  l.scores = l.queries + AlignUp(static_cast<size_t>(b.count * rows * dim) * 2);
  l.probs = l.scores + AlignUp(static_cast<size_t>(b.count * rows * ld) * 4);
  l.total = l.probs + AlignUp(static_cast<size_t>(b.count * rows * ld) * 2);
  return l;
}

bool Valid(const MlaPrefillParams& p) {
  if (p.num_heads <= 0 || p.latent_dim <= 0 || p.latent_dim % kVec != 0 || p.rope_dim < 0 ||
      p.rope_dim % kVec != 0 || p.block_size <= 0 || p.num_sequences < 0 ||
      (p.num_sequences > 0 && p.sequences == nullptr) || p.chunk_rows < 0) {
    return false;
  }
  for (int32_t i = 0; i < p.num_sequences; ++i) {
    const MlaPrefillSequence& s = p.sequences[i];
    if (s.num_tokens <= 0 || s.num_tokens > s.context_len || s.first_token < 0 || s.seq < 0 ||
        static_cast<int64_t>(s.context_len) >
            static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size) {
      return false;
    }
  }
  return true;
}

// Splits the sequences into batches: consecutive sequences (next block-table row, next tokens)
// with equal shapes, as many as the workspace budget allows.
std::vector<Batch> PlanBatches(const MlaPrefillParams& p) {
  const int64_t want_rows = p.chunk_rows > 0 ? p.chunk_rows : kMlaPrefillChunkRows;
  std::vector<Batch> batches;
  for (int32_t i = 0; i < p.num_sequences;) {
    const MlaPrefillSequence& s = p.sequences[i];
    Batch b;
    b.first = i;
    b.tokens = s.num_tokens;
    b.context = s.context_len;
    // Chunk rows: the request, cut so that one sequence's scores + probabilities (6 bytes per
    // score) fit half the budget.
    const int64_t fit_rows = static_cast<int64_t>(kWorkspaceBudget / 2) / (6 * RoundUp8(b.context));
    const int64_t rows = std::max<int64_t>(p.num_heads, std::min(want_rows, fit_rows));
    b.chunk_tokens = std::min<int64_t>(b.tokens, std::max<int64_t>(1, rows / p.num_heads));
    b.count = 1;
    while (i + b.count < p.num_sequences) {
      const MlaPrefillSequence& prev = p.sequences[i + b.count - 1];
      const MlaPrefillSequence& next = p.sequences[i + b.count];
      if (next.num_tokens != s.num_tokens || next.context_len != s.context_len ||
          next.seq != prev.seq + 1 || next.first_token != prev.first_token + prev.num_tokens) {
        break;
      }
      Batch more = b;
      more.count = b.count + 1;
      if (LayoutFor(p, more).total > kWorkspaceBudget) break;
      b.count = more.count;
    }
    batches.push_back(b);
    i += b.count;
  }
  return batches;
}

}  // namespace

size_t MlaPrefillWorkspaceBytes(const MlaPrefillParams& params) {
  if (!Valid(params)) return 0;
  size_t bytes = 0;
  for (const Batch& b : PlanBatches(params)) bytes = std::max(bytes, LayoutFor(params, b).total);
  return bytes;
}

cudaError_t MlaPrefillBf16(const MlaPrefillParams& p, cublasHandle_t blas, cudaStream_t stream,
                           cublasStatus_t* blas_status) {
  if (blas_status != nullptr) *blas_status = CUBLAS_STATUS_SUCCESS;
  if (p.num_sequences == 0) return cudaSuccess;
  if (!Valid(p)) return cudaErrorInvalidValue;
  const std::vector<Batch> batches = PlanBatches(p);
  size_t need = 0;
  for (const Batch& b : batches) need = std::max(need, LayoutFor(p, b).total);
  void* workspace = p.workspace;
  const bool own = workspace == nullptr;
  if (!own && p.workspace_bytes < need) return cudaErrorInvalidValue;
  if (own) {
    const cudaError_t e = cudaMallocAsync(&workspace, need, stream);
    if (e != cudaSuccess) return e;
  }
  cudaError_t err = cudaSuccess;
  cublasStatus_t bst = cublasSetStream(blas, stream);
  const int64_t dim = p.latent_dim + p.rope_dim;
  const float zero = 0.0f, one = 1.0f;
  for (const Batch& b : batches) {
    if (err != cudaSuccess || bst != CUBLAS_STATUS_SUCCESS) break;
    const Layout l = LayoutFor(p, b);
    char* base = static_cast<char*>(workspace);
    auto* keys = reinterpret_cast<__nv_bfloat16*>(base + l.keys);
    auto* queries = reinterpret_cast<__nv_bfloat16*>(base + l.queries);
    auto* scores = reinterpret_cast<float*>(base + l.scores);
    auto* probs = reinterpret_cast<__nv_bfloat16*>(base + l.probs);
    const MlaPrefillSequence& s0 = p.sequences[b.first];
    const int64_t past = b.context - b.tokens;  // cached positions before the new tokens
    const int64_t key_work = b.count * b.context * (dim / kVec);
    if (p.cache_dtype == MlaCacheDType::kFloat32) {
      GatherKeysKernel<float><<<GridFor(key_work), kThreads, 0, stream>>>(
          static_cast<const float*>(p.cache), p.block_size, static_cast<int>(dim), p.block_tables,
          p.max_blocks_per_seq, s0.seq, b.context, b.count, keys);
    } else {
      GatherKeysKernel<uint16_t><<<GridFor(key_work), kThreads, 0, stream>>>(
          static_cast<const uint16_t*>(p.cache), p.block_size, static_cast<int>(dim),
          p.block_tables, p.max_blocks_per_seq, s0.seq, b.context, b.count, keys);
    }
    err = cudaGetLastError();
    for (int64_t i0 = 0; i0 < b.tokens && err == cudaSuccess && bst == CUBLAS_STATUS_SUCCESS;
         i0 += b.chunk_tokens) {
      const int64_t i1 = std::min(b.tokens, i0 + b.chunk_tokens);
      const int64_t rows = (i1 - i0) * p.num_heads;
      const int64_t keys_seen = past + i1;  // the chunk's last query sees this many keys
      const int64_t ld = RoundUp8(keys_seen);
      PackQueriesKernel<<<GridFor(b.count * rows * (dim / kVec)), kThreads, 0, stream>>>(
          p, s0.first_token + i0, b.tokens, rows, b.count, queries);
      err = cudaGetLastError();
      if (err != cudaSuccess) break;
      // Row-major S[rows, keys] = Q·Kᵀ is column-major Sᵀ = K·Qᵀ: cuBLAS sees K as a
      // [dim x keys] column-major matrix, transposed.
      bst = cublasGemmStridedBatchedEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(keys_seen),
                                       static_cast<int>(rows), static_cast<int>(dim),
                                       &p.softmax_scale, keys, CUDA_R_16BF, static_cast<int>(dim),
                                       b.context * dim, queries, CUDA_R_16BF, static_cast<int>(dim),
                                       rows * dim, &zero, scores, CUDA_R_32F, static_cast<int>(ld),
                                       rows * ld, b.count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (bst != CUBLAS_STATUS_SUCCESS) break;
      CausalSoftmaxKernel<<<static_cast<unsigned>(b.count * rows), kThreads, 0, stream>>>(
          scores, ld, rows, p.num_heads, past + i0 + 1, probs);
      err = cudaGetLastError();
      if (err != cudaSuccess) break;
      // O[rows, latent] = P·C, C = the latent columns of the gathered keys (row stride dim).
      bst = cublasGemmStridedBatchedEx(
          blas, CUBLAS_OP_N, CUBLAS_OP_N, p.latent_dim, static_cast<int>(rows),
          static_cast<int>(keys_seen), &one, keys, CUDA_R_16BF, static_cast<int>(dim),
          b.context * dim, probs, CUDA_R_16BF, static_cast<int>(ld), rows * ld, &zero,
          p.out_latent + (s0.first_token + i0) * p.num_heads * p.latent_dim, CUDA_R_32F,
          p.latent_dim, b.tokens * p.num_heads * p.latent_dim, b.count, CUBLAS_COMPUTE_32F,
          CUBLAS_GEMM_DEFAULT);
    }
  }
  if (own) {
    const cudaError_t f = cudaFreeAsync(workspace, stream);
    if (err == cudaSuccess) err = f;
  }
  if (err == cudaSuccess && bst != CUBLAS_STATUS_SUCCESS) {
    if (blas_status != nullptr) *blas_status = bst;
    err = cudaErrorUnknown;
  }
  return err;
}

}  // namespace kernels
}  // namespace deepinfer
