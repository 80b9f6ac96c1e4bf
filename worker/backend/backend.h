// Backend: the device-neutral set of operations the DeepSeek-V3 forward pass needs. Most are
// primitives every backend implements. A few are fused forms a backend may have: those with a
// default body here run their reference composition unless a backend overrides them
// (AddRmsNormGemms, RouteTokens, NormRopeCacheAbsorbQuery); those that return bool may decline
// the arguments, and the model reaches them only through the providers in ops/, which run the
// reference composition where a backend declines.
//
// Conventions (shared by every implementation, so a CUDA backend can be checked against the
// CPU one op by op):
//  * All pointers are device addresses from this backend's DeviceBuffers.
//  * Activations are fp32 row-major. "ld*" arguments are row strides in elements, so ops can
//    read column slices (e.g. the rope part of each head) without copies.
//  * Matrix weights (the operand W of the GEMMs) are stored in the backend's weight_dtype():
//    fp32, or bf16 with fp32 accumulation. The CUDA backend also takes FP8 (e4m3) matrices
//    with 128 x 128 block scales (WeightView::fp8), kept as a checkpoint stores them. A bf16 GEMM
//    rounds its fp32 activation operand to bf16 too (round to nearest even), so every product is
//    exact in fp32 and only the summation order differs between backends. Norms, residuals, rope,
//    attention math and the router stay fp32; the latent KV cache may store bf16 or FP8
//    (PagedLatentCacheView::dtype).
//  * Linear layers follow the checkpoint layout: W is [out_features, in_features], y = x·Wᵀ.
//  * Index arrays (token ids, positions, slots, block tables, expert ids) are int32.
//  * Host-side plans (expert group offsets) are passed as host vectors: they are produced by
//    the dispatcher, which already synchronises with the host to size its buffers.
#ifndef DEEPINFER_WORKER_BACKEND_BACKEND_H_
#define DEEPINFER_WORKER_BACKEND_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/backend/device_buffer.h"
#include "worker/backend/dummy_fill.h"
#include "worker/backend/fp8_latent_entry.h"
#include "worker/backend/v4_ops.h"
#include "worker/sampling/logit_adjustment.h"
#include "worker/sampling/row_sampling_params.h"

namespace deepinfer {

// Storage type of matrix weights (see Backend::weight_dtype()). kFp8E4M3 and kMxfp4E2M1 are never
// a backend's weight_dtype(): only single matrices kept FP8 (WeightView::fp8) and routed experts
// kept MXFP4 (RoutedExpertsArgs::mxfp4(), kernels/gemm/mxfp4_mma_gemm.h's layout) have them.
enum class WeightDType { kFloat32, kBFloat16, kFp8E4M3, kMxfp4E2M1 };
// "float32" / "bfloat16" / "float8_e4m3" / "mxfp4_e2m1"
const char* WeightDTypeName(WeightDType dtype);
// Bytes of one element; MXFP4 (two elements a byte): 1, never used to size a matrix.
size_t WeightDTypeSize(WeightDType dtype);
// "float32" / "bfloat16" (also "fp32", "bf16"); INVALID_ARGUMENT naming the bad value otherwise.
absl::StatusOr<WeightDType> ParseWeightDType(const std::string& name);

// The block scales of an FP8 matrix [n, k] (DeepSeek's `weight_scale_inv`): element (j, p) is
// e4m3(j, p) * scales[row(j) * scale_ld + p / 128], row(j) = j / 128, or for a matrix stacked
// from two checkpoint tensors at split_rows (an MLP's [gate; up]) ceil(split_rows / 128) +
// (j - split_rows) / 128 from row split_rows on (kernels/gemm/fp8_block_gemm.h).
struct Fp8BlockScales {
  const float* scales = nullptr;  // device fp32
  int64_t scale_ld = 0;           // >= ceil(k / 128) (the loader: rounded up to a multiple of 4)
  int64_t split_rows = 0;         // 0: one block grid
};

// A weight matrix operand: a device pointer and the type of its elements. Offsets (a head's
// slice, a row block) are counted in elements, whatever the type; an FP8 view is a whole
// matrix (Offset would lose its block grid: not offered for FP8).
struct WeightView {
  const void* data = nullptr;
  WeightDType dtype = WeightDType::kFloat32;
  Fp8BlockScales fp8;  // dtype kFp8E4M3 only

  WeightView() = default;
  WeightView(const void* d, WeightDType t) : data(d), dtype(t) {}
  WeightView(const void* d, const Fp8BlockScales& s)
      : data(d), dtype(WeightDType::kFp8E4M3), fp8(s) {}
  // fp32 weights (tests, activations used as the W operand) convert implicitly.
  WeightView(const float* d) : data(d), dtype(WeightDType::kFloat32) {}  // NOLINT
  WeightView Offset(int64_t elements) const {
    return {
        static_cast<const char*>(data) + elements * static_cast<int64_t>(WeightDTypeSize(dtype)),
        dtype};
  }
};

// An activation operand of Gemm: fp32 rows, or rows already rounded to bf16 (bits, as
// AddRmsNorm's out_bf16 and SiluMulBf16 write them). A bf16 operand gives exactly the products
// of the fp32 rows it was rounded from, without a rounding pass per GEMM; it needs bf16 weights
// on the CUDA backend (INVALID_ARGUMENT in status() otherwise).
struct ActivationView {
  const void* data = nullptr;
  WeightDType dtype = WeightDType::kFloat32;

