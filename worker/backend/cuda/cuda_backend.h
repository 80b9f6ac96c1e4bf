// CudaBackend: Backend on one NVIDIA GPU. Buffers come from the stream-ordered allocator
// (cudaMallocAsync on the backend's one stream, with a pool that keeps freed memory, so the
// model's per-step temporaries do not go back to the driver every step); every op is issued
// on that stream; dense GEMMs go to cuBLAS, everything else to kernels/ (fp32).
//
// GEMMs: fp32 weights use cublasSgemm (no TF32); bf16 weights (the default) round the fp32
// activation operand to bf16 in a scratch buffer (kernels::RoundF32ToBf16) and call
// cublasGemmEx / cublasGemmStridedBatchedEx with bf16 inputs, fp32 output and
// CUBLAS_COMPUTE_32F (tensor cores, fp32 accumulation).
//
// Errors: the Backend ops return nothing, so the first CUDA or cuBLAS error is recorded (with
// the failing call named), logged, and returned by status(); CausalLm::Step checks it after
// each step. Later ops still run (their results are meaningless after an error), and a
// sticky device error such as an illegal address makes the whole context unusable, as usual in
// CUDA. Allocation failure is fatal, as the Backend contract says.
//
// Capture (CUDA graphs): the ops are recorded with cudaStreamBeginCapture in thread-local mode,
// instantiated once and replayed with cudaGraphLaunch. Buffers allocated while recording become
// graph memory nodes (the graph allocator's pool, GraphReservedBytes), and cuBLAS works in a
// fixed workspace of the backend (cublasSetWorkspace) so that it allocates nothing of its own
// and picks the same algorithms recorded and eager.
//
// Buffers from Allocate() must be destroyed before the backend (they free on its stream).
// Not thread-safe, like the model that drives it: one engine thread issues the ops, and that
// thread's current CUDA device must be device() (Create sets it for the calling thread).
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_CUDA_BACKEND_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_CUDA_BACKEND_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/gemm/batch_invariant_gemm.h"
#include "kernels/gemm/small_m_gemm.h"
#include "kernels/moe/expert_gemm_cublas.h"
#include "kernels/moe/moe_decode_fused.h"
#include "kernels/moe/moe_decode_fused_fp8.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda/cublaslt_fp8_gemm.h"
#include "worker/backend/cuda/cublaslt_gemm_tuner.h"

