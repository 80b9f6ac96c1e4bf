// MhaPrefillBf16: non-absorbed MLA prefill (see mha_prefill.h). The gather kernel moves the
// cached entries, cuBLAS (or the caller's GEMM) expands them through kv_b, mha::FlashKernel and
// mha::FlashWideKernel (mha_prefill_flash.cuh, compiled here) are the attention.
#include <cuda_bf16.h>
#include <math.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/attention/mha_prefill.h"
#include "kernels/attention/mha_prefill_flash.cuh"
#include "kernels/attention/mma_sm80.cuh"
#include "kernels/common/kernel_facts.h"

namespace deepinfer {
namespace kernels {
namespace {

using sm80::PackBf16;

constexpr int kCopyThreads = 256;
constexpr size_t kAlign = 256;

size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

// -------------------------------------------------------------------------------------------
// The gather: block row y copies sequence y of the group, 8 values (16 bytes of bf16) a thread
// and step; the entries of a key are contiguous in both the cache and the workspace, so a warp's
// loads and stores are 512 contiguous bytes.
struct GatherSeq {
  int32_t seq = 0, len = 0;
  int64_t key_base = 0;
};

struct GatherArgs {
  const void* cache;
  int32_t block_size, dim, max_blocks;
  const int32_t* tables;
  __nv_bfloat16* keys;  // [group keys, dim]
  GatherSeq seqs[mha::kMaxSeqs];
};

template <bool kBf16>
__global__ void __launch_bounds__(kCopyThreads)
    GatherGroupKernel(const __grid_constant__ GatherArgs a) {
  const GatherSeq& s = a.seqs[blockIdx.y];
  const int vecs = a.dim / 8;
  const int64_t total = static_cast<int64_t>(s.len) * vecs;
  const int32_t* table = a.tables + static_cast<int64_t>(s.seq) * a.max_blocks;
  uint4* dst = reinterpret_cast<uint4*>(a.keys + s.key_base * a.dim);
  for (int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; v < total;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int32_t j = static_cast<int32_t>(v / vecs);  // a key of the sequence: < 2^31
    const int64_t c = v - static_cast<int64_t>(j) * vecs;
    const int64_t slot =
        static_cast<int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
    if constexpr (kBf16) {
      dst[v] = __ldg(static_cast<const uint4*>(a.cache) + slot * vecs + c);
    } else {
      const float4* src = static_cast<const float4*>(a.cache) + (slot * vecs + c) * 2;
      const float4 x = __ldg(src), y = __ldg(src + 1);
      uint4 packed;
      packed.x = sm80::PackBf16(x.x, x.y);
      packed.y = sm80::PackBf16(x.z, x.w);
      packed.z = sm80::PackBf16(y.x, y.y);
      packed.w = sm80::PackBf16(y.z, y.w);
      dst[v] = packed;
    }
  }
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The shapes and layouts the kernels are written for (the device is checked separately).
bool ShapeOk(const MhaPrefillParams& p) {
  const bool one_out = (p.out != nullptr) != (p.out_bf16 != nullptr);
  return p.num_heads > 0 && p.nope_dim == mha::kNope && p.v_dim == mha::kV &&
         p.rope_dim == mha::kRope && p.latent_dim > 0 && p.latent_dim % 8 == 0 &&
         p.block_size > 0 && p.max_blocks_per_seq > 0 && p.q != nullptr && p.cache != nullptr &&
         p.kv_b != nullptr && p.block_tables != nullptr && one_out && Aligned16(p.q) &&
         p.q_token_stride % 4 == 0 && p.q_head_stride % 4 == 0 && Aligned16(p.cache) &&
         Aligned16(p.kv_b) && p.out_token_stride >= static_cast<int64_t>(p.num_heads) * p.v_dim &&
         p.out_token_stride % 2 == 0 && (p.sequences != nullptr || p.num_sequences == 0) &&
         p.num_sequences >= 0;
}

bool SequencesOk(const MhaPrefillParams& p) {
  for (int32_t i = 0; i < p.num_sequences; ++i) {
    const MhaPrefillSequence& s = p.sequences[i];
    if (s.num_tokens < 1 || s.num_tokens > s.context_len || s.first_token < 0 || s.seq < 0 ||
        s.context_len > static_cast<int64_t>(p.max_blocks_per_seq) * p.block_size) {
      return false;
    }
  }
  return true;
}

bool Supported(const MhaPrefillParams& p) {
  if (!ShapeOk(p)) return false;
  // The first call also raises the flash kernel's dynamic shared-memory limit to kSmemBytes.
  const KernelFacts f =
      KernelFactsForCurrentDevice(reinterpret_cast<const void*>(mha::FlashKernel), mha::kSmemBytes);
  return f.error == cudaSuccess && f.ptx_version >= 80 && f.max_smem >= mha::kSmemBytes;
}

// Whether the device runs the wide kernel (the first call also raises its dynamic shared-memory
// limit).
bool WideSupported() {
  constexpr int kBytes = mha::kWideSmemBytes;
  const KernelFacts f =
      KernelFactsForCurrentDevice(reinterpret_cast<const void*>(mha::FlashWideKernel), kBytes);
  return f.error == cudaSuccess && f.ptx_version >= 80 && f.max_smem >= kBytes;
}

// Query rows of the sequences [begin, end) padded to whole tiles of `rows`.
int64_t PaddedRows(const MhaPrefillParams& p, int32_t begin, int32_t end, int64_t rows) {
  int64_t padded = 0;
  for (int32_t i = begin; i < end; ++i) {
    padded += (p.sequences[i].num_tokens + rows - 1) / rows * rows;
  }
  return padded;
}

// The flash kernel of the sequences [begin, end): params.flash with kAuto resolved (see
// MhaFlashKernel), a wide kernel the device does not run replaced by kRows64.
MhaFlashKernel FlashFor(const MhaPrefillParams& p, int32_t begin, int32_t end) {
  MhaFlashKernel k = p.flash;
  if (k == MhaFlashKernel::kAuto) {
    const int64_t at64 = PaddedRows(p, begin, end, mha::kRows);
    const int64_t at128 = PaddedRows(p, begin, end, mha::kWideRows);
    k = 8 * at128 <= 9 * at64 ? MhaFlashKernel::kRows128 : MhaFlashKernel::kRows64;
  }
  const bool ok = k == MhaFlashKernel::kRows64 || WideSupported();
  return ok ? k : MhaFlashKernel::kRows64;
}

// Bytes of one key in the workspace: its gathered entry and its expanded K_nope | V of every head.
size_t BytesPerKey(const MhaPrefillParams& p) {
  return (static_cast<size_t>(p.latent_dim + p.rope_dim) +
          static_cast<size_t>(p.num_heads) * (p.nope_dim + p.v_dim)) *
         sizeof(uint16_t);
}

// Consecutive sequences whose keys fit the budget together (at least one each): [begin, end).
struct Group {
  int32_t begin = 0, end = 0;
  int64_t keys = 0;
};

// As many groups as the budget and kMaxSeqs need, of about equal key counts (one group's flash
// launch ends with a tail where the GPU is part idle: a small last group would be mostly tail).
std::vector<Group> PlanGroups(const MhaPrefillParams& p) {
  const size_t per_key = BytesPerKey(p);
  int64_t total = 0;
  for (int32_t i = 0; i < p.num_sequences; ++i) total += p.sequences[i].context_len;
  const size_t budget = p.workspace_budget > 0 ? p.workspace_budget : kMhaDefaultWorkspaceBudget;
  const int64_t budget_keys = std::max<int64_t>(1, static_cast<int64_t>(budget / per_key));
  const int64_t count = std::max<int64_t>({int64_t{1}, (total + budget_keys - 1) / budget_keys,
                                           (p.num_sequences + mha::kMaxSeqs - 1) / mha::kMaxSeqs});
  const int64_t target = (total + count - 1) / count;
  std::vector<Group> groups;
  Group g;
  for (int32_t i = 0; i < p.num_sequences; ++i) {
    const int64_t len = p.sequences[i].context_len;
    if (g.end > g.begin &&
        (g.keys + len > target || g.keys + len > budget_keys || i - g.begin >= mha::kMaxSeqs)) {
      groups.push_back(g);
      g = Group{i, i, 0};
    }
    g.end = i + 1;
    g.keys += len;
  }
  if (g.end > g.begin) groups.push_back(g);
  return groups;
}

// Workspace of a group of `keys` keys: gathered entries, then the expanded K_nope | V.
size_t EntriesBytes(const MhaPrefillParams& p, int64_t keys) {
  return AlignUp(static_cast<size_t>(keys) * (p.latent_dim + p.rope_dim) * sizeof(uint16_t));
}
size_t GroupBytes(const MhaPrefillParams& p, int64_t keys) {
  return EntriesBytes(p, keys) + AlignUp(static_cast<size_t>(keys) * p.num_heads *
                                         (p.nope_dim + p.v_dim) * sizeof(uint16_t));
}

unsigned GridFor(int64_t work) {
  return static_cast<unsigned>(
      std::max<int64_t>(1, std::min<int64_t>((work + kCopyThreads - 1) / kCopyThreads, 65535)));
}

}  // namespace

bool MhaPrefillSupported(const MhaPrefillParams& params) { return Supported(params); }

size_t MhaPrefillWorkspaceBytes(const MhaPrefillParams& params) {
  if (!ShapeOk(params) || !SequencesOk(params)) return 0;
  size_t bytes = 0;
  for (const Group& g : PlanGroups(params)) bytes = std::max(bytes, GroupBytes(params, g.keys));
  return bytes;
}

cudaError_t MhaPrefillBf16(const MhaPrefillParams& p, cublasHandle_t blas, cudaStream_t stream,
                           cublasStatus_t* blas_status) {
  if (blas_status != nullptr) *blas_status = CUBLAS_STATUS_SUCCESS;
  if (!Supported(p) || !SequencesOk(p)) return cudaErrorInvalidValue;
  if (p.num_sequences == 0) return cudaSuccess;
  if (p.workspace_bytes < MhaPrefillWorkspaceBytes(p) || !Aligned16(p.workspace)) {
    return cudaErrorInvalidValue;
  }
  const int entry = p.latent_dim + p.rope_dim;
  const int kv_width = p.num_heads * (p.nope_dim + p.v_dim);
  __nv_bfloat16* entries = static_cast<__nv_bfloat16*>(p.workspace);
  mha::Args a{};
  a.q = p.q;
  a.q_token_stride = p.q_token_stride;
  a.q_head_stride = p.q_head_stride;
  a.entries = entries;
  a.entry_dim = entry;
  a.latent_dim = p.latent_dim;
  a.heads = p.num_heads;
  a.scale_log2 = p.softmax_scale * 1.4426950408889634f;
  a.out = p.out;
  a.out_bf16 = reinterpret_cast<__nv_bfloat16*>(p.out_bf16);
  a.out_token_stride = p.out_token_stride;
  cublasStatus_t st = cublasSetStream(blas, stream);
  for (const Group& g : PlanGroups(p)) {
    __nv_bfloat16* kv =
        reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(p.workspace) + EntriesBytes(p, g.keys));
    a.kv = kv;
    const MhaFlashKernel flash = FlashFor(p, g.begin, g.end);
    const int64_t rows = flash == MhaFlashKernel::kRows64 ? mha::kRows : mha::kWideRows;
    int64_t key_base = 0, max_tiles = 0, max_len = 0;
    GatherArgs ga{};
    ga.cache = p.cache;
    ga.block_size = p.block_size;
    ga.dim = entry;
    ga.max_blocks = p.max_blocks_per_seq;
    ga.tables = p.block_tables;
    ga.keys = entries;
    for (int32_t i = g.begin; i < g.end; ++i) {
      const MhaPrefillSequence& s = p.sequences[i];
      ga.seqs[i - g.begin] = {s.seq, s.context_len, key_base};
      max_len = std::max<int64_t>(max_len, s.context_len);
      const int64_t tiles = (s.num_tokens + rows - 1) / rows;
      a.seqs[i - g.begin] = {s.first_token, s.num_tokens, s.context_len,
                             static_cast<int32_t>(key_base), static_cast<int32_t>(tiles)};
      max_tiles = std::max(max_tiles, tiles);
      key_base += s.context_len;
    }
    const dim3 gather_grid(GridFor(max_len * (entry / 8)), static_cast<unsigned>(g.end - g.begin));
    if (p.cache_bf16) {
      GatherGroupKernel<true><<<gather_grid, kCopyThreads, 0, stream>>>(ga);
    } else {
      GatherGroupKernel<false><<<gather_grid, kCopyThreads, 0, stream>>>(ga);
    }
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    bool expanded = false;
    if (p.expand_gemm) {
      MhaExpandGemm eg;
      eg.keys = g.keys;
      eg.kv_width = kv_width;
      eg.latent_dim = p.latent_dim;
      eg.entries = reinterpret_cast<const uint16_t*>(entries);
      eg.entries_stride = entry;
      eg.kv_b = p.kv_b;
      eg.kv = reinterpret_cast<uint16_t*>(kv);
      e = p.expand_gemm(eg, stream);
      if (e != cudaSuccess && e != cudaErrorNotSupported) return e;
      expanded = e == cudaSuccess;
    }
    // KV (row-major [keys, kv_width]) = entries[:, :latent] . kv_b^T; column-major that is
    // KV^T = kv_b (op T of its [latent, kv_width] column-major view) x entries^T.
    const float one = 1.0f, zero = 0.0f;
    if (!expanded && st == CUBLAS_STATUS_SUCCESS) {
      st = cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, kv_width, static_cast<int>(g.keys),
                        p.latent_dim, &one, p.kv_b, CUDA_R_16BF, p.latent_dim, entries, CUDA_R_16BF,
                        entry, &zero, kv, CUDA_R_16BF, kv_width, CUBLAS_COMPUTE_32F,
                        CUBLAS_GEMM_DEFAULT);
    }
    if (st != CUBLAS_STATUS_SUCCESS) {
      if (blas_status != nullptr) *blas_status = st;
      return cudaErrorUnknown;
    }
    if (p.expand_only) continue;
    a.max_tiles = static_cast<int32_t>(max_tiles);
    if (flash != MhaFlashKernel::kRows64) {
      const int64_t pairs = static_cast<int64_t>(g.end - g.begin) * p.num_heads;
      a.num_seqs = g.end - g.begin;
      const dim3 grid(static_cast<unsigned>(pairs * max_tiles));
      mha::FlashWideKernel<<<grid, mha::kThreads, mha::kWideSmemBytes, stream>>>(a);
      e = cudaGetLastError();
      if (e != cudaSuccess) return e;
      continue;
    }
    constexpr int64_t kMaxGridZ = 65535;
    for (int64_t z0 = 0; z0 < max_tiles; z0 += kMaxGridZ) {
      a.z_offset = static_cast<int32_t>(z0);
      const dim3 grid(static_cast<unsigned>(p.num_heads), static_cast<unsigned>(g.end - g.begin),
                      static_cast<unsigned>(std::min(kMaxGridZ, max_tiles - z0)));
      mha::FlashKernel<<<grid, mha::kThreads, mha::kSmemBytes, stream>>>(a);
      e = cudaGetLastError();
      if (e != cudaSuccess) return e;
    }
  }
  return cudaSuccess;
}

}  // namespace kernels
}  // namespace deepinfer