  ActivationView(const float* d) : data(d), dtype(WeightDType::kFloat32) {}  // NOLINT
  static ActivationView Bf16(const uint16_t* d) {
    ActivationView v(nullptr);
    v.data = d;
    v.dtype = WeightDType::kBFloat16;
    return v;
  }
};

// Host memory to upload from while loading weights (Backend::AllocateHostStaging): page-locked on
// CUDA, so that a copy from it runs on the copy engine while the host goes on; plain memory on
// the CPU.
class HostStagingBuffer {
 public:
  virtual ~HostStagingBuffer() = default;
  virtual void* data() = 0;
  virtual size_t size_bytes() const = 0;
};

// Device memory as the driver reports it (cudaMemGetInfo).
struct DeviceMemoryInfo {
  size_t total_bytes = 0;
  size_t free_bytes = 0;
};

// Paged latent KV cache geometry for one layer, as the attention op sees it. Entry t of block b
// lives at byte ((b * block_size) + t) * entry_bytes() of cache, with the latent first, rope key
// after. Elements are dtype: float32, or bfloat16 (the backend's dtype by default, see
// KvBlockPoolOptions), which WriteLatentCache rounds to nearest even and the attention op widens
// to fp32 before any arithmetic; or kFp8E4M3, the latent as e4m3 codes with one fp32 scale per
// entry and the rope key bf16 (fp8_latent_entry.h), which WriteLatentCache quantises as
// QuantizeFp8LatentEntry does and the attention op dequantises to fp32 before any arithmetic.
struct PagedLatentCacheView {
  void* cache = nullptr;
  int32_t block_size = 0;
  int32_t latent_dim = 0;  // kv_lora_rank
  int32_t rope_dim = 0;    // qk_rope_head_dim
  WeightDType dtype = WeightDType::kFloat32;
  int32_t entry_dim() const { return latent_dim + rope_dim; }
  // Bytes of one entry (latent + rope key, and for FP8 the scale and padding).
  size_t entry_bytes() const {
    if (dtype == WeightDType::kFp8E4M3) {
      return static_cast<size_t>(Fp8LatentLayout(latent_dim, rope_dim).bytes);
    }
    return static_cast<size_t>(entry_dim()) * WeightDTypeSize(dtype);
  }
};

// Host-side shape of one sequence of an MlaAttention call (block-table row i is sequence i):
// its query rows are tokens first_token .. first_token + num_tokens - 1, at positions
// context_len - num_tokens .. context_len - 1 (so token_seq / context_len of those rows are i and
// context_len - num_tokens + 1 ...). Lets a backend choose a prefill algorithm per sequence
// without reading the device arrays back.
struct MlaSequenceSpan {
  int32_t first_token = 0;
  int32_t num_tokens = 0;
  int32_t context_len = 0;
};

// Arguments of the absorbed-MLA attention op. Each query token t belongs to sequence
// token_seq[t] and sees the first context_len[t] cached positions of that sequence (causal:
// its own position + 1). Block tables are [num_seqs, max_blocks_per_seq], row-major.
struct MlaAttentionArgs {
  int32_t num_tokens = 0;
  int32_t num_heads = 0;
  const float* q_latent = nullptr;  // [tokens, heads, latent_dim], contiguous
  const float* q_rope = nullptr;    // rope part of each head, strided:
  int64_t q_rope_token_stride =
      0;  //   element (t, h, i) at q_rope[t*token_stride + h*head_stride + i]
  int64_t q_rope_head_stride = 0;
  PagedLatentCacheView cache;
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  const int32_t* token_seq = nullptr;
  const int32_t* context_len = nullptr;
  float softmax_scale = 1.0f;
  float* out_latent = nullptr;  // [tokens, heads, latent_dim]
  // Optional (HOST memory, may be null): one span per block-table row, in token order, covering
  // every token exactly once and agreeing with token_seq / context_len. Without it a backend
  // uses its general (decode) algorithm for every token.
  const MlaSequenceSpan* sequences = nullptr;
  int32_t num_sequences = 0;
  // Optional (0: not given): the longest context_len the caller expects of this call's tokens,
  // for a call whose lengths the host does not see (a recorded decode step, sequences null: it
  // records the bound of its context class, see Backend::MlaDecodeContextBreak). Only a
  // performance choice: results are correct for any lengths.
  int32_t max_context_hint = 0;
};

// Arguments of Backend::MhaPrefillAttention: MLA attention in the non-absorbed form for
// prefill. Every key of a sequence (cache positions 0 .. context_len - 1, this step's included)
// is expanded through kv_b into per-head K_nope = latent . W_uk^T and V = latent . W_uv^T, and
// token t of head h attends with q = [q_nope | q_rope] over keys [K_nope | k_rope]:
//   out[t, h] = sum_j softmax_j(scale * (q_nope . K_nope[j, h] + q_rope . k_rope[j])) V[j, h],
// the same function as the absorbed MlaAttention followed by the W_uv product.
struct MhaPrefillArgs {
  int32_t num_tokens = 0;
  int32_t num_heads = 0;
  int32_t nope_dim = 0;  // qk_nope_head_dim
  int32_t v_dim = 0;     // v_head_dim
  // Head h of token t at q + t*q_token_stride + h*q_head_stride: nope_dim values, then
  // cache.rope_dim already rotated.
  const float* q = nullptr;
  int64_t q_token_stride = 0;
  int64_t q_head_stride = 0;
  PagedLatentCacheView cache;  // normalised latents and rotated rope keys
  const int32_t* block_tables = nullptr;
  int32_t max_blocks_per_seq = 0;
  WeightView kv_b;  // kv_b_proj: [heads * (nope_dim + v_dim), latent_dim], K_nope rows first
  // HOST, required: one span per block-table row, covering every token once, in order.
  const MlaSequenceSpan* sequences = nullptr;
  int32_t num_sequences = 0;
  float softmax_scale = 1.0f;
  // [tokens, heads * v_dim] contiguous: fp32 (out) or rounded to bf16 (out_bf16, a Gemm
  // operand: ActivationView::Bf16); exactly one is set.
  float* out = nullptr;
  uint16_t* out_bf16 = nullptr;
};

// Arguments of Backend::NormRopeWriteLatentCache: an MLA layer's key and query preparation.
struct NormRopeCacheArgs {
  int64_t tokens = 0;
  const float* kv = nullptr;  // [tokens, ld_kv]: cache.latent_dim values, then cache.rope_dim
  int64_t ld_kv = 0;
  const float* norm_weight = nullptr;  // kv_a_layernorm, [latent_dim]
  float eps = 1e-6f;
  float* q = nullptr;  // first query rope slice, rotated in place (q_heads 0: no query)
  int64_t q_heads = 0, q_token_stride = 0, q_head_stride = 0;
  const int32_t* positions = nullptr;
  const float* inv_freq = nullptr;
  float attention_factor = 1.0f;
  bool interleaved = false;
  const int32_t* slots = nullptr;
  PagedLatentCacheView cache;
};

// Arguments of Backend::NormRopeCacheAbsorbQuery's second half: the absorbed MLA query
// q_latent[t, h] = W_uk[h] · q_nope[t, h], BatchedGemm(heads, tokens, latent_dim, nope_dim, ...)
// with the layout below.
struct AbsorbQueryArgs {
  int64_t heads = 0, nope_dim = 0, latent_dim = 0;
  // Head h of token t at q_nope + t*q_token_stride + h*q_head_stride: nope_dim values.
  const float* q_nope = nullptr;
  int64_t q_token_stride = 0, q_head_stride = 0;
  WeightView w_uk;            // head h: [latent_dim, nope_dim] at h * latent_dim * nope_dim
  float* q_latent = nullptr;  // [tokens, heads, latent_dim]
};

// Arguments of the DeepSeek "noaux_tc" router.
struct NoauxTcRouteArgs {
  int32_t num_tokens = 0;
  int32_t num_experts = 0;
  const float* router_logits = nullptr;    // [tokens, experts]
  const float* correction_bias = nullptr;  // [experts]; selection only
  int32_t num_groups = 1;
  int32_t topk_groups = 1;
  int32_t top_k = 1;
  bool normalize = true;
  float scaling_factor = 1.0f;
  int32_t* topk_ids = nullptr;    // [tokens, top_k], ascending expert id within a token
  float* topk_weights = nullptr;  // [tokens, top_k]
};

// One GEMM of Backend::AddRmsNormGemms: c[i, j] = sum_p normed[i, p] * w[j, p], j < n.
struct NormedGemm {
  int64_t n = 0;
  WeightView w;
  int64_t ldw = 0;
  float* c = nullptr;
  int64_t ldc = 0;
};

// Arguments of Backend::RouteTokens: the router logits of the normed hidden rows, their
// noaux_tc routing, and (optionally) the EPLB counts of the choices, as one op.
struct RouteTokensArgs {
  int64_t hidden_size = 0;
  const float* hidden = nullptr;  // [route.num_tokens, hidden_size]
  // Optional (norm.weight null: none): the rows to route are normed by this op first,
  // AddRmsNorm(num_tokens, hidden_size, norm.x, norm.y, norm.weight, norm.eps, norm.out,
  // norm.out_bf16), and the routing reads norm.out (hidden is not read). The post-attention norm
  // of a MoE layer, which the CUDA backend folds into its one-token router launch.
  struct Norm {
    float* x = nullptr;
    const float* y = nullptr;
    const float* weight = nullptr;
    float eps = 0.0f;
    float* out = nullptr;  // required
    uint16_t* out_bf16 = nullptr;
  };
  Norm norm;
  const float* router_weight = nullptr;  // [route.num_experts, hidden_size], fp32
  // The router and its outputs; route.router_logits is not read (the op makes its own).
  NoauxTcRouteArgs route;
  // Optional (null: no counting): AccumulateExpertCounts(num_tokens * top_k, route.topk_ids,
  // num_experts, count_limit, expert_counts).
  int64_t* expert_counts = nullptr;
  const int32_t* count_limit = nullptr;
};

// MXFP4 routed experts at prefill sizes (CudaBackend::RoutedExperts) are widened to bf16 in
// groups of whole experts, the group's bf16 copy held in scratch for the layer's call: as many
// experts as fit in kMxfp4DequantScratchBoundBytes (a choice, not measured: it bounds the extra
// memory while keeping the groups few; Moonlight's 64 experts are 2 groups, DeepSeek-V3's 256
// about 22), at least one, at most num_experts. The memory plan reserves
// Mxfp4DequantScratchBytes with --dtype mxfp4.
inline constexpr int64_t kMxfp4DequantScratchBoundBytes = int64_t{1} << 30;
inline int64_t Mxfp4DequantExpertBytes(int64_t hidden_size, int64_t inter) {
  return 3 * hidden_size * inter * static_cast<int64_t>(sizeof(uint16_t));  // gate_up and down
}
inline int64_t Mxfp4DequantGroupExperts(int64_t num_experts, int64_t hidden_size, int64_t inter,
                                        int64_t bound = kMxfp4DequantScratchBoundBytes) {
  const int64_t expert = Mxfp4DequantExpertBytes(hidden_size, inter);
  const int64_t fit = expert > 0 ? bound / expert : num_experts;
  return fit < 1 ? 1 : fit > num_experts ? num_experts : fit;
}
inline int64_t Mxfp4DequantScratchBytes(int64_t num_experts, int64_t hidden_size, int64_t inter,
                                        int64_t bound = kMxfp4DequantScratchBoundBytes) {
  return Mxfp4DequantGroupExperts(num_experts, hidden_size, inter, bound) *
         Mxfp4DequantExpertBytes(hidden_size, inter);
}

// Arguments of Backend::RoutedExperts: the routed-expert part of a MoE layer on one rank that
// hosts every expert, with the routing left on the device. Slot s of the tables holds expert s.
struct RoutedExpertsArgs {
  int32_t num_tokens = 0;
  int32_t top_k = 0;
  int32_t num_experts = 0;
  int64_t hidden_size = 0;
  int64_t inter = 0;                        // moe_intermediate_size
  const float* hidden = nullptr;            // [tokens, hidden_size]
  const int32_t* topk_ids = nullptr;        // [tokens, top_k], ascending within a token
  const float* topk_weights = nullptr;      // [tokens, top_k]
  const int32_t* slot_of_expert = nullptr;  // device [num_experts]: expert e's slot
  const void* const* gate_up = nullptr;     // device [num_experts] pointers, [2*inter, hidden] each
  const void* const* down = nullptr;        // device [num_experts] pointers, [hidden, inter] each
  // The same two tables in host memory (optional): a backend whose large-batch path needs the
  // pointers on the host reads them here instead of copying the device tables back.
  const void* const* gate_up_host = nullptr;
  const void* const* down_host = nullptr;
  WeightDType dtype = WeightDType::kFloat32;  // of the expert matrices
  // kFp8E4M3 experts (a backend that takes them: CUDA): device [num_experts] pointers to each
  // matrix's block scales (WeightView::fp8's layout; gate_up stacked at inter rows) and the scale
  // rows' stride shared by every expert's gate_up / down (Fp8BlockScales::scale_ld).
  const float* const* gate_up_scales = nullptr;
  const float* const* down_scales = nullptr;
  // The scale rows' stride for FP8 (above) and MXFP4 (below) experts.
  int64_t gate_up_scale_ld = 0;
  int64_t down_scale_ld = 0;
  bool fp8() const { return dtype == WeightDType::kFp8E4M3; }
  // kMxfp4E2M1 experts (CUDA): gate_up / down hold packed e2m1 bytes [rows, cols / 2], and these
  // device [num_experts] pointers their UE8M0 scales [rows, scale_ld] (one per 32 values along
  // cols; kernels/gemm/mxfp4_mma_gemm.h).
  const uint8_t* const* gate_up_mx_scales = nullptr;
  const uint8_t* const* down_mx_scales = nullptr;
  bool mxfp4() const { return dtype == WeightDType::kMxfp4E2M1; }
  float* out = nullptr;  // [tokens, hidden_size], overwritten
  // Stay on the device at any size (no host copy of the group sizes), as while recording: rows
  // padded to a capacity (ids -1) whose real count only the device knows.
  bool keep_on_device = false;
  // The shared experts, read only by Backend::RoutedAndSharedExperts (shared_inter 0: none):
  // one MLP of intermediate size shared_inter (n_shared_experts * moe_intermediate_size) in
  // `dtype`, gate rows then up rows.
  int64_t shared_inter = 0;
  const void* shared_gate_up = nullptr;  // [2*shared_inter, hidden_size]
  const void* shared_down = nullptr;     // [hidden_size, shared_inter]
  // kFp8E4M3: the shared matrices' block scales (WeightView::fp8 of each).
  Fp8BlockScales shared_gate_up_fp8;
  Fp8BlockScales shared_down_fp8;
  // The shared matrices as GEMM operands (with their block scales where `dtype` is FP8).
  WeightView SharedGateUp() const {
    return fp8() ? WeightView(shared_gate_up, shared_gate_up_fp8)
                 : WeightView(shared_gate_up, dtype);
  }
  WeightView SharedDown() const {
    return fp8() ? WeightView(shared_down, shared_down_fp8) : WeightView(shared_down, dtype);
  }
  // > 0: DeepSeek-V4's clamped SwiGLU (V4Ops::SwiGluClamped: silu(min(gate, limit)) *
  // clamp(up, -limit, limit)) in every expert, the shared ones included, instead of
  // silu(gate) * up. A backend without the clamp in a path returns false there.
  float swiglu_limit = 0.0f;
};

// Arguments of Backend::NormedDenseMlp: a dense MLP layer's input norm and MLP as one op,
// AddRmsNorm(rows, hidden_size, x, y, norm_weight, eps, normed, nullptr), then
// out = down(silu(gate) * up) of the normed rows.
struct DenseMlpArgs {
  int64_t rows = 0;
  int64_t hidden_size = 0;
  int64_t inter = 0;  // the MLP's intermediate size
  float* x = nullptr;
  const float* y = nullptr;  // optional (null: nothing added to x)
  const float* norm_weight = nullptr;
  float eps = 0.0f;
  float* normed = nullptr;  // [rows, hidden_size] fp32, written (the MLP's input)
  WeightView gate_up;       // [2 * inter, hidden_size], gate rows then up rows
  WeightView down;          // [hidden_size, inter]
  float* out = nullptr;     // [rows, hidden_size], overwritten after the norm read y (may be y)
};

// What Backend::Capture is recording.
struct CaptureOptions {
  // Tokens of the step being recorded (a decode graph's batch bucket); 0: not known.
  int64_t tokens = 0;
};

// Ops recorded once by Backend::Capture and issued again by Replay (a CUDA graph): the same
// kernels with the same arguments, reading and writing the same device addresses, so callers
// change what a replay computes only by writing new values into the buffers it reads.
class CapturedOps {
 public:
  virtual ~CapturedOps() = default;
  // Issues the recorded ops on the backend's stream, ordered after every op issued before it
  // (asynchronous like any op: copy results back, or Synchronize, to wait). An error launching
  // them is returned here; errors of the ops themselves show in Backend::status().
  virtual absl::Status Replay() = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // How this backend stores matrix weights (chosen when it is made: BackendOptions::dtype).
  virtual WeightDType weight_dtype() const = 0;