namespace deepinfer {

class CudaV4Ops;

struct CudaTuningDefaults {
  // fp8_gemm_bench --quick on the H200: from 32 rows W8A8 is the fastest FP8 path on most
  // Moonlight and V3 projections (Moonlight q_proj at 64 rows 10.9 us against 30.4 for the W8A16
  // all_rows tile), yet it stays at 128: from 32 rows Moonlight decodes 64 requests 1.12x bf16
  // instead of 0.84x, but the FP8 parity fixture's greedy agreement with HF falls from 67 to 63
  // of 72 (cuda_fp8_parity_test's bfloat16+w8a8 case; docs/performance.md, tried and rejected).
  static constexpr int64_t kFp8W8A8MinRows = 128;
  // FP8 Gemm rows from this many up to CudaTuning::fp8_w8a8_min_rows (exclusive) run the tiled
  // tensor-core kernel (kernels::Fp8TiledGemm) where it takes the operands, outside the
  // batch-invariant mode. fp8_gemm_bench --quick on the H200: at 32-256 rows faster than
  // kernels::Fp8MmaGemm on nearly every Moonlight and V3 projection (Moonlight q_proj at 64 rows
  // 11.2 us against 17.6, V3 dense gate_up at 128 rows 366 against 781), at 16 rows slower on
  // most (q_proj 8.7 against 6.2), so 16 rows stay on Fp8MmaGemm. Rows 17-31 are not measured
  // apart. Past fp8_w8a8_min_rows turns it off.
  static constexpr int64_t kFp8TiledMinRows = 17;
};

// The CUDA backend's settings, fixed when it is made (CudaBackend::Create). Every other choice
// the backend makes by shape, from measurements (the constants of CudaBackend and the kernels'
// own rules); there is no switch to the paths those measurements replaced (git history and
// docs/cuda.md, docs/kernels.md have them).
struct CudaTuning {
  // Gemm (bf16 weights) and GateUpSiluMulBf16 from CudaBackend::kGemmAutotuneMinRows rows
  // (prefill; never while the stream is captured), and the non-absorbed prefill's kv_b expansion,
  // through CublasLtGemmTuner: cuBLASLt with the fastest of its heuristic algorithms, timed at
  // each new shape's first call (a host synchronisation and ~8 x 4 GEMMs into the output itself,
  // a scratch one with accumulate; once per bucket of m). The 27-layer Moonlight prefill 32 x 1024
  // measured 0.3312 / 0.3323 s off, 0.3209 / 0.3245 s on (same call; docs/cuda/prefill.md); off:
  // cublasGemmEx. The timed pick can differ between processes (so can the GEMMs' bits): off for
  // run-to-run reproducible prefill (the worker's --gemm-autotune=false). It also decides whether
  // the FP8 W8A8 GEMMs' prefill shapes are timed (CublasLtFp8Gemm::Create's time_large_shapes).
  bool gemm_autotune = true;
  // The longest context (>= 1) at which one decode token's attention runs in the one-launch
  // kernel (kernels::MlaDecodeSmall); longer contexts run the key-split kernel. The H200's break
  // (mla_decode_small_bench, 1 token in a CUDA graph, against the key-split kernel + combine: 7.8
  // / 10.2 / 12.4 / 14.9 us at 512 / 1024 / 1536 / 2048 positions against 11.6-11.8 us, equal at
  // about 1.36K by interpolation); another GPU's may differ. Tests set a short one to cross it.
  int32_t mla_decode_small_max_context = 1280;
  // FP8 weights: from this many rows Gemm (and GateUpSiluMulBf16, the routed experts' prefill
  // GEMMs) quantises the activations to e4m3 per 128-wide block (kernels/gemm/fp8_quantize.h)
  // and runs cuBLASLt's block-scaled FP8 GEMM (W8A8 on FP8 tensor cores, compute capability 9.0
  // only); fewer rows keep bf16 activations against the exact weights (W8A16). The W8A8
  // activations are within 2^-4 relative (e4m3), against bf16's 2^-9: DeepSeek-V3's and HF
  // transformers' FP8 scheme. Tests that compare with bf16 references set it past their sizes.
  int64_t fp8_w8a8_min_rows = CudaTuningDefaults::kFp8W8A8MinRows;
  // FP8 routed experts on the device path (where kernels::Fp8MmaGroupedGemm runs them) from this
  // many tokens: the token rows and the SiLU-mul output quantised to e4m3 per row and 128-wide
  // block (kernels::Fp8QuantizeRows: the rows into their experts' places, the SiLU-mul in its
  // own pass) and both expert GEMMs on kernels::Fp8WgmmaSwapGroupedGemm
  // (W8A8 on Hopper wgmma, weights on the M side; compute capability 9.0), never in the
  // batch-invariant mode. The weights' TMA descriptors are built at an expert table's first call
  // outside a CUDA graph capture (a captured call before that keeps Fp8MmaGroupedGemm). 3: the
  // first size past the fused 1-2 token MoE block; Moonlight FP8 decode at 8 / 32 requests 1,637 /
  // 4,383 tok/s against 1,514 / 4,006 from 64 (docs/performance.md); tests set 1 to force it.
  int64_t fp8_swap_min_tokens = 3;
  // The swap path's gate_up (CudaBackend::RunFp8SwapGroups) written in bf16 (each fp32 result of
  // kernels::Fp8WgmmaSwapGroupedGemm rounded to nearest even) and the SiLU-mul quantisation
  // reading bf16 gate and up: half the bytes of fp32 rows written and read again, and the
  // numerics of the prefill experts (cuBLASLt's bf16 gate_up) and of the bf16 model's
  // GateUpSiluMulBf16, g and u rounded to bf16 before silu(g) * u. false (the default): fp32
  // gate_up rows (g and u exact, only the product rounded); on the H200 the bf16 rows' SiLU-mul
  // quantisation took 15.2 us against 10.4 from fp32 rows (1024 rows x 1408, fp8_quantize_bench)
  // while the GEMM's bf16 output saved at most 1 us. Tests flip it to check both against one
  // reference.
  bool fp8_swap_gate_up_bf16 = false;
  // Batch-invariant mode (deepinfer-worker / deepinfer-bench --batch-invariant,
  // DEEPINFER_BATCH_INVARIANT=1; docs/engine.md "Batch invariance"): every op computes a row the
  // same way whatever the batch size and the row's place in it, so a request's logprobs do not
  // depend on the requests batched with it. Each op keeps one path for all row counts (no
  // small-m, staged-GEMV, cuBLAS or fused-kernel choice by rows; no split chosen by the batch):
  //  * bf16 Gemm / BatchedGemm / GroupedGemm: kernels::BatchInvariantGemmPipelined (bf16 tensor
  //    cores, a rounded to bf16 first as in the default mode, a k split fixed by the shape), on
  //    devices without its sm_90 clusters kernels::BatchInvariantGemmTc, and
  //    kernels::BatchInvariantGemmWarp for fp32 weights and layouts neither takes; FP8 Gemm:
  //    kernels::Fp8MmaGemm
  //    with a fixed k split (kBatchInvariantFp8KSplit; its tile by rows as below, every tile
  //    giving the same bits at a fixed split), else the weight dequantised to bf16;
  //  * AddRmsNormGemms, GateUpSiluMulBf16, SwiGluMlpBf16, NormedDenseMlp,
  //    RoutedAndSharedExperts, NormRopeCacheAbsorbQuery, MhaPrefillAttention: the Backend's
  //    separate ops;
  //  * RouteTokens: AddRmsNorm + kernels::RouteTokensF32 at every token count, in calls of at
  //    most kernels::kMaxFusedRouterTokens tokens (each logit summed in one order for every
  //    tile and token count; the counts in the call, or after the calls in one
  //    AccumulateExpertCounts);
  //  * RoutedExperts: the device path for every batch, the expert GEMMs on
  //    kernels::Bf16MmaGroupedGemm with a fixed k split (kBatchInvariantBf16KSplit) and the
  //    activations in bf16 (as the default mode's cuBLAS expert GEMMs take them; bf16 weights)
  //    or kernels::Fp8MmaGroupedGemm with the fixed k split (FP8); fp32 experts are declined
  //    (the caller's per-expert GroupedGemm, on the batch-invariant Gemm);
  //  * MlaAttention: kernels::MlaAttentionF32 for every token (prefill too) with
  //    kBatchInvariantMlaSplits context splits and kernel kBatchInvariantMlaVariant (no
  //    one-launch decode kernel, no tensor-core prefill).
  //  * V4 sink attention (CudaV4Ops): kBatchInvariantSinkSplits splits; V4's other kernels
  //    (indexer, compression, hyper-connections, its router) keep their defaults, not checked.
  // Sampling, norms, rope, permutation and combine already compute each row on its own.
  // Off: the choices by shape described at each op (different bits at different batch sizes).
  bool batch_invariant = false;
  // MXFP4 routed experts on the device path from mxfp4_w4a8_min_tokens to mxfp4_w4a8_max_tokens
  // tokens (inclusive; min 0: never), outside the batch-invariant mode, where the device has the
  // kernel (sm_89+): W4A8, the token rows and the SiLU-mul output quantised to e4m3 per row and
  // 128-wide block (kernels::Fp8QuantizeRows, the token rows into their experts' places) and both
  // expert GEMMs on kernels::Mxfp4W4a8GroupedGemm (FP8 tensor cores); other sizes keep bf16
  // activations (kernels::Mxfp4MmaGroupedGemm, W4A16). The activations are then within 2^-4
  // relative (e4m3) instead of bf16's 2^-9, as the FP8 experts' W8A8 path. 3: the first size past
  // the fused 1-2 token MoE block, as fp8_swap_min_tokens. Tests set 0 to keep W4A16.
  int64_t mxfp4_w4a8_min_tokens = 3;
  int64_t mxfp4_w4a8_max_tokens = 128;
  // On the W4A8 path above: true runs each expert GEMM whose weights fit on
  // kernels::Mxfp4WgmmaSwapGroupedGemm (swap-AB wgmma, e2m1 widened to e4m3 in registers; compute
  // capability 9.0, k a multiple of 128, the scale rows' stride a multiple of 4, the host pointer
  // tables given, every 128-wide k block of every expert within the kernel's exponent bound,
  // checked once per weight table outside a capture); a GEMM that does not fit stays on
  // kernels::Mxfp4W4a8GroupedGemm. The same products; the sums in another order. On the H200
  // (fp8_gemm_bench --grouped, Moonlight gate_up) the swap kernel took 58 / 90 / 109 us at 8 / 32
  // / 128 tokens against Mxfp4W4a8GroupedGemm's 117 / 188 / 261 and the W4A16
  // Mxfp4MmaGroupedGemm's 72 / 109 / 176. false: W4A8 only.
  bool mxfp4_wgmma_swap = true;
  // The bound of RoutedExperts' bf16 copies of MXFP4 experts (Mxfp4DequantGroupExperts,
  // backend.h); the memory plan reserves for the default. Tests lower it to run several groups.
  int64_t mxfp4_dequant_scratch_bytes = kMxfp4DequantScratchBoundBytes;
};

class CudaBackend : public Backend {
 public:
  // Uses GPU `device`; FAILED_PRECONDITION if there is no such device, INVALID_ARGUMENT for a
  // tuning out of range (mla_decode_small_max_context < 1), INTERNAL for other CUDA or cuBLAS
  // setup errors.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      int device = 0, WeightDType weight_dtype = WeightDType::kBFloat16,
      const CudaTuning& tuning = CudaTuning());
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  WeightDType weight_dtype() const override { return weight_dtype_; }
  const CudaTuning& tuning() const { return tuning_; }
  std::unique_ptr<DeviceBuffer> Allocate(size_t bytes) override;
  std::unique_ptr<DeviceBuffer> AllocateScratch(size_t bytes) override;
  // Returns once `host` may be reused: from ordinary (pageable) memory the runtime stages the
  // data before returning. Pinned host memory would be read later; callers keep none.
  void CopyToDevice(const void* host, size_t bytes, void* device) override;
  // Synchronises the stream: the host data is complete when this returns.
  void CopyToHost(const void* device, size_t bytes, void* host) override;
  // src and dst must not overlap (cudaMemcpy semantics; the model never overlaps them).
  void CopyDeviceToDevice(const void* src, size_t bytes, void* dst) override;
  void Synchronize() override;
  void UseOnThisThread() override;
  // Page-locked (cudaHostAlloc, portable: any thread's context may copy from it); falls back to
  // pageable memory, logged once, where page-locking fails.
  std::unique_ptr<HostStagingBuffer> AllocateHostStaging(size_t bytes) override;
  // cudaMemcpyAsync on the stream without waiting: from page-locked memory it runs after the
  // stream's earlier work, on the copy engine.
  void CopyToDeviceAsync(const void* host, size_t bytes, void* device) override;
  // cudaMemGetInfo of device().
  absl::StatusOr<DeviceMemoryInfo> MemoryInfo() const override;

  // bf16 weights and one row, or up to kernels::kSmallMGemmMaxRows rows and at most
  // kSmallMGemmMaxColumnsAboveOneRow columns (decode): kernels::SmallMGemmBf16 (one launch,
  // reads an fp32 a and rounds it as it goes; its layout by k, kernels::SmallMGemmAlgo::kAuto)
  // where it takes the operands, or kernels::StagedGemvBf16 at one or two rows where
  // kernels::StagedGemvPreferredAtOneRow / AtTwoRows (measured faster); otherwise cuBLAS, after
  // rounding an fp32 a to bf16 (a bf16 a goes to cuBLAS as it is). Same for BatchedGemm, whose
  // one-row batches take the staged GEMV's batch where
  // kernels::StagedGemvPreferredBatchedAtOneRow (DeepSeek-V4's grouped o_a).
  // FP8 weights (WeightView::fp8), by rows (each path where it takes the operands, else the next):
  //  * from CudaTuning::fp8_w8a8_min_rows on compute capability 9.0: W8A8, the activations
  //    quantised (kernels::Fp8QuantizeRows) and cuBLASLt's block-scaled FP8 GEMM
  //    (CublasLtFp8Gemm; rows padded to a multiple of 4 through scratch);
  //  * from CudaTuningDefaults::kFp8TiledMinRows: kernels::Fp8TiledGemm (bf16 tensor cores,
  //    block tiles staged in shared memory, the FP8 weight widened in registers; fp32 rows
  //    rounded to bf16 in scratch first, its k split's partial sums in scratch);
  //  * above kFp8CudaCoreMaxRows: kernels::Fp8MmaGemm (bf16 tensor cores, the FP8 weight
  //    widened in registers) with the tile kernels::Fp8MmaDenseTile picks for the rows;
  //  * up to kFp8SmallMGemmMaxRows: kernels::Fp8SmallMGemm (CUDA cores, the weight read once per
  //    8 rows);
  //  * otherwise the weight dequantised to bf16 in scratch (kernels::Fp8DequantToBf16) for the
  //    bf16 cuBLAS path.
  // Phases in the op timing report: Gemm/fp8-w8a8, Gemm/fp8-tiled, Gemm/fp8-mma,
  // Gemm/fp8-small-m, Gemm/fp8-dequant-bf16.
  void Gemm(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda, WeightView w,
            int64_t ldw, float* c, int64_t ldc, bool accumulate) override;
  // Not measured yet (fp8_block_gemm_bench prints both): one row stays on the CUDA-core kernel,
  // whose FMAs cost no more than the tensor-core kernel's widening at one row.
  static constexpr int64_t kFp8CudaCoreMaxRows = 1;
  // The CUDA-core kernel's limit where the tensor-core one does not take the operands (k not a
  // multiple of 16, unaligned rows): it reads the weight once per 8 rows.
  static constexpr int64_t kFp8SmallMGemmMaxRows = 32;
  // CudaTuning::batch_invariant: kernels::Fp8MmaGemm's and Fp8MmaGroupedGemm's warps per k
  // (one: each output's sum over k in one warp, in order).
  static constexpr int32_t kBatchInvariantFp8KSplit = 1;
  // CudaTuning::batch_invariant: kernels::Bf16MmaGroupedGemm's warps per k (the routed experts'
  // bf16 GEMMs), as kBatchInvariantFp8KSplit.
  static constexpr int32_t kBatchInvariantBf16KSplit = 1;
  // CudaTuning::batch_invariant: MlaAttentionF32's context splits per (token, head group), fixed
  // (the default picks them from the token count). 2 is what the default picks at 128 decode
  // tokens of 16 heads on the H200 (132 SMs x 2 blocks per SM; 2-3 splits merge inside a
  // thread-block cluster).
  static constexpr int32_t kBatchInvariantMlaSplits = 2;
  // CudaTuning::batch_invariant: MlaAttentionF32's kernel for every token count (the key-split
  // kernel, mma_variant 9: the default takes the 64-head wgmma kernel from 16 tokens).
  static constexpr int32_t kBatchInvariantMlaVariant = 9;
  // CudaTuning::batch_invariant: V4 sink attention's splits of each token's rows
  // (CudaV4Ops::SinkAttention), fixed as kBatchInvariantMlaSplits.
  static constexpr int32_t kBatchInvariantSinkSplits = 2;
  // While recording a graph with programmatic dependent launch on (kernels/common/pdl.h),
  // scratch allocations of at most kMaxAsideAllocationBytes are captured beside the kernel chain
  // (kernels/common/capture_deps.h), so that a memory node does not sit between two kernels and
  // break their programmatic edge, in recordings of at most kAsideMaxTokens tokens
  // (CaptureOptions::tokens): +1.5-2% at one request, ~47 MB of graph memory per recorded
  // 27-layer step; 2 requests measured ~1% slower with it, and every recording 2.03 GiB of graph
  // memory at 64 and 128 requests for no gain. Such graph memory is not reused within the graph
  // (each recorded step holds all its small temporaries at once), and it is not counted in
  // DecodeGraphReserveBytes.
  static constexpr size_t kMaxAsideAllocationBytes = 64 * 1024;
  static constexpr int64_t kAsideMaxTokens = 1;
  // With more than one row, the small-m kernel only up to this many output columns.
  static constexpr int64_t kSmallMGemmMaxColumnsAboveOneRow = 4096;
  // The most activation rows the staged GEMV takes. At one row AddRmsNormGemms with bf16 weights
  // is one launch per kernels::kStagedGemvMaxTargets GEMMs (the norm computed by every block as
  // it stages the activation, x += y written once, by the first; the normed scratch left
  // unwritten); at two rows it is AddRmsNorm, then one staged
  // launch for all its GEMMs where kernels::StagedGemvPreferredAtTwoRows.
  static constexpr int64_t kStagedGemvMaxRows = 2;
  void AddRmsNormGemms(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                       float eps, float* normed, uint16_t* normed_bf16,
                       const std::vector<NormedGemm>& gemms) override;
  void BatchedGemm(int64_t batch, int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda,
                   int64_t stride_a, WeightView w, int64_t ldw, int64_t stride_w, float* c,
                   int64_t ldc, int64_t stride_c) override;
  // One cuBLAS call per non-empty group (correctness first; a grouped GEMM is the next step);
  // with bf16 weights the activations are rounded once for all groups.
  void GroupedGemm(const std::vector<int64_t>& offsets, const std::vector<WeightView>& weights,
                   int64_t n, int64_t k, const float* a, float* c) override;
  // Any batch, bf16 or fp32 experts, one rank hosting them (up to kernels::kMaxMoeSlots):
  // device permutation (kernels::MoePermuteF32), expert GEMMs, SiLU-mul, and the per-token
  // gather combine (kernels::MoeCombineF32, k order, no atomics, overwriting out). The expert
  // GEMMs:
  //  * bf16 and at most kMaxFusedMoeTokens tokens (decode), or any bf16 batch while the stream
  //    is being captured into a CUDA graph: the device path (DecodeMoeAlgoFor), which reads the
  //    group sizes on the device: no host synchronisation (capturable in a CUDA graph);
  //  * otherwise: cuBLAS tensor-core GEMMs (kernels::ExpertGemmsCublas: each expert's rows in
  //    fixed chunks, all chunks in one batched call; one GEMM per expert where cuBLAS refuses
  //    the batched call), after
  //    ONE device-to-host copy of the group sizes; activations rounded to bf16 for bf16
  //    weights, as in Gemm, and with bf16 weights both GEMMs write bf16 (kernels::SiluMulBf16
  //    between them, the combine reads bf16), as a bf16 PyTorch model rounds each Linear.
  // FP8 experts (args.fp8()): the same permutation and combine around the expert
  // GEMMs: up to kMaxFusedMoeTokens tokens, or any batch while captured, without host
  // synchronisation: kernels::Fp8MmaGroupedGemm on bf16 rows (gate_up fp32, SiluMulF32ToBf16,
  // down; tile kernels::kGroupedMmaTile), or kernels::Fp8GroupedGemm on fp32 rows where the
  // tensor-core kernel is not built or hidden_size / inter are not multiples of 16; larger batches
  // with the host pointer tables copy the group sizes back (rows aligned to 4 per expert) and run
  // W8A8 where cuBLASLt takes it (RoutedExpertsFp8W8A8: each token row quantised once into its
  // experts' rows, one GEMM per busy expert, bf16 intermediates as the bf16 cuBLAS path), else
  // each expert's rows through Gemm's FP8 paths. MXFP4 experts
  // (args.mxfp4()): the same permutation (bf16 rows) and combine around
  // kernels::Mxfp4MmaGroupedGemm (tile kernels::kGroupedMmaTile) for gate_up and down up to
  // kMxfp4MaxDeviceTokens tokens, or any batch while captured or with keep_on_device, without
  // host synchronisation (capturable); larger batches: the bf16 experts' cuBLAS path, the
  // experts widened to bf16 (kernels::Mxfp4DequantToBf16) a group at a time into scratch
  // (Mxfp4DequantGroupExperts, backend.h), each group's rows through the same gate_up /
  // SiLU-mul / down (phase RoutedExpertsCublas/mxfp4_dequant for the widening).
  // args.swiglu_limit (V4's clamp) in every SiLU-mul of the bf16 / fp32 / MXFP4 paths; FP8
  // experts with a clamp are refused (false).
  bool RoutedExperts(const RoutedExpertsArgs& args) override;
  // Taken for bf16 weights, tokens whose decode algorithm is kGroupedF32 (DecodeMoeAlgoFor),
  // shared_inter a positive multiple of inter, and the size DecodeMoeFusedFor allows:
  // kernels::MoeDecodeFusedF32, two launches reading the routing on the device (no permutation,
  // gather, separate SiLU-mul, combine or shared-expert GEMMs; activations fp32 throughout,
  // also for the shared MLP). FP8 experts: RoutedAndSharedExpertsFp8 (the fused decode kernel
  // at DecodeMoeFusedFor's sizes, else the swap kernel with the shared MLP as extra groups).
  // Otherwise false.
  bool RoutedAndSharedExperts(const RoutedExpertsArgs& args) override;
  // Taken (measured faster: the 27-layer decode at one request 2.3694 -> 2.3624 ms) for one row,
  // bf16 weights, hidden_size and inter multiples of 8 and a 16-byte aligned `normed`: AddRmsNorm
  // (fp32 output only), then kernels::MoeDecodeFusedF32 with no routed experts and the MLP as one
  // shared part of the whole intermediate: two launches instead of the gate_up GEMV, SiluMulBf16
  // and the down GEMV, activations fp32 throughout (the ops round the normed row and the SiLU-mul
  // output to bf16). Otherwise false.
  bool NormedDenseMlp(const DenseMlpArgs& args) override;
  // Whether RoutedAndSharedExperts takes `tokens` tokens: where it measured faster than
  // RoutedExperts + the shared-expert ops (moe_block_decode_bench, H200,
  // docs/kernels/moe-decode.md): one token at any width and two at hidden_size <=
  // kMaxFusedMoeHidden (Moonlight's 2048: faster; V3's 7168: not faster at two).
  static bool DecodeMoeFusedFor(int64_t tokens, int64_t hidden_size);
  static constexpr int64_t kMaxFusedMoeHidden = 4096;
  // The chunked cuBLAS GEMMs were faster from 128 tokens on (the smallest size measured,
  // docs/kernels/moe-decode.md); decode batches up to here keep the path without host
  // synchronisation.
  static constexpr int32_t kMaxFusedMoeTokens = 128;
  // MXFP4 experts: above this many tokens (and not captured, not keep_on_device) the cuBLAS path
  // on experts widened to bf16. The bf16 experts' boundary (kMaxFusedMoeTokens), not yet measured
  // for MXFP4: the grouped kernel reads a quarter of bf16's weight bytes, while the widening
  // writes and rereads a layer's experts in bf16, so the crossover may lie at more tokens.
  static constexpr int32_t kMxfp4MaxDeviceTokens = kMaxFusedMoeTokens;
  // The expert GEMMs of RoutedExperts' device path (no host synchronisation), picked by size
  // (DecodeMoeAlgoFor; grouped_gemm_bench and moe_decode_bench on the H200,
  // docs/kernels/moe-decode.md):
  //  kGroupedF32:    kernels::GroupedGemmBf16 on fp32 activations (CUDA cores for 1-2 rows per
  //                  expert, tensor cores with x split into bf16 hi + lo above), up to 2 tokens;
  //  kPlannedCublas: kernels::PlanExpertGemmBatches + one cublasGemmBatchedEx per GEMM over
  //                  chunks of PlannedChunkRows rows (bf16 activations, padded layout; the
  //                  dummy entries spread between the real chunks; gate_up written in bf16,
  //                  kernels::SiluMulBf16ListedRows over the real rows, down in fp32), above.
  enum class DecodeMoeAlgo { kGroupedF32, kPlannedCublas };
  static DecodeMoeAlgo DecodeMoeAlgoFor(int64_t tokens);
  // Rows per chunk of kPlannedCublas for `tokens` tokens: 8 up to 32 tokens
  // (grouped_gemm_bench), 48 above (the 27-layer Moonlight bench, one fixed batch: 48 faster
  // than 32 at 64 and 128 requests; docs/kernels/moe-decode.md). Never depends on whether the
  // stream is captured, so a replayed decode graph computes the same bits as the same step run
  // eagerly.
  static int32_t PlannedChunkRows(int64_t tokens);
  void RmsNorm(int64_t rows, int64_t dim, const float* x, int64_t ldx, const float* weight,
               float eps, float* out, int64_t ldout) override;
  void Add(int64_t n, const float* a, const float* b, float* out) override;
  void AddRmsNorm(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                  float eps, float* out, uint16_t* out_bf16) override;
  void RmsNormBf16(int64_t rows, int64_t dim, const float* x, int64_t ldx, const float* weight,
                   float eps, uint16_t* out_bf16) override;
  void SiluMul(int64_t rows, int64_t inter, const float* x, float* out) override;
  void SiluMulBf16(int64_t rows, int64_t inter, const float* x, uint16_t* out) override;
  // From kBf16GateUpMinRows rows (prefill; decode batches keep Gemm + SiluMulBf16 and their
  // graphs) with bf16 weights: one cuBLAS GEMM with a bf16 output (fp32 accumulation, rounded once
  // by its epilogue), then kernels::SiluMulBf16 (with the clamp where swiglu_limit > 0). FP8
  // weights: the W8A8 GEMM with a bf16 output where Gemm would take it, else the same on the
  // weight dequantised to bf16 (DequantizeToBf16); FP8 weights with swiglu_limit > 0 are refused
  // (InvalidArgument in status(), false): the only clamped caller, DeepSeek-V4, loads every
  // matrix dequantised (worker/model/deepseek_v4/v4_weights.h).
  bool GateUpSiluMulBf16(int64_t rows, int64_t inter, int64_t k, ActivationView a, int64_t lda,
                         WeightView w, int64_t ldw, float swiglu_limit, uint16_t* out) override;
  static constexpr int64_t kBf16GateUpMinRows = 512;
  // From kBf16GateUpMinRows rows with bf16 weights, outside batch-invariant mode: one cuBLAS GEMM
  // with a bf16 output (fp32 accumulation, rounded once by its epilogue; an fp32 a rounded to
  // bf16 first, as Gemm rounds it).
  // FP8 gate_up and down at W8A8 rows (cuda_backend_w8a8.cc): gate_up on GemmFp8W8A8 (fp32, or
  // bf16 from kBf16GateUpMinRows rows as GateUpSiluMulFp8), the SiLU-mul rounded to bf16 and
  // quantised in one pass (kernels::Fp8QuantizeRows' silu_mul mode: the operand down's
  // GemmFp8W8A8 would quantise), down on it.
  bool SwiGluMlpBf16(int64_t rows, int64_t hidden, int64_t inter, ActivationView h,
                     WeightView gate_up, WeightView down, float* out, bool accumulate) override;
  bool GemmToBf16(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda, WeightView w,
                  int64_t ldw, uint16_t* c, int64_t ldc) override;
  // The same conditions (m rows a product): cublasGemmStridedBatchedEx with a bf16 output.
  bool BatchedGemmToBf16(int64_t batch, int64_t m, int64_t n, int64_t k, ActivationView a,
                         int64_t lda, int64_t stride_a, WeightView w, int64_t ldw, int64_t stride_w,
                         uint16_t* c, int64_t ldc, int64_t stride_c) override;
  // The smallest m that CudaTuning::gemm_autotune sends through the cuBLASLt tuner.
  static constexpr int64_t kGemmAutotuneMinRows = 1024;
  // Shapes the tuner has an algorithm for (0 before the first tuned call).
  size_t gemm_autotuned_shapes() const { return lt_tuner_ != nullptr ? lt_tuner_->shapes() : 0; }
  void FillDummy(const DummyFill& fill, int64_t n, WeightDType dtype, void* out) override;
  // kernels::NormRopeWriteLatentCacheF32: one launch.
  void NormRopeWriteLatentCache(const NormRopeCacheArgs& args) override;
  // With bf16 W_uk, up to kNormRopeCacheAbsorbMaxTokens tokens and params
  // kernels::NormRopeCacheAbsorbQuerySupported takes: kernels::NormRopeCacheAbsorbQueryF32, one
  // launch with the bits of the two ops (the W_uk product as SmallMGemmBf16 computes it); otherwise
  // Backend's two ops. Measured on the H200 at 1 request: 27-layer decode step -29 us
  // (docs/cuda/bf16-and-kv-cache.md, "The attention core's launch chain at one token"); 2-4 tokens
  // give the same bits but were not timed, so they keep two launches.
  void NormRopeCacheAbsorbQuery(const NormRopeCacheArgs& nr, const AbsorbQueryArgs& aq) override;
  static constexpr int64_t kNormRopeCacheAbsorbMaxTokens = 1;
  void GatherRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                  float* dst) override;
  void ScatterAddRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                      const float* weight, float* dst) override;
  void ApplyRope(int64_t tokens, int64_t heads, float* x, int64_t token_stride, int64_t head_stride,
                 int64_t rope_dim, const int32_t* positions, const float* inv_freq,
                 float attention_factor, bool interleaved) override;
  void WriteLatentCache(int64_t tokens, const float* latent, int64_t ld_latent,
                        const float* rope_key, int64_t ld_rope, const int32_t* slots,
                        const PagedLatentCacheView& cache) override;
  // Sequences of args.sequences for which UsesTensorCoreAttention holds go to
  // kernels::MlaPrefillBf16 (bf16 tensor cores), the other tokens to kernels::MlaAttentionF32
  // (fp32; decode). Without args.sequences, all to MlaAttentionF32. INVALID_ARGUMENT in status()
  // when the spans do not tile the tokens.
  void MlaAttention(const MlaAttentionArgs& args) override;
  // kernels::MhaPrefillBf16 with bf16 kv_b on a device and shapes it takes (false otherwise):
  // the flash kernel by the sequences' lengths (kernels::MhaFlashKernel::kAuto), the group's
  // cache entries gathered in one launch and the kv_b expansion GEMM through the cuBLASLt tuner
  // (GemmOnCublasLt: with CudaTuning::gemm_autotune, outside graph capture, from
  // kGemmAutotuneMinRows keys; else cublasGemmEx).
  bool MhaPrefillAttention(const MhaPrefillArgs& args) override;
  // With bf16 weights (the fp32 model keeps fp32 attention), a sequence with at least
  // kMlaPrefillMinTokens new tokens and kMlaPrefillMinWork (new tokens x context) query-key
  // pairs. Measured on the H200 (docs/cuda/prefill.md): one 64-token prompt (4096 pairs) is faster
  // on the fp32 kernel (31 vs 41 us), a 128-token one (16384) on tensor cores (48 vs 35 us), and 16
  // new tokens after 2048 cached (33024) too (85 vs 37 us).
  bool UsesTensorCoreAttention(const MlaSequenceSpan& s) const;
  static constexpr int32_t kMlaPrefillMinTokens = 16;
  static constexpr int64_t kMlaPrefillMinWork = 16384;
  // A batch of kMlaDecodeSmallMaxTokens (1) token without prefill spans whose context is at most
  // CudaTuning::mla_decode_small_max_context goes to kernels::MlaDecodeSmall (one launch, no
  // workspace; over an FP8 cache it reads the entries itself, without the bf16 copy) where it
  // takes the shape; longer (or unknown: no spans and no max_context_hint) contexts and
  // more tokens to MlaAttentionF32. Measured on the H200 (docs/cuda/bf16-and-kv-cache.md,
  // "Few-token decode kernel"): the one-launch kernel wins at short contexts and loses at long ones
  // (its work per key is fp32 CUDA-core instructions), and with 2-8 tokens loses at 4096 by up to
  // 2x. Decode graphs learn the break from MlaDecodeContextBreak and record one graph per side.
  static constexpr int32_t kMlaDecodeSmallMaxTokens = 1;
  int32_t MlaDecodeContextBreak(int32_t num_tokens) const override;
  void NoauxTcRoute(const NoauxTcRouteArgs& args) override;
  // Up to kFusedRouterMaxTokens tokens (batch-invariant mode: any number, in calls of at most
  // kernels::kMaxFusedRouterTokens) and arguments kernels::RouteTokensSupported takes:
  // AddRmsNorm (args.norm), then kernels::RouteTokensF32, logits, routing and counts in one
  // launch; otherwise Backend's AddRmsNorm (args.norm) + Gemm (cuBLAS) + NoauxTcRoute +
  // AccumulateExpertCounts.
  void RouteTokens(const RouteTokensArgs& args) override;
  // noaux_tc_router_bench (H200, Moonlight shape, in a CUDA graph): the one launch took 5.6 /
  // 6.1 / 8.2 / 10.5 us a layer at 1 / 8 / 64 / 128 tokens against 8.4 / 11.8 / 12.7 / 12.9 us
  // for the three ops, but 15.4 against 13.4 us at 256.
  static constexpr int32_t kFusedRouterMaxTokens = 128;
  void AccumulateExpertCounts(int64_t n, const int32_t* ids, int64_t num_experts,
                              const int32_t* count_limit, int64_t* counts) override;
  void ArgmaxRows(int64_t rows, int64_t vocab, const float* logits, int32_t* out) override;
  void GreedySampleRows(int64_t rows, int64_t vocab, const float* logits, int32_t* token,
                        float* logprob) override;
  void SampleRows(int64_t rows, int64_t vocab, const float* logits, const RowSamplingParams* params,
                  int32_t* token, float* logprob) override;
  void MaskLogitsRows(int64_t n, int64_t vocab, float* logits, const int32_t* rows,
                      const uint32_t* masks) override;
  void TopLogprobsRows(int64_t rows, int64_t vocab, const float* logits, int32_t n, int32_t* ids,
                       float* logprobs) override;
  void AdjustLogits(int64_t rows, int64_t vocab, float* logits, int64_t n,
                    const LogitAdjustment* adjustments, const int32_t* count) override;
  void TokenLogprobRows(int64_t rows, int64_t vocab, const float* logits, const int32_t* token,
                        float* logprob) override;
  // CudaV4Ops (cuda_v4_ops.h): the V4 kernels of kernels/v4 on this backend's stream.
  V4Ops* v4_ops() override;

  // The first error any op has hit (OK if none).
  absl::Status status() const override;

  // False while op timing is on (a replay would not time its ops one by one).
  bool SupportsCapture() const override { return !op_timing_; }
  using Backend::Capture;
  absl::StatusOr<std::unique_ptr<CapturedOps>> Capture(const std::function<absl::Status()>& record,
                                                       const CaptureOptions& options) override;
  // Scratch allocations recorded beside the kernel chain so far (kAsideMaxTokens).
  int64_t AsideAllocations() const {
    absl::MutexLock lock(&mu_);
    return aside_allocations_;
  }
  // Bytes the CUDA graph allocator holds now and at most (cudaGraphMemAttrReservedMem*): the
  // activations of captured graphs, kept apart from ReservedBytes' pool.
  absl::StatusOr<size_t> GraphReservedBytes(bool high_water_mark) const;
  static constexpr size_t kCublasWorkspaceBytes = size_t{32} << 20;

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  void* native_stream() const override { return stream_; }
  // Bytes the allocator holds from the driver now and at most (cudaMemPoolAttrReserved*).
  absl::StatusOr<size_t> ReservedBytes(bool high_water_mark) const;

  // Per-op attribution for profiling (off by default): while on, every op synchronises the
  // stream before and after itself and adds the host-measured wall time (launch overhead
  // included) to a per-op total. This serialises the GPU, so measure throughput with it off.
  void SetOpTiming(bool on);
  // One line per op name: calls, total ms, share; sorted by total, then cleared.
  std::string TakeOpTimingReport();

 private:
  std::unique_ptr<DeviceBuffer> AllocateOnStream(size_t bytes, bool zero);
  CudaBackend(int device, WeightDType weight_dtype, const CudaTuning& tuning, cudaStream_t stream,
              cublasHandle_t cublas, cudaMemPool_t pool, void* cublas_workspace,
              unsigned int* staged_gemv_counter, uint32_t* route_tile_counters);
  // The FP8 matrix w [n, k] (row stride ldw) dequantised to bf16 [n, k] in a scratch buffer.
  std::unique_ptr<DeviceBuffer> DequantizeToBf16(const WeightView& w, int64_t ldw, int64_t n,
                                                 int64_t k);
  // Gemm with FP8 weights (cuda_backend_fp8.cc).
  void GemmFp8(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda, WeightView w,
               int64_t ldw, float* c, int64_t ldc, bool accumulate);
  // kernels::Fp8TiledGemm for GemmFp8, false (nothing run) where it does not take the operands.
  bool GemmFp8Tiled(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda,
                    const WeightView& w, int64_t ldw, float* c, int64_t ldc, bool accumulate);
  // Gemm's W8A8 path into c (fp32 [m, ldc], or bf16 with c_bf16: then c holds m rounded up to
  // a multiple of 4 rows, the padding rows written), timed as the phase `phase_name`; false
  // (nothing launched): not taken here (device, shape, layout, or cuBLASLt without an
  // algorithm), the caller takes another path.
  bool GemmFp8W8A8(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda,
                   const WeightView& w, int64_t ldw, void* c, int64_t ldc, bool c_bf16,
                   bool accumulate, const char* phase_name);
  // GemmFp8W8A8's cuBLASLt GEMM for an operand quantised elsewhere (kernels::Fp8QuantizeRows'
  // plain layout at RoundUp4(m) rows, ldq k): the GEMM and where its result goes.
  struct W8A8Gemm {
    Fp8LtGemm g;  // q, q_scales set by RunW8A8Gemm; d null: the scratch RunW8A8Gemm takes
    int64_t m = 0;
    void* c = nullptr;
    int64_t ldc = 0;
    bool direct = false, accumulate = false;
  };
  // GemmFp8W8A8's checks on the weight and output and cuBLASLt's heuristic, into *out: false
  // (nothing launched) where that path does not take them. Errors: cuBLASLt's.
  absl::StatusOr<bool> PrepareW8A8Gemm(int64_t m, int64_t n, int64_t k, const WeightView& w,
                                       int64_t ldw, void* c, int64_t ldc, bool c_bf16,
                                       bool accumulate, W8A8Gemm* out);
  // A prepared GEMM on q ([RoundUp4(m), k] e4m3) and q_scales; a ragged fp32 result through
  // scratch then kernels::AddRowsF32.
  void RunW8A8Gemm(const W8A8Gemm& g, const uint8_t* q, const float* q_scales);
  // AddRmsNormGemms with FP8 weights from CudaTuning::fp8_w8a8_min_rows rows (each target a
  // GemmFp8W8A8), the normed rows quantised once for every target, by the norm's pass where
  // kernels::AddRmsNormFp8 takes them (then normed / normed_bf16 are left unwritten): the values
  // of AddRmsNorm then one GemmFp8W8A8 per target (cuda_backend_w8a8.cc). false (nothing
  // launched) where a target would not take that path.
  bool AddRmsNormGemmsW8A8(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                           float eps, float* normed, uint16_t* normed_bf16,
                           const std::vector<NormedGemm>& gemms);
  // GateUpSiluMulBf16 with FP8 weights (rows >= kBf16GateUpMinRows).
  bool GateUpSiluMulFp8(int64_t rows, int64_t inter, int64_t k, ActivationView a, int64_t lda,
                        WeightView w, int64_t ldw, uint16_t* out);
  // RoutedExperts' rows grouped by expert on the device (kernels::MoePermuteF32, slot s = expert
  // s): plan = counts [E] | offsets [E + 1], each choice's row, each row's token, the gathered
  // rows [rows, hidden] (bf16 bits with `bf16`, else fp32), the planner's workspace.
  struct MoePermutation {
    std::unique_ptr<DeviceBuffer> plan, choice_row, row_token, permuted, plan_workspace;
  };
  // !gather: the plan only (plan, choice_row, row_token; no rows gathered, permuted null).
  // shared_slots S > 0: every token also takes S shared groups after its top-k choices
  // (kernels::MoePermuteParams::shared_slots): slots E .. E + S - 1, plan = counts [E + S] |
  // offsets [E + S + 1], choice_row [tokens, top_k + S].
  MoePermutation PermuteRoutedRows(const RoutedExpertsArgs& a, int64_t rows, int32_t row_align,
                                   bool bf16, bool gather, int32_t shared_slots = 0);
  // The combine of RoutedExperts' paths: each token's top-k rows of expert_out ([rows, hidden],
  // bf16 bits with `bf16`, else fp32), weighted, written over a.out (no memset pass; the same bits
  // as adding into zeros).
  // shared_slots: PermuteRoutedRows' (the shared groups' rows added with weight 1).
  void CombineExpertRows(const RoutedExpertsArgs& a, const MoePermutation& perm,
                         const DeviceBuffer& expert_out, bool bf16, int32_t shared_slots = 0);
  // RoutedExperts' device path for MXFP4 experts (cuda_backend_mxfp4.cc; where
  // Mxfp4ExpertsOnCublas is false): without host synchronisation, bf16 rows through
  // kernels::Mxfp4MmaGroupedGemm (gate_up fp32, SiluMulF32ToBf16 or, with a clamp, gate_up rounded
  // to bf16 and SiluMulBf16 with the limit, down), or in CudaTuning::mxfp4_w4a8_min_tokens ..
  // mxfp4_w4a8_max_tokens e4m3 rows through kernels::Mxfp4W4a8GroupedGemm
  // (RoutedExpertsMxfp4W4a8). false for sizes the kernel does not take or a device without it.
  bool RoutedExpertsMxfp4(const RoutedExpertsArgs& a);
  // RoutedExpertsMxfp4's W4A8 GEMMs after the permutation plan: the token rows quantised into
  // their groups' places, gate_up, SiLU-mul quantised (with a clamp: gate_up rounded to bf16,
  // SiluMulBf16 with the limit, then quantised), down, the combine.
  void RoutedExpertsMxfp4W4a8(const RoutedExpertsArgs& a, int64_t rows);
  // kernels::Mxfp4WgmmaSwapGroupedGemm's weight descriptors of one MXFP4 expert table (device
  // `table` and `scales`, host copy host_table [num_experts], each matrix [n, k]): built with the
  // exponent-bound check (host synchronisations) at the first call with these pointers outside a
  // capture and kept until the backend goes; null where the kernel does not take the table (not
  // built, a matrix beyond the bound, sizes or device).
  const void* Mxfp4SwapWeightMaps(const void* const* table, const void* const* host_table,
                                  const uint8_t* const* scales, int64_t scale_ld,
                                  int32_t num_experts, int64_t n, int64_t k);
  // Whether RoutedExperts takes MXFP4 experts to the cuBLAS path (widened to bf16): valid MXFP4
  // arguments, more than kMxfp4MaxDeviceTokens tokens, not keep_on_device, not `captured`.
  static bool Mxfp4ExpertsOnCublas(const RoutedExpertsArgs& a, bool captured);
  // RoutedExperts with FP8 experts (cuda_backend_fp8.cc), and its ways of running the expert
  // GEMMs over the permuted rows grouped by the device offsets [E + 1], writing expert_out
  // [rows, hidden] fp32: kernels::Fp8GroupedGemm / Fp8MmaGroupedGemm without host
  // synchronisation, or from the offsets copied to the host RoutedExpertsFp8W8A8, else GemmFp8
  // per expert.
  bool RoutedExpertsFp8(const RoutedExpertsArgs& a);
  // permuted: bf16 rows with `mma` (kernels::Fp8MmaGroupedGemm), fp32 rows without.
  void ExpertGemmsFp8OnDevice(const RoutedExpertsArgs& a, const int32_t* offsets, int64_t rows,
                              bool mma, const void* permuted, float* expert_out);
  // The prefill expert GEMMs per expert through GemmFp8 (fp32 permuted rows, gate_up and the
  // SiLU-mul product in fp32): where RoutedExpertsFp8W8A8 does not take the experts.
  void ExpertGemmsFp8PerExpert(const RoutedExpertsArgs& a, const int32_t* offsets, int64_t rows,
                               const float* permuted, float* expert_out);
  // The prefill experts W8A8 on cuBLASLt, from the permutation's plan (perm, no rows gathered;
  // group offsets multiples of 4) to the combine into a.out, at the bf16 cuBLAS path's
  // intermediate precision: the token rows quantised once each and scattered to their experts'
  // rows (e4m3, per-expert packed 1 x 128 scales), gate_up written in bf16, SiLU-mul rounded to
  // bf16 and quantised in one pass, down written in bf16, the combine reading bf16. false
  // (nothing launched): cuBLASLt or the layout does not take every busy expert's two GEMMs.
  bool RoutedExpertsFp8W8A8(const RoutedExpertsArgs& a, const MoePermutation& perm);
  // RoutedExpertsFp8's device path on kernels::Fp8WgmmaSwapGroupedGemm (W8A8, from
  // CudaTuning::fp8_swap_min_tokens tokens; `rows` the permuted rows' bound at row_align 1), the
  // values of a bf16 gather then ExpertGemmsFp8OnDevice's bf16 operands: the plan (no rows
  // gathered), each token row rounded to bf16 and quantised once into its experts' rows, gate_up
  // (bf16, or fp32 without CudaTuning::fp8_swap_gate_up_bf16), SiLU-mul rounded to bf16 and
  // quantised in one pass, down, the combine. false
  // (nothing launched) where it is not taken: the mode, the device, the sizes, or the weight
  // descriptors not built (a capture before the table's first eager call).
  bool RoutedExpertsFp8Swap(const RoutedExpertsArgs& a, int64_t rows);
  // The groups one pass of the swap kernel runs: the routed experts (shared_parts 0), or the
  // routed experts then the shared MLP's shared_parts parts of inter each (groups E .. E + S - 1,
  // every token's rows with weight 1), with their weight descriptors and device scale tables.
  struct Fp8SwapGroups {
    int32_t num_groups = 0;
    int32_t shared_parts = 0;
    const void* gate_up_maps = nullptr;
    const void* down_maps = nullptr;
    const float* const* gate_up_scales = nullptr;
    const float* const* down_scales = nullptr;
  };
  // Whether the swap kernel takes a's sizes with num_groups groups (the mode, the device, the
  // token count, the layout; checked before any descriptor is built or scratch taken).
  bool Fp8SwapTakes(const RoutedExpertsArgs& a, int32_t num_groups);
  // The swap path over g from the plan to the combine into a.out (RoutedExpertsFp8Swap's
  // steps), `rows` the permuted rows' bound, timed as `phase`.
  void RunFp8SwapGroups(const RoutedExpertsArgs& a, int64_t rows, const Fp8SwapGroups& g,
                        const char* phase);
  // RoutedAndSharedExperts with FP8 experts where the swap kernel runs the routed experts
  // (cuda_backend_fp8_shared.cc): the shared MLP as S = shared_inter / inter more groups of the
  // same GEMMs (SGLang's shared-experts fusion) instead of its own quantise, GEMMs and SiLU-mul.
  // false (nothing launched) where RoutedExperts would not take the swap kernel, for S > 32 -
  // top_k or E + S > kernels::kMaxMoeSlots, or where the shared groups are not built (a capture
  // before the layer's first eager call, or their memory not had).
  bool RoutedAndSharedExpertsFp8Swap(const RoutedExpertsArgs& a);
  // The shared groups of a's layer with its routed experts: each part's gate_up [2 inter,
  // hidden] (the shared gate_up itself for S = 1, else a copy of its gate and up rows) and down
  // [hidden, inter] (columns of the shared down, in place), their block scales copied into the
  // routed experts' layout (scale_ld, split_rows inter), the scale tables and descriptors over
  // E + S groups. Built (a host
  // synchronisation) at the first call with these weights outside a capture and kept until the
  // backend goes (the copies assume the weights are not rewritten in place); null where not
  // built.
  const Fp8SwapGroups* Fp8SwapSharedGroups(const RoutedExpertsArgs& a);
  // The swap kernel's weight descriptors of one expert table (device `table`, its host copy
  // host_table [num_experts], each matrix [n, k]): built (a host synchronisation) at the first
  // call with these pointers outside a capture, kept until the backend goes; null where not built.
  const void* Fp8SwapWeightMaps(const void* const* table, const void* const* host_table,
                                int32_t num_experts, int64_t n, int64_t k);
  // One GEMM of the Gemm layout on cuBLAS. a is fp32 for fp32 weights, bf16 bits otherwise.
  void GemmOnCublas(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, WeightView w,
                    int64_t ldw, float* c, int64_t ldc, bool accumulate);
  // RoutedExperts' device-path expert GEMMs (gate_up, SiLU-mul, down) with `algo` (the
  // batch-invariant mode: its own kernel, whatever `algo`):
  // plan = device counts [E] | offsets [E + 1]; `permuted` the gathered rows (fp32 for
  // kGroupedF32 outside the batch-invariant mode, bf16 otherwise); `rows` the row buffers' size;
  // choice_row [tokens, top_k] the permutation's row of each choice.
  void ExpertGemmsOnDevice(const RoutedExpertsArgs& a, DecodeMoeAlgo algo, const int32_t* plan,
                           const int32_t* choice_row, int64_t rows, const void* permuted,
                           float* expert_out);
  // RoutedExperts' large-batch expert GEMMs (gate_up, SiLU-mul, down) on cuBLAS; false after
  // recording an error.
  // plan: device counts [E] | offsets [E + 1] of the permutation (rows padded to chunk_rows
  // for kChunked); `rows` the row buffers' size; `permuted` the gathered rows in the weights'
  // type (bf16 or fp32); `expert_out` [rows, hidden] gets the down GEMM's output in that type.
  // MXFP4 experts (a.mxfp4()) are widened to bf16 a group at a time (ExpertGemmsMxfp4Widened).
  bool ExpertGemmsOnCublas(const RoutedExpertsArgs& a, const int32_t* plan, int32_t chunk_rows,
                           int64_t rows, const void* permuted, void* expert_out);
  // What the slices of one ExpertGemmsOnCublas call share: the plan on the host (counts [E] |
  // offsets [E + 1]), the chunk rows, the whole row buffers (rows of the GEMMs' type: bf16 or
  // fp32) and kernels::ExpertGemmCublasParams' pointer workspace.
  struct ExpertGemmsCublasRun {
    const int32_t* host_plan = nullptr;
    int32_t chunk_rows = 0;
    bool bf16 = true;
    const void* permuted = nullptr;  // [rows, hidden]
    void* gate_up = nullptr;         // [rows, 2 * inter]
    void* act = nullptr;             // [rows, inter]
    void* expert_out = nullptr;      // [rows, hidden]
    void** pointers = nullptr;
    int64_t pointer_count = 0;
  };
  // Experts first .. first + count - 1's matrices, in the GEMMs' type: device addresses in host
  // arrays [count] (the resident weights, or their bf16 copies in scratch).
  struct ExpertMatrices {
    int32_t first = 0, count = 0;
    const void* const* gate_up = nullptr;
    const void* const* down = nullptr;
  };
  // gate_up, SiLU-mul and down over the rows of experts m.first .. m.first + m.count - 1 (a
  // contiguous range of the permuted rows); false after recording an error.
  bool ExpertGemmsOnCublasSlice(const RoutedExpertsArgs& a, const ExpertGemmsCublasRun& run,
                                const ExpertMatrices& m);
  // ExpertGemmsOnCublas for MXFP4 experts (cuda_backend_mxfp4.cc): Mxfp4DequantGroupExperts
  // experts at a time widened into one scratch buffer, then their slice; groups without rows
  // are skipped.
  bool ExpertGemmsMxfp4Widened(const RoutedExpertsArgs& a, const ExpertGemmsCublasRun& run);
  // One kernels::ExpertGemmsCublas call with expert_gemm_algo_.
  bool ExpertGemms(const kernels::ExpertGemmCublasParams& g, const char* which);
  // Runs one Gemm / BatchedGemm on kernels::StagedGemvBf16 or kernels::SmallMGemmBf16 where one
  // takes the operands; false (nothing launched) otherwise.
  bool SmallMGemm(const kernels::SmallMGemmParams& p);
  // CudaTuning::batch_invariant's Gemm / BatchedGemm (bf16 or fp32 weights): the tensor-core
  // kernel where it takes p, else the warp-per-output kernel.
  void BatchInvariantGemm(const kernels::BatchInvariantGemmParams& p);
  // kernels::MoeDecodeFusedF32 of p (everything but the workspace and the kernel choice set):
  // the act workspace from scratch.
  // RoutedAndSharedExperts and NormedDenseMlp (no routed experts) launch through it.
  void LaunchMoeDecodeFused(kernels::MoeDecodeFusedParams p);
  // RoutedAndSharedExperts / NormedDenseMlp on FP8 matrices (cuda_backend_fp8.cc):
  // kernels::MoeDecodeFusedFp8 through LaunchMoeDecodeFusedFp8 (the act workspace from scratch)
  // at DecodeMoeFusedFor's sizes; RoutedAndSharedExperts at other sizes through
  // RoutedAndSharedExpertsFp8Swap.
  bool RoutedAndSharedExpertsFp8(const RoutedExpertsArgs& a);
  bool NormedDenseMlpFp8(const DenseMlpArgs& a);
  void LaunchMoeDecodeFusedFp8(kernels::MoeDecodeFusedFp8Params p);
  // The routing and shape fields the bf16 and FP8 fused decode blocks' params share, from a.
  template <typename FusedParams>
  static void SetFusedDecodeRouting(const RoutedExpertsArgs& a, FusedParams* p) {
    p->num_tokens = a.num_tokens;
    p->top_k = a.top_k;
    p->num_experts = a.num_experts;
    p->hidden_size = static_cast<int32_t>(a.hidden_size);
    p->inter = static_cast<int32_t>(a.inter);
    p->hidden = a.hidden;
    p->topk_ids = a.topk_ids;
    p->topk_weights = a.topk_weights;
    p->slot_of_expert = a.slot_of_expert;
    p->shared_parts = static_cast<int32_t>(a.shared_inter / a.inter);
    p->out = a.out;
  }
  // The fp32 SiLU-mul of the expert paths: kernels::SiluMulF32, or with limit > 0 V4's clamped
  // form (kernels::SwiGluClampedF32).
  void SiluMulF32Rows(int64_t rows, int64_t inter, const float* x, float limit, float* out);
  // GemmOnCublas's product (bf16 a and w) through lt_tuner_ where gemm_autotune applies (c
  // fp32, or bf16 with c_bf16); false: not taken, nothing launched.
  bool GemmOnCublasLt(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, WeightView w,
                      int64_t ldw, void* c, int64_t ldc, bool c_bf16, bool accumulate);
  // Rounds the `elements` fp32 values at a to bf16 into a new scratch buffer.
  std::unique_ptr<DeviceBuffer> RoundToBf16(const float* a, int64_t elements);
  // Records the first failure; returns false if `st` is an error.
  bool Record(const absl::Status& st);
  bool Check(cudaError_t err, const char* call);
  bool CheckBlas(cublasStatus_t st, const char* call);
  // A kernel entry point that may fail in cuBLAS (`blas`, reported as "call (cuBLAS)", first)
  // or in CUDA (`err`).
  void CheckKernelOrBlas(cudaError_t err, cublasStatus_t blas, const char* call);
  // Whether `spans` tile the batch's `num_tokens` tokens in order, each with 1 <= tokens <=
  // context (and context <= max_context when max_context >= 0); otherwise records
  // INVALID_ARGUMENT naming `op` and the first bad span, and returns false.
  bool SpansTileTheBatch(const char* op, const MlaSequenceSpan* spans, int32_t num_spans,
                         int32_t num_tokens, int64_t max_context);
  class OpTimer;     // RAII guard of one op when op timing is on
  class PhaseTimer;  // a phase inside an op ("Op/phase" in the report)
  // Whether v fits a non-negative int (cuBLAS's and the kernels' sizes).
  static bool FitsInt(int64_t v) { return v >= 0 && v <= std::numeric_limits<int>::max(); }

  struct OpTotal {
    int64_t calls = 0;
    double seconds = 0;
  };
  bool op_timing_ = false;
  bool in_timed_op_ = false;                     // GroupedGemm calls Gemm: count only the outer op
  std::unique_ptr<CublasLtGemmTuner> lt_tuner_;  // made at the first tuned GEMM
  // Gemm's W8A8 path; made with the backend on a device CublasLtFp8Gemm::DeviceSupports, else
  // null (no W8A8).
  std::unique_ptr<CublasLtFp8Gemm> lt_fp8_;
  // Fp8SwapWeightMaps' descriptors (cudaMalloc'ed) by (device table, n, k), with the host
  // pointers they were built from.
  struct Fp8SwapMaps {
    void* device = nullptr;
    std::vector<const void*> weights;
  };
  std::map<std::tuple<const void*, int64_t, int64_t>, Fp8SwapMaps> fp8_swap_maps_;
  // Mxfp4SwapWeightMaps' descriptors by (device table, n, k): the host pointers they were built
  // from, and whether the table fits the kernel's exponent bound (device null where it does not).
  struct Mxfp4SwapMaps {
    void* device = nullptr;
    std::vector<const void*> weights;
    bool checked = false, fits = false;
  };
  std::map<std::tuple<const void*, int64_t, int64_t>, Mxfp4SwapMaps> mxfp4_swap_maps_;
  // Fp8SwapSharedGroups' by (routed gate_up table, shared gate_up), with what they were built
  // from; storage (cudaMalloc'ed) holds the descriptors, tables, scales and copies.
  struct Fp8SwapShared {
    std::vector<intptr_t> built_from;
    void* storage = nullptr;
    Fp8SwapGroups groups;
  };
  std::map<std::pair<const void*, const void*>, Fp8SwapShared> fp8_swap_shared_;
  std::map<std::string, OpTotal> op_totals_;
  // kChunked, or kPerExpert once cuBLAS has refused the batched call (ExpertGemms).
  kernels::ExpertGemmCublasAlgo expert_gemm_algo_ = kernels::ExpertGemmCublasAlgo::kChunked;

  const int device_;
  const WeightDType weight_dtype_;
  const CudaTuning tuning_;
  cudaStream_t stream_;
  cublasHandle_t cublas_;
  cudaMemPool_t pool_;
  void* cublas_workspace_;  // cudaMalloc'ed, kCublasWorkspaceBytes
  // cudaMalloc'ed and zeroed: the staged GEMV's counter (kernels::StagedGemvParams::counter;
  // every launch on stream_ leaves it 0).
  unsigned int* staged_gemv_counter_;
  // cudaMalloc'ed, kernels::kFusedRouterTileCounters zeros that every RouteTokensF32 call leaves
  // zero (allocated once: a graph replays the same address; one stream, so calls never overlap).
  uint32_t* route_tile_counters_;
  mutable absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  // While Capture records: errors go here instead of first_error_ (a failed recording is
  // reported by Capture and leaves the backend usable).
  bool capturing_ ABSL_GUARDED_BY(mu_) = false;
  bool capture_aside_ ABSL_GUARDED_BY(mu_) = false;  // this recording's small allocations aside
  int64_t aside_allocations_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status capture_error_ ABSL_GUARDED_BY(mu_);
  // Issues its kernels on stream_ and records errors and op times here (friend).
  std::unique_ptr<CudaV4Ops> v4_ops_;
  friend class CudaV4Ops;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_CUDA_BACKEND_H_