  // ---- Memory ------------------------------------------------------------------------------
  // Zero-initialised; never returns null (allocation failure is fatal, as for std::vector).
  virtual std::unique_ptr<DeviceBuffer> Allocate(size_t bytes) = 0;
  // A buffer whose contents are unspecified until written (no zeroing pass on a GPU): for
  // per-step temporaries that an op overwrites completely before anything reads them.
  virtual std::unique_ptr<DeviceBuffer> AllocateScratch(size_t bytes) { return Allocate(bytes); }
  virtual void CopyToDevice(const void* host, size_t bytes, void* device) = 0;
  virtual void CopyToHost(const void* device, size_t bytes, void* host) = 0;
  virtual void CopyDeviceToDevice(const void* src, size_t bytes, void* dst) = 0;
  // Blocks until every op issued so far has completed (no-op on the CPU).
  virtual void Synchronize() = 0;
  // Makes the calling thread's ops go to this backend's device (CUDA: cudaSetDevice): a thread
  // other than the one that made the backend calls it before its first op. No-op on the CPU.
  virtual void UseOnThisThread() {}
  // Staging memory for uploads (HostStagingBuffer); may be called from any thread. Never null.
  virtual std::unique_ptr<HostStagingBuffer> AllocateHostStaging(size_t bytes);
  // CopyToDevice that may return before the copy is done: `host` (a HostStagingBuffer's memory)
  // must stay unchanged until the next Synchronize(). Synchronous here and on the CPU.
  virtual void CopyToDeviceAsync(const void* host, size_t bytes, void* device) {
    CopyToDevice(host, bytes, device);
  }
  // The first error an op has hit since the backend was created (ops return nothing, and a GPU
  // reports errors asynchronously). Always OK on the CPU. Checked by the model after each step.
  virtual absl::Status status() const { return absl::OkStatus(); }
  // Total and free memory of the device (UNIMPLEMENTED on the CPU, which has no fixed budget).
  virtual absl::StatusOr<DeviceMemoryInfo> MemoryInfo() const {
    return absl::UnimplementedError(name() + " backend: no device memory to plan");
  }
  // Uploads n fp32 host values as a weight in weight_dtype() (bf16: rounded to nearest even).
  // The model loads every matrix weight through this; vectors (norms, biases) stay fp32.
  std::unique_ptr<DeviceBuffer> UploadWeight(const float* host, int64_t n);
  // Writes elements 0..n-1 of `fill` to out as `dtype` (bf16 rounded to nearest even, as
  // UploadWeight): a dummy-format weight made where it lives instead of generated on the host
  // and uploaded. This implementation computes the values on the host in slices and copies
  // them; the CUDA backend generates them in a kernel (the same bits).
  virtual void FillDummy(const DummyFill& fill, int64_t n, WeightDType dtype, void* out);
  // The native stream every op is issued on (a cudaStream_t for CUDA), for work that must be
  // ordered with the ops without going through this interface (NCCL collectives of a device
  // communicator); null on the CPU, whose ops complete before returning.
  virtual void* native_stream() const { return nullptr; }
  // The DeepSeek-V4 ops (v4_ops.h), or null on a backend that has none (the V4 model then
  // refuses to load on it).
  virtual V4Ops* v4_ops() { return nullptr; }

  // ---- Capture and replay ------------------------------------------------------------------
  // Whether Capture can be used now (CUDA: yes, except while per-op timing is on, which needs
  // every op to run on its own; CPU: never).
  virtual bool SupportsCapture() const { return false; }
  // Runs `record` while recording, instead of running, the ops it issues on this backend, and
  // returns them for replay. Buffers `record` allocates must be freed before it returns (they
  // then become part of the recording's own memory); it must not copy to or from the host,
  // synchronise, or depend on values computed by the ops it records, since none of them run.
  // Returns record's error if it fails, FAILED_PRECONDITION naming the cause if the ops could not
  // be recorded (e.g. an op that needs the host), UNIMPLEMENTED where SupportsCapture() is false.
  // Errors while recording do not reach status(): the backend stays usable.
  // `options` describe the step being recorded (backends may record differently by its size).
  virtual absl::StatusOr<std::unique_ptr<CapturedOps>> Capture(
      const std::function<absl::Status()>& record, const CaptureOptions& options) {
    return absl::UnimplementedError(name() + " backend: recording ops for replay is not supported");
  }
  absl::StatusOr<std::unique_ptr<CapturedOps>> Capture(
      const std::function<absl::Status()>& record) {
    return Capture(record, CaptureOptions{});
  }

  // ---- Dense math --------------------------------------------------------------------------
  // c[i, j] (+)= sum_p a[i, p] * w[j, p] for i < m, j < n, p < k. With a bf16 w, an fp32 a is
  // rounded to bf16 (a bf16 a already is) and the sum is accumulated in fp32. With accumulate,
  // each c[i, j] is c[i, j] + the sum, one fp32 addition (as Add would do it).
  virtual void Gemm(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda, WeightView w,
                    int64_t ldw, float* c, int64_t ldc, bool accumulate) = 0;
  // `batch` independent GEMMs with the layout of Gemm (no accumulate): product b reads
  // a + b*stride_a, w.Offset(b*stride_w) and writes c + b*stride_c (strides in elements; a bf16
  // a needs bf16 or fp32 w, and the CUDA backend bf16 w).
  // Used for the per-head W_uk / W_uv products of absorbed MLA (one launch for all heads) and
  // DeepSeek-V4's grouped output projection.
  virtual void BatchedGemm(int64_t batch, int64_t m, int64_t n, int64_t k, ActivationView a,
                           int64_t lda, int64_t stride_a, WeightView w, int64_t ldw,
                           int64_t stride_w, float* c, int64_t ldc, int64_t stride_c) = 0;
  // Rows of a [rows, k] split into consecutive groups; group g (rows offsets[g]..offsets[g+1])
  // is multiplied by weights[g] ([n, k]): c = a·W_gᵀ. offsets has weights.size() + 1 entries.
  virtual void GroupedGemm(const std::vector<int64_t>& offsets,
                           const std::vector<WeightView>& weights, int64_t n, int64_t k,
                           const float* a, float* c) = 0;
  // out[t] = sum over k of topk_weights[t, k] * expert_{topk_ids[t, k]}(hidden[t]), summed in k
  // order (as LocalExpertDispatcher::Combine does), without copying the routing to the host
  // (a backend may copy the per-expert row counts back for large batches). Returns false,
  // doing nothing, when the backend has no such path for these arguments; callers reach it
  // through ExpertsOnDevice (ops/moe_ops.h), whose refusal sends the caller through its
  // ExpertDispatcher and GroupedGemm.
  virtual bool RoutedExperts(const RoutedExpertsArgs& args) { return false; }
  // The whole MoE block in one op: out[t] = RoutedExperts's sum + the shared MLP of hidden[t]
  // (args.shared_*), within fp32 rounding of RoutedExperts then the model's shared-expert ops
  // (Gemm, SiluMul, Gemm, added after the routed sum). Returns false, doing nothing, when the
  // backend has no such path for these arguments (the default; the CPU backend keeps the ops
  // as the reference); ExpertsOnDevice (ops/moe_ops.h) then runs RoutedExperts and the MLP.
  virtual bool RoutedAndSharedExperts(const RoutedExpertsArgs& args) { return false; }
  // A dense MLP layer's post-attention norm and MLP in one op (DenseMlpArgs), within fp32
  // rounding of AddRmsNorm, Gemm, SiluMul, Gemm on fp32 activations. Returns false, doing
  // nothing, when the backend has no such path for these arguments (the default; the CPU
  // backend keeps the ops as the reference); NormedSwiGlu (ops/mlp_ops.h) then runs the ops.
  virtual bool NormedDenseMlp(const DenseMlpArgs& args) { return false; }
  // out[r, :] = x[r, :] / rms(x[r, :]) * weight (statistics in fp32). out may alias x.
  virtual void RmsNorm(int64_t rows, int64_t dim, const float* x, int64_t ldx, const float* weight,
                       float eps, float* out, int64_t ldout) = 0;
  // The residual add and the next norm in one op, over contiguous rows of width dim: when y is
  // not null, x += y (as Add); then out = RmsNorm(x) (as RmsNorm computes it) and out_bf16 = the
  // same values rounded to bf16 (a Gemm operand: ActivationView::Bf16). out and out_bf16 are
  // each optional (null: not written); neither may alias x or y.
  virtual void AddRmsNorm(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                          float eps, float* out, uint16_t* out_bf16) = 0;
  // AddRmsNorm's out_bf16 without y for rows of x at stride ldx (a column slice of a wider
  // matrix, only read), into contiguous out_bf16 [rows, dim]: the same values.
  virtual void RmsNormBf16(int64_t rows, int64_t dim, const float* x, int64_t ldx,
                           const float* weight, float eps, uint16_t* out_bf16) = 0;
  // AddRmsNorm(rows, dim, x, y, weight, eps, normed, normed_bf16), then for each g of gemms
  // Gemm(rows, g.n, dim, the normed rows (normed_bf16 if set, else normed), dim, g.w, g.ldw, g.c,
  // g.ldc, false): the GEMMs that read one norm's output (attention's q and kv_a projections).
  // Exactly one of normed / normed_bf16 is set; it is scratch: a backend that fuses the norm
  // into the GEMMs (the CUDA backend at decode sizes) may leave it unwritten. This default runs
  // the ops one by one.
  virtual void AddRmsNormGemms(int64_t rows, int64_t dim, float* x, const float* y,
                               const float* weight, float eps, float* normed, uint16_t* normed_bf16,
                               const std::vector<NormedGemm>& gemms);
  // out = a + b, elementwise over n values. out may alias a or b.
  virtual void Add(int64_t n, const float* a, const float* b, float* out) = 0;
  // out[r, i] = silu(x[r, i]) * x[r, inter + i]: x rows are [gate | up] of width 2*inter.
  virtual void SiluMul(int64_t rows, int64_t inter, const float* x, float* out) = 0;
  // SiluMul's values rounded to bf16 (bits), to feed a bf16 Gemm directly.
  virtual void SiluMulBf16(int64_t rows, int64_t inter, const float* x, uint16_t* out) = 0;
  // A SwiGLU MLP's gate_up Gemm (w [2*inter, k]) whose [rows, 2*inter] result is rounded to
  // bf16, as a bf16 nn.Linear rounds its output, then out[r, i] = bf16(silu(g) * u) from those
  // bf16 g = column i and u = column inter + i (as SiluMulBf16, with bf16 instead of fp32 input):
  // half the bytes of Gemm + SiluMulBf16 between the two. swiglu_limit > 0: DeepSeek-V4's clamped
  // SwiGLU (V4Ops::SwiGluClamped's clamps), g = min(g, limit) and u = clamp(u, -limit, limit)
  // before the product; <= 0 (0 by convention): no clamp. Returns false, having done nothing,
  // where the backend has no such path for these arguments (the default); GateUpSiluMulBf16
  // (ops/mlp_ops.h) then runs Gemm + SiluMulBf16 (whose gate / up are not rounded).
  virtual bool GateUpSiluMulBf16(int64_t rows, int64_t inter, int64_t k, ActivationView a,
                                 int64_t lda, WeightView w, int64_t ldw, float swiglu_limit,
                                 uint16_t* out) {
    return false;
  }
  // A SwiGLU MLP with bf16 operands as one op: out = down(act), or out += it with accumulate
  // (Gemm's accumulate), act [rows, inter] = GateUpSiluMulBf16 of h (ops/mlp_ops.h's: this
  // backend's GateUpSiluMulBf16 where it takes the rows, else Gemm then SiluMulBf16), down's
  // operand ActivationView::Bf16(act). h [rows, hidden] (row stride hidden), gate_up
  // [2 * inter, hidden] (ldw hidden), down [hidden, inter] (ldw inter), out [rows, hidden] (row
  // stride hidden). The same values as those ops one by one. Returns false, having done
  // nothing, where the backend has no such path (the default); SwiGlu (ops/mlp_ops.h) then runs
  // the ops.
  virtual bool SwiGluMlpBf16(int64_t rows, int64_t hidden, int64_t inter, ActivationView h,
                             WeightView gate_up, WeightView down, float* out, bool accumulate) {
    return false;
  }
  // Gemm (no accumulate) whose [m, n] result is rounded to bf16 (nearest even; bits) into c (row
  // stride ldc), as a bf16 nn.Linear rounds its output: half the bytes of an fp32 c for the op
  // that reads it. Returns false, having done nothing, where the backend has no such path for
  // these arguments (the default); the caller then runs Gemm.
  virtual bool GemmToBf16(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda,
                          WeightView w, int64_t ldw, uint16_t* c, int64_t ldc) {
    return false;
  }
  // BatchedGemm whose results are rounded to bf16 (bits) into c as GemmToBf16 rounds them: a
  // bf16 operand for the next Gemm (ActivationView::Bf16) with no fp32 c written, read and
  // rounded between the two. False, nothing done, where the backend has no such path (the
  // default); the caller then runs BatchedGemm.
  virtual bool BatchedGemmToBf16(int64_t batch, int64_t m, int64_t n, int64_t k, ActivationView a,
                                 int64_t lda, int64_t stride_a, WeightView w, int64_t ldw,
                                 int64_t stride_w, uint16_t* c, int64_t ldc, int64_t stride_c) {
    return false;
  }

  // ---- Embedding and permutation -----------------------------------------------------------
  // dst[r, :] = src[idx[r], :], rows of width dim.
  virtual void GatherRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                          float* dst) = 0;
  // dst[idx[r], :] += weight[r] * src[r, :]; rows are applied in order r = 0, 1, ...
  virtual void ScatterAddRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                              const float* weight, float* dst) = 0;

  // ---- Position encoding -------------------------------------------------------------------
  // Rotates x in place. Element (t, h, i) of the rotary slice is at
  // x[t*token_stride + h*head_stride + i], i < rope_dim. Angle of pair j at token t is
  // positions[t] * inv_freq[j]; cos/sin are multiplied by attention_factor (YaRN).
  // interleaved: pairs are (2j, 2j+1) (DeepSeek checkpoints); else (j, j + rope_dim/2).
  virtual void ApplyRope(int64_t tokens, int64_t heads, float* x, int64_t token_stride,
                         int64_t head_stride, int64_t rope_dim, const int32_t* positions,
                         const float* inv_freq, float attention_factor, bool interleaved) = 0;

  // ---- Attention ---------------------------------------------------------------------------
  // Writes each token's latent and rope key into its cache slot (slot = block*block_size+off),
  // rounded to nearest even when the cache is bf16, quantised as QuantizeFp8LatentEntry when it
  // is FP8.
  virtual void WriteLatentCache(int64_t tokens, const float* latent, int64_t ld_latent,
                                const float* rope_key, int64_t ld_rope, const int32_t* slots,
                                const PagedLatentCacheView& cache) = 0;
  // RmsNorm of each token's latent (kv[t, :latent_dim]), ApplyRope of its shared rope key
  // (kv[t, latent_dim:], one head) and of the query's q_heads rope slices (in place), and
  // WriteLatentCache of the normed latent and rotated key, in one op: the same values as those
  // four ops. kv is not changed.
  virtual void NormRopeWriteLatentCache(const NormRopeCacheArgs& args) = 0;
  // NormRopeWriteLatentCache(nr), then the absorbed query (AbsorbQueryArgs; its q_nope must not
  // overlap nr's query rope slices), as those two ops; nr.tokens tokens. The CUDA backend runs
  // both in one launch for a decode token (CudaBackend::NormRopeCacheAbsorbQuery).
  virtual void NormRopeCacheAbsorbQuery(const NormRopeCacheArgs& nr, const AbsorbQueryArgs& aq) {
    NormRopeWriteLatentCache(nr);
    BatchedGemm(aq.heads, nr.tokens, aq.latent_dim, aq.nope_dim, aq.q_nope, aq.q_token_stride,
                aq.q_head_stride, aq.w_uk, aq.nope_dim, aq.latent_dim * aq.nope_dim, aq.q_latent,
                aq.heads * aq.latent_dim, aq.latent_dim);
  }
  // Absorbed MLA: out[t, h] = sum_j softmax_j(scale * (q_latent·c_j + q_rope·k_j)) c_j, with
  // the cached c_j, k_j widened to fp32 (exact from bf16; FP8 as DequantizeFp8LatentEntry) and
  // fp32 math.
  // The CUDA backend with bf16 weights runs sequences of args.sequences with many new tokens on
  // bf16 tensor cores (docs/cuda/prefill.md); everything else is fp32.
  virtual void MlaAttention(const MlaAttentionArgs& args) = 0;
  // The context length up to which MlaAttention of `num_tokens` decode tokens runs another
  // kernel than above it, chosen by the longest context_len (from the sequences' spans where
  // given, else max_context_hint); 0: the choice does not depend on the context. A recorded
  // decode step must pass a hint <= this only for batches whose contexts all are <= it
  // (DecodeGraphRunner records one graph per side, see decode_graph_runner.h).
  virtual int32_t MlaDecodeContextBreak(int32_t num_tokens) const { return 0; }

  // Non-absorbed MLA prefill (MhaPrefillArgs). Returns false, doing nothing, when the backend
  // has no such path for these arguments (MlaAttentionOutput, ops/attention_ops.h, then runs
  // the absorbed MlaAttention). The
  // CPU computes it in fp32 (K / V from its Gemm); CUDA needs bf16 kv_b and rounds q, K, V and
  // the probabilities to bf16 (kernels/attention/mha_prefill.h). Spans that do not tile the
  // tokens: INVALID_ARGUMENT in status() (returns true).
  virtual bool MhaPrefillAttention(const MhaPrefillArgs& args) { return false; }

  // ---- MoE routing -------------------------------------------------------------------------
  virtual void NoauxTcRoute(const NoauxTcRouteArgs& args) = 0;
  // With args.norm set, AddRmsNorm of it first (the routed rows are then norm.out). Router
  // logits = Gemm(hidden, router_weight) (fp32), NoauxTcRoute of them, then
  // AccumulateExpertCounts of the choices when args.expert_counts is set. This implementation
  // issues exactly those ops (the reference); the CUDA backend runs small batches in one kernel
  // (its logits are fp32 sums in another order, so near-ties may choose differently).
  virtual void RouteTokens(const RouteTokensArgs& args);
  // Expert load statistics (EPLB): counts[ids[i]] += 1 for i in [0, n), on the device, so that
  // counting costs no host round-trip; the counts are read back only when a load window is
  // reported. Ids outside [0, num_experts) are not counted (the dispatcher reports them).
  // count_limit (optional, device memory): only ids[i] with i < *count_limit are counted, so a
  // replayed step of fixed size n can leave out its padding rows.
  virtual void AccumulateExpertCounts(int64_t n, const int32_t* ids, int64_t num_experts,
                                      const int32_t* count_limit, int64_t* counts) = 0;

  // ---- Sampling ----------------------------------------------------------------------------
  // Greedy sampling on the device: out[r] = argmax of logits row r (lowest index on ties).
  // Seeded temperature/top-k/top-p sampling: worker/sampling/sampler.h on host logits, or
  // SampleRows below on the device.
  virtual void ArgmaxRows(int64_t rows, int64_t vocab, const float* logits, int32_t* out) = 0;
  // Greedy sampling with the log-probability the engine reports: token[r] = argmax of row r
  // (lowest index on ties), logprob[r] = logits[r, token[r]] - logsumexp(row r), the normaliser
  // accumulated in double. Lets a decode step return rows × (int, float) instead of the logits.
  virtual void GreedySampleRows(int64_t rows, int64_t vocab, const float* logits, int32_t* token,
                                float* logprob) = 0;
  // Seeded sampling of every row with its own parameters, params[r] (device memory): token[r]
  // is the token Sampler::Sample picks for row r with params[r] (temperature, top-k, top-p,
  // seed, position; greedy when temperature <= 0), logprob[r] its log-softmax over the raw row.
  // The CPU backend calls Sampler itself; the CUDA kernel follows the same arithmetic (see
  // docs/cuda/graphs-and-sampling.md for where the two may still differ). A row whose top_p is
  // outside (0, 1] or whose temperature is NaN gets token -1 and a NaN logprob; a vocab outside [1,
  // 2^31) is an INVALID_ARGUMENT in status() and nothing is written. Logits must not be NaN.
  virtual void SampleRows(int64_t rows, int64_t vocab, const float* logits,
                          const RowSamplingParams* params, int32_t* token, float* logprob) = 0;
  // The n most likely tokens of every row (n in [1, kMaxTopLogprobs], else an INVALID_ARGUMENT
  // in status() and nothing written), as Sampler reports top_logprobs: ids[r * n + j] by logit
  // descending, lower id first on ties, logprobs[r * n + j] their log-softmax over the row.
  // Entries j >= vocab get id -1 and logprob -inf.
  virtual void TopLogprobsRows(int64_t rows, int64_t vocab, const float* logits, int32_t n,
                               int32_t* ids, float* logprobs) = 0;
  // logit_bias, min_tokens and penalties (worker/sampling/logit_adjustment.h), in place:
  // logits[a.row, a.token] = AdjustLogit(logits[a.row, a.token], a) for each of the n entries
  // (device memory). At most one entry per (row, token); entries outside [0, rows) x [0, vocab)
  // are skipped. count (optional, device memory): only entries i < *count are applied, so a
  // replayed decode step with room for n entries can use fewer. Bit-identical on every backend.
  virtual void AdjustLogits(int64_t rows, int64_t vocab, float* logits, int64_t n,
                            const LogitAdjustment* adjustments, const int32_t* count) = 0;
  // logprob[r] = logits[r, token[r]] - logsumexp(row r), the normaliser accumulated in double as
  // GreedySampleRows does: the raw log-probability of a token picked from adjusted logits. A
  // token outside [0, vocab) gets NaN.
  virtual void TokenLogprobRows(int64_t rows, int64_t vocab, const float* logits,
                                const int32_t* token, float* logprob) = 0;
  // Structured output (common/grammar): for i in [0, n), every token t of logits row rows[i]
  // whose bit is clear in masks[i * words + t / 32] (bit t % 32; words = (vocab + 31) / 32)
  // becomes -inf, in place, so the sampling ops above only pick allowed tokens. rows and
  // masks are device memory. The default copies the rows through the host; backends override
  // it with a kernel.
  virtual void MaskLogitsRows(int64_t n, int64_t vocab, float* logits, const int32_t* rows,
                              const uint32_t* masks);
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_BACKEND_H_
