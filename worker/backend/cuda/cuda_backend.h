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
// the failing call named), logged, and returned by status(); DeepseekV3Model::Step checks it
// after each step. Later ops still run (their results are meaningless after an error), and a
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
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/attention/mha_prefill.h"
#include "kernels/gemm/small_m_gemm.h"
#include "kernels/gemm/staged_gemv.h"
#include "kernels/moe/expert_gemm_cublas.h"
#include "kernels/moe/moe_decode_fused.h"
#include "kernels/moe/noaux_tc_router_fused.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda/cublaslt_gemm_tuner.h"

namespace deepinfer {

class CudaBackend : public Backend {
 public:
  // Uses GPU `device`; FAILED_PRECONDITION if there is no such device, INTERNAL for other CUDA
  // or cuBLAS setup errors.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(
      int device = 0, WeightDType weight_dtype = WeightDType::kBFloat16);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  WeightDType weight_dtype() const override { return weight_dtype_; }
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
  // cudaMemGetInfo of device().
  absl::StatusOr<DeviceMemoryInfo> MemoryInfo() const override;

  // bf16 weights and one row, or up to kernels::kSmallMGemmMaxRows rows and at most
  // kSmallMGemmMaxColumnsAboveOneRow columns (decode): kernels::SmallMGemmBf16 (one launch,
  // reads an fp32 a and rounds it as it goes), where it takes the operands and small_m_gemm() is
  // on; otherwise cuBLAS, after rounding an fp32 a to bf16 (a bf16 a goes to
  // cuBLAS as it is). Same for BatchedGemm.
  void Gemm(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda, WeightView w,
            int64_t ldw, float* c, int64_t ldc, bool accumulate) override;
  // Whether Gemm / BatchedGemm use kernels::SmallMGemmBf16 for small m (default on); off: cuBLAS
  // for every size, for before/after measurements.
  void SetSmallMGemm(bool on) { small_m_gemm_ = on; }
  // While recording a graph with programmatic dependent launch on (kernels/common/pdl.h),
  // scratch allocations of at most kMaxAsideAllocationBytes are captured beside the kernel chain
  // (kernels/common/capture_deps.h), so that a memory node does not sit between two kernels and
  // break their programmatic edge. Such graph memory is not reused within the graph (each
  // recorded step holds all its small temporaries at once), and it is not counted in
  // DecodeGraphReserveBytes. On for every recording with SetGraphAllocationsAside(true) (a
  // 27-layer run at 64 and 128 requests measured 2.03 GiB of graph memory against 0.09 GiB
  // without, and no gain); by default only for recordings of at most
  // SetGraphAllocationsAsideMaxTokens tokens (default 1: +1.5-2% at one request, ~47 MB of graph
  // memory per recorded 27-layer step; 2 requests measured ~1% slower with it). 0: never.
  void SetGraphAllocationsAside(bool on) { allocations_aside_ = on; }
  void SetGraphAllocationsAsideMaxTokens(int64_t tokens) { aside_max_tokens_ = tokens; }
  static constexpr size_t kMaxAsideAllocationBytes = 64 * 1024;
  // The small-m kernel's layout (default kAuto: by k); for tests and benchmarks.
  void SetSmallMGemmAlgo(kernels::SmallMGemmAlgo algo) { small_m_gemm_algo_ = algo; }
  // With more than one row, the small-m kernel only up to this many output columns.
  static constexpr int64_t kSmallMGemmMaxColumnsAboveOneRow = 4096;
  bool small_m_gemm() const { return small_m_gemm_; }
  // Where kernels::StagedGemvBf16 runs. kNorm: AddRmsNormGemms at one row with bf16 weights is
  // one launch (the norm computed by every block as it stages the activation, x += y written
  // once; the normed scratch left unwritten). kAll (default): also Gemm at one row with bf16
  // weights where kernels::StagedGemvPreferredAtOneRow (measured faster) while the small-m
  // layout is kAuto. kOff: neither (the kernels before it).
  enum class StagedGemv { kOff, kNorm, kAll };
  void SetStagedGemv(StagedGemv use) { staged_gemv_ = use; }
  // The most activation rows the staged GEMV takes (1 or 2; default 2). At two rows (not kOff):
  // AddRmsNormGemms is AddRmsNorm then one staged launch for all its GEMMs, and (kAll) Gemm takes
  // it where kernels::StagedGemvPreferredAtTwoRows (measured faster than the small-m kernel).
  void SetStagedGemvMaxRows(int64_t rows) { staged_gemv_max_rows_ = rows; }
  void AddRmsNormGemms(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                       float eps, float* normed, uint16_t* normed_bf16,
                       const std::vector<NormedGemm>& gemms) override;
  void BatchedGemm(int64_t batch, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                   int64_t stride_a, WeightView w, int64_t ldw, int64_t stride_w, float* c,
                   int64_t ldc, int64_t stride_c) override;
  // One cuBLAS call per non-empty group (correctness first; a grouped GEMM is the next step);
  // with bf16 weights the activations are rounded once for all groups.
  void GroupedGemm(const std::vector<int64_t>& offsets, const std::vector<WeightView>& weights,
                   int64_t n, int64_t k, const float* a, float* c) override;
  // Any batch, bf16 or fp32 experts, one rank hosting them (up to kernels::kMaxMoeSlots):
  // device permutation (kernels::MoePermuteF32), expert GEMMs, SiLU-mul, and the per-token
  // gather combine (kernels::MoeCombineF32, k order, no atomics). The expert GEMMs:
  //  * bf16 and at most kMaxFusedMoeTokens tokens (decode), or any bf16 batch while the stream
  //    is being captured into a CUDA graph (or with a decode algorithm forced by
  //    SetDecodeMoeAlgo): DecodeMoeAlgoFor(tokens), all of which read the group sizes on the
  //    device: no host synchronisation (capturable in a CUDA graph);
  //  * otherwise: cuBLAS tensor-core GEMMs (kernels::ExpertGemmsCublas, expert_gemm_algo():
  //    by default each expert's rows in fixed chunks, all chunks in one batched call), after
  //    ONE device-to-host copy of the group sizes; activations rounded to bf16 for bf16
  //    weights, as in Gemm, and with bf16 weights both GEMMs write bf16 (kernels::SiluMulBf16
  //    between them, the combine reads bf16), as a bf16 PyTorch model rounds each Linear.
  bool RoutedExperts(const RoutedExpertsArgs& args) override;
  // Taken for bf16 weights, tokens whose decode algorithm is kGroupedF32 (DecodeMoeAlgoFor),
  // shared_inter a positive multiple of inter, and the size DecodeMoeFusedFor allows:
  // kernels::MoeDecodeFusedF32, two launches reading the routing on the device (no permutation,
  // gather, separate SiLU-mul, combine or shared-expert GEMMs; activations fp32 throughout,
  // also for the shared MLP). Otherwise false.
  bool RoutedAndSharedExperts(const RoutedExpertsArgs& args) override;
  // Taken (SetDecodeDenseMlpFused, default on) for one row, bf16 weights, hidden_size and inter
  // multiples of 8 and a 16-byte aligned `normed`: AddRmsNorm (fp32 output only), then
  // kernels::MoeDecodeFusedF32 with no routed experts and the MLP as one shared part of the
  // whole intermediate (DecodeMoeFusedKernelsFor's kernels): two launches instead of the
  // gate_up GEMV, SiluMulBf16 and the down GEMV, activations fp32 throughout (the ops round the
  // normed row and the SiLU-mul output to bf16). Otherwise false.
  bool NormedDenseMlp(const DenseMlpArgs& args) override;
  // On by default: the 27-layer decode at one request measured 2.3694 -> 2.3624 ms (two
  // alternating rounds); false: the ops (--decode-dense-mlp-fused).
  void SetDecodeDenseMlpFused(bool on) { decode_dense_mlp_fused_ = on; }
  // Which sizes RoutedAndSharedExperts takes: kAuto (the default) where it measured faster than
  // RoutedExperts + the shared-expert ops (moe_block_decode_bench, H200, docs/kernels.md): with
  // the kPersistent, kPipelined or kStationary kernels (DecodeMoeFusedKernelsFor) one token at
  // any width and two at hidden_size <= kMaxAutoFusedMoeHidden (Moonlight's 2048: faster; V3's
  // 7168: not faster at two); kOn:
  // 1..kernels::kMoeDecodeFusedMaxTokens tokens, any width; kOff: never (the model runs the
  // previous ops). kOn / kOff for tests and benchmarks.
  enum class DecodeMoeFused { kAuto, kOff, kOn };
  void SetDecodeMoeFused(DecodeMoeFused mode) { decode_moe_fused_ = mode; }
  bool DecodeMoeFusedFor(int64_t tokens, int64_t hidden_size) const;
  // The kernels RoutedAndSharedExperts launches and, for benchmarks, the persistent grids'
  // blocks per SM (0: as many as fit); kernels::MoeDecodeFusedParams. By default (and after
  // SetDecodeMoeFusedKernelsAuto) DecodeMoeFusedKernelsFor picks them by size.
  void SetDecodeMoeFusedKernels(kernels::MoeDecodeFusedKernels kernels,
                                int32_t gate_up_blocks_per_sm = 0, int32_t down_blocks_per_sm = 0) {
    decode_moe_fused_kernels_auto_ = false;
    decode_moe_fused_kernels_ = kernels;
    decode_moe_fused_gate_up_blocks_per_sm_ = gate_up_blocks_per_sm;
    decode_moe_fused_down_blocks_per_sm_ = down_blocks_per_sm;
  }
  // Whether RouteTokens' fused router writes its logits, and the fused MoE block
  // (RoutedAndSharedExperts, NormedDenseMlp) its act workspace, into buffers the backend owns
  // (kResidentLogitsBytes, kResidentActBytes; a larger act: scratch) instead of scratch
  // allocations. Recorded into a graph, a scratch allocation or free between two kernels is a
  // memory node that keeps the edge between them from being programmatic (docs/cuda.md,
  // "Allocations beside the chain"): with them resident the router -> gate_up edge is one (and
  // gate_up's prefetch before its PDL wait runs under the router). Same results bit for bit
  // (deepinfer-bench --decode-moe-resident-workspaces). Off by default: moe_block_decode_bench
  // (H200, docs/kernels.md) measured it 1.3 us a layer faster at Moonlight 1 token,
  // no faster at 2 tokens, 0.3 % slower at V3 1 token and 25 % slower at V3 2 tokens (not
  // explained); not yet measured alone in the 27-layer step.
  void SetDecodeMoeResidentWorkspaces(bool on) { decode_moe_resident_workspaces_ = on; }
  void SetDecodeMoeFusedKernelsAuto() {
    SetDecodeMoeFusedKernels(kernels::MoeDecodeFusedKernels::kPipelined);
    decode_moe_fused_kernels_auto_ = true;
  }
  // The set kernels, or by default the fastest pair measured (moe_block_decode_bench, H200,
  // docs/kernels.md): kStationary at every width (µs a layer, kPersistent / kPipelined /
  // kStationary: Moonlight 1 token 50.1 / 46.7 / 39.9, 2 tokens 75.1 / 69.0 / 68.7 (there
  // kStationary is kPipelined); V3 1 token 207.2 / 220.9 / 200.2; at 2 tokens kAuto does not
  // fuse V3).
  kernels::MoeDecodeFusedKernels DecodeMoeFusedKernelsFor(int64_t hidden_size) const;
  static constexpr int64_t kMaxAutoFusedMoeHidden = 4096;
  // The chunked cuBLAS GEMMs were faster from 128 tokens on (the smallest size measured,
  // docs/kernels.md); decode batches up to here keep the path without host synchronisation.
  static constexpr int32_t kMaxFusedMoeTokens = 128;
  // The expert GEMMs of the device path (no host synchronisation):
  //  kGroupedF32:    kernels::GroupedGemmBf16 on fp32 activations (CUDA cores for 1-2 rows per
  //                  expert, tensor cores with x split into bf16 hi + lo above);
  //  kStream:        kernels::GroupedGemmBf16Stream on bf16 activations (gathered into bf16,
  //                  SiLU-mul written in bf16);
  //  kPlannedCublas: kernels::PlanExpertGemmBatches + one cublasGemmBatchedEx per GEMM over
  //                  chunks of PlannedChunkRows rows (bf16 activations, padded layout; the
  //                  dummy entries spread between the real chunks; gate_up written in bf16,
  //                  kernels::SiluMulBf16ListedRows over the real rows, down in fp32).
  // kAuto picks by size (DecodeMoeAlgoFor; grouped_gemm_bench and moe_decode_bench on the
  // H200, docs/kernels.md): kGroupedF32 up to 2 tokens, kPlannedCublas above.
  enum class DecodeMoeAlgo { kAuto, kGroupedF32, kStream, kPlannedCublas };
  // Rows per chunk of kPlannedCublas for `tokens` tokens: SetPlannedChunkRows's value if set,
  // else by size: 8 up to 32 tokens (grouped_gemm_bench), 48 above (the 27-layer Moonlight
  // bench, one fixed batch: 48 faster than 32 at 64 and 128 requests; docs/kernels.md). Never
  // depends on whether the stream is captured, so a replayed decode graph computes the same bits as
  // the same step run eagerly.
  int32_t PlannedChunkRows(int64_t tokens) const;
  // Forces the chunk rows of kPlannedCublas (1..kMaxPlannedChunkRows; 0: by size, the
  // default). For tests and benchmarks.
  absl::Status SetPlannedChunkRows(int32_t rows);
  static constexpr int32_t kMaxPlannedChunkRows = 256;
  // The algorithm the device path uses for `tokens` tokens (never kAuto).
  DecodeMoeAlgo DecodeMoeAlgoFor(int64_t tokens) const;
  // Forces one decode algorithm (kAuto: by size, the default); a forced one also takes bf16
  // batches above kMaxFusedMoeTokens. For tests and benchmarks.
  void SetDecodeMoeAlgo(DecodeMoeAlgo algo) { decode_moe_algo_ = algo; }
  // The device MoE path's work after the expert GEMMs' rows are known. On (the default): the
  // planned path's SiLU-mul over the real rows only (kernels::SiluMulBf16ListedRows through
  // the permutation's choice_row; the padding rows of the chunks are never computed) and the
  // combine overwriting the output (no memset; the same bits as adding into zeros). Off: the
  // previous SiLU-mul over every row of the padded layout in use and a memset + accumulating
  // combine. Results are identical either way; for benchmarks (old vs new).
  void SetDecodeMoeSparseEpilogue(bool on) { decode_moe_sparse_epilogue_ = on; }
  // Inside a CUDA graph and above kMaxFixedBatchGraphMoeTokens tokens, the planned path's two
  // GEMMs each behind a switch node over up to kernels::kMaxExpertGemmBatchBuckets batch sizes
  // (kernels::ExpertGemmBatchBuckets), the planner picking the smallest that holds the step's
  // real chunks: the fixed batch's dummy chunks mostly not launched. OFF by default: in the
  // 27-layer Moonlight bench it measured slower than the one fixed batch (docs/kernels.md);
  // off: the one fixed batch (as eagerly). Same results either way.
  void SetDecodeMoeGraphBuckets(bool on) { decode_moe_graph_buckets_ = on; }
  // Up to this many tokens the recorded planned path keeps the one fixed batch (the switch was
  // measured at 64-256 tokens only, docs/kernels.md).
  static constexpr int64_t kMaxFixedBatchGraphMoeTokens = 32;
  // How the large-batch path calls cuBLAS (default kChunked). For tests and benchmarks.
  void SetExpertGemmAlgo(kernels::ExpertGemmCublasAlgo algo) { expert_gemm_algo_ = algo; }
  kernels::ExpertGemmCublasAlgo expert_gemm_algo() const { return expert_gemm_algo_; }
  void RmsNorm(int64_t rows, int64_t dim, const float* x, int64_t ldx, const float* weight,
               float eps, float* out, int64_t ldout) override;
  void Add(int64_t n, const float* a, const float* b, float* out) override;
  void AddRmsNorm(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                  float eps, float* out, uint16_t* out_bf16) override;
  void SiluMul(int64_t rows, int64_t inter, const float* x, float* out) override;
  void SiluMulBf16(int64_t rows, int64_t inter, const float* x, uint16_t* out) override;
  // From kBf16GateUpMinRows rows (prefill; decode batches keep Gemm + SiluMulBf16 and their
  // graphs) with bf16 weights, while SetBf16GateUp is on (default): one cuBLAS GEMM with a
  // bf16 output (fp32 accumulation, rounded once by its epilogue), then kernels::SiluMulBf16.
  bool GateUpSiluMulBf16(int64_t rows, int64_t inter, int64_t k, ActivationView a, int64_t lda,
                         WeightView w, int64_t ldw, uint16_t* out) override;
  static constexpr int64_t kBf16GateUpMinRows = 512;
  // Gemm (bf16 weights) and GateUpSiluMulBf16 from kGemmAutotuneMinRows rows (prefill; never
  // while the stream is captured) through CublasLtGemmTuner: cuBLASLt with the fastest of its
  // heuristic algorithms, timed at each new shape's first call (a host synchronisation and
  // ~8 x 4 GEMMs into the output itself, a scratch one with accumulate; once per bucket of m).
  // On by default (the 27-layer Moonlight prefill 32 x 1024 measured 0.3312 / 0.3323 s off,
  // 0.3209 / 0.3245 s on, same call; docs/cuda.md); off: cublasGemmEx. The timed pick can
  // differ between processes (so can the GEMMs' bits): off for run-to-run reproducibility.
  void SetGemmAutotune(bool on) { gemm_autotune_ = on; }
  bool gemm_autotune() const { return gemm_autotune_; }
  static constexpr int64_t kGemmAutotuneMinRows = 1024;
  // Shapes the tuner has an algorithm for (0 before the first tuned call).
  size_t gemm_autotuned_shapes() const { return lt_tuner_ != nullptr ? lt_tuner_->shapes() : 0; }
  // Off: GateUpSiluMulBf16 declines, for before/after measurements (deepinfer-bench
  // --bf16-gate-up).
  void SetBf16GateUp(bool on) { bf16_gate_up_ = on; }
  void FillDummy(const DummyFill& fill, int64_t n, WeightDType dtype, void* out) override;
  // kernels::NormRopeWriteLatentCacheF32: one launch.
  void NormRopeWriteLatentCache(const NormRopeCacheArgs& args) override;
  // With norm_rope_cache_absorb_fused() on (the default), SetSmallMGemm on, bf16 W_uk, up to
  // kNormRopeCacheAbsorbMaxTokens tokens and params kernels::NormRopeCacheAbsorbQuerySupported
  // takes: kernels::NormRopeCacheAbsorbQueryF32, one launch with the bits of the two ops (the
  // W_uk product as SmallMGemmBf16 computes it); otherwise Backend's two ops. Measured on the
  // H200 at 1 request: 27-layer decode step -29 us (docs/cuda.md, "The attention core's launch
  // chain at one token"); 2-4 tokens give the same bits but were not timed, so they keep two
  // launches.
  void NormRopeCacheAbsorbQuery(const NormRopeCacheArgs& nr, const AbsorbQueryArgs& aq) override;
  static constexpr int64_t kNormRopeCacheAbsorbMaxTokens = 1;
  // Off: the two launches, for before/after measurements (deepinfer-bench
  // --norm-rope-cache-absorb-fused).
  void SetNormRopeCacheAbsorbFused(bool on) { norm_rope_cache_absorb_fused_ = on; }
  bool norm_rope_cache_absorb_fused() const { return norm_rope_cache_absorb_fused_; }
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
  // kernels::MhaPrefillBf16 with bf16 kv_b on a device and shapes it takes (false otherwise).
  bool MhaPrefillAttention(const MhaPrefillArgs& args) override;
  // The flash kernel of MhaPrefillAttention (kernels::MhaFlashKernel; kAuto, the default: the
  // 128-row kernel where the sequences fill its tiles, else the 64-row one). For benchmarks
  // (deepinfer-bench --mha-flash-kernel) and tests.
  void SetMhaFlashKernel(kernels::MhaFlashKernel k) { mha_flash_kernel_ = k; }
  // kernels::MhaPrefillParams::flash_pair_group (the 128-row kernels' block order; 0, the
  // default: tile-major; N > 0: pair groups, measured slower), for benchmarks
  // (--mha-flash-pair-group). A negative value makes MhaPrefillAttention decline (false).
  void SetMhaFlashPairGroup(int32_t pairs) { mha_flash_pair_group_ = pairs; }
  // MhaPrefillAttention's gather + kv_b expansion. On (the default): the group's cache entries
  // in one gather launch (kernels::MhaGather::kOneLaunch) and the expansion GEMM through the
  // cuBLASLt tuner (GemmOnCublasLt, when SetGemmAutotune is on, outside graph capture, from
  // kGemmAutotuneMinRows keys; else cublasGemmEx). Off: one gather launch per sequence and
  // cublasGemmEx's default algorithm. For benchmarks (--mha-fast-expand).
  void SetMhaFastExpand(bool on) { mha_fast_expand_ = on; }
  // kernels::MhaPrefillParams::workspace_budget in bytes (0, the default: the kernel's 256 MiB),
  // for benchmarks (--mha-workspace-mib).
  void SetMhaWorkspaceBudget(size_t bytes) { mha_workspace_budget_ = bytes; }
  // With bf16 weights (the fp32 model keeps fp32 attention), a sequence with at least
  // kMlaPrefillMinTokens new tokens and kMlaPrefillMinWork (new tokens x context) query-key
  // pairs. Measured on the H200 (docs/cuda.md): one 64-token prompt (4096 pairs) is faster on
  // the fp32 kernel (31 vs 41 us), a 128-token one (16384) on tensor cores (48 vs 35 us), and 16
  // new tokens after 2048 cached (33024) too (85 vs 37 us).
  bool UsesTensorCoreAttention(const MlaSequenceSpan& s) const;
  static constexpr int32_t kMlaPrefillMinTokens = 16;
  static constexpr int64_t kMlaPrefillMinWork = 16384;
  // Overrides kMlaPrefillMinTokens (0: never use MlaPrefillBf16), for benchmarks.
  void SetMlaPrefillMinTokens(int32_t n) { mla_prefill_min_tokens_ = n; }
  // kernels::MlaAttentionParams::mma_variant of every kernels::MlaAttentionF32 call (decode
  // attention; 0: the kernel's default); INVALID_ARGUMENT unless kernels::MlaMmaVariantIsValid
  // (0, 4, 7, 8 or 9). For benchmarks (deepinfer-bench --mla-decode-variant) and tests.
  absl::Status SetMlaDecodeVariant(int32_t variant);
  int32_t mla_decode_variant() const { return mla_decode_variant_; }
  // A batch of kMlaDecodeSmallMaxTokens (1) token without prefill spans whose context is at most
  // mla_decode_small_max_context() goes to kernels::MlaDecodeSmall (one launch, no workspace)
  // where it takes the shape; longer (or unknown: no spans and no max_context_hint) contexts and
  // more tokens to MlaAttentionF32. Measured on the H200 (docs/cuda.md, "Few-token decode
  // kernel"): the one-launch kernel wins at short contexts and loses at long ones (its work per
  // key is fp32 CUDA-core instructions), and with 2-8 tokens loses at 4096 by up to 2x. Decode
  // graphs learn the break from MlaDecodeContextBreak and record one graph per side.
  void SetMlaDecodeSmall(bool on) { mla_decode_small_ = on; }
  // kernels::MlaDecodeSmallOptions::early_dependents of the backend's MlaDecodeSmall calls: the
  // W_uv GEMV after it is scheduled beside it and loads its weights early (deepinfer-bench
  // --mla-decode-small-early-dependents). Default off: on the H200 it saved 0.5 us of the
  // attention core's chain in mla_decode_small_bench but nothing measurable in the 27-layer
  // decode step (docs/cuda.md, "The attention core's launch chain at one token").
  void SetMlaDecodeSmallEarlyDependents(bool on) { mla_decode_small_early_dependents_ = on; }
  static constexpr int32_t kMlaDecodeSmallMaxTokens = 1;
  // Measured on the H200 (mla_decode_small_bench, 1 token in a CUDA graph, against the default
  // key-split kernel + combine): 7.8 / 10.2 / 12.4 / 14.9 us at 512 / 1024 / 1536 / 2048
  // positions against 11.6-11.8 us, i.e. equal at about 1.36K by interpolation.
  static constexpr int32_t kMlaDecodeSmallMaxContext = 1280;
  // Overrides kMlaDecodeSmallMaxContext (>= 1; INVALID_ARGUMENT otherwise), for benchmarks and
  // tests. Decode graphs recorded before keep their kernel (so with SetMlaDecodeSmall): set it
  // before the first step.
  absl::Status SetMlaDecodeSmallMaxContext(int32_t max_context);
  int32_t mla_decode_small_max_context() const { return mla_decode_small_max_context_; }
  int32_t MlaDecodeContextBreak(int32_t num_tokens) const override;
  void NoauxTcRoute(const NoauxTcRouteArgs& args) override;
  // With fused_router() on, up to kFusedRouterMaxTokens tokens and arguments
  // kernels::RouteTokensSupported takes: kernels::RouteTokensF32, logits, routing and counts in
  // one launch (at one token with args.norm also the norm, SetRouterNorm; more tokens:
  // AddRmsNorm first); otherwise Backend's AddRmsNorm (args.norm) + Gemm (cuBLAS) +
  // NoauxTcRoute + AccumulateExpertCounts.
  void RouteTokens(const RouteTokensArgs& args) override;
  // noaux_tc_router_bench (H200, Moonlight shape, in a CUDA graph): the one launch took 5.6 /
  // 6.1 / 8.2 / 10.5 us a layer at 1 / 8 / 64 / 128 tokens against 8.4 / 11.8 / 12.7 / 12.9 us
  // for the three ops, but 15.4 against 13.4 us at 256.
  static constexpr int32_t kFusedRouterMaxTokens = 128;
  // SetDecodeMoeResidentWorkspaces' buffers: the fused router's logits at its most tokens and
  // experts, and 1 MiB of act (Moonlight's block at 2 tokens: 90 KB; V3's: 147 KB).
  static constexpr size_t kResidentLogitsBytes =
      size_t{kFusedRouterMaxTokens} * kernels::kMaxFusedRouterExperts * sizeof(float);
  static constexpr size_t kResidentActBytes = size_t{1} << 20;
  // Whether RouteTokens may use the one-launch kernel (default on); off: the ops of before, for
  // comparisons (deepinfer-bench --fused-router).
  void SetFusedRouter(bool on) { fused_router_ = on; }
  bool fused_router() const { return fused_router_; }
  // Whether RouteTokens with args.norm set folds the norm into the router's launch where
  // kernels::RouteTokensSupported takes it (one token; bit for bit AddRmsNorm + the router);
  // off (the default: the fold measured no faster in the 27-layer decode step, H200,
  // docs/kernels.md): AddRmsNorm, then the router (one launch more).
  void SetRouterNorm(bool on) { router_norm_ = on; }
  void AccumulateExpertCounts(int64_t n, const int32_t* ids, int64_t num_experts,
                              const int32_t* count_limit, int64_t* counts) override;
  void ArgmaxRows(int64_t rows, int64_t vocab, const float* logits, int32_t* out) override;
  void GreedySampleRows(int64_t rows, int64_t vocab, const float* logits, int32_t* token,
                        float* logprob) override;
  void SampleRows(int64_t rows, int64_t vocab, const float* logits, const RowSamplingParams* params,
                  int32_t* token, float* logprob) override;
  void TopLogprobsRows(int64_t rows, int64_t vocab, const float* logits, int32_t n, int32_t* ids,
                       float* logprobs) override;

  // The first error any op has hit (OK if none).
  absl::Status status() const override;

  // False while op timing is on (a replay would not time its ops one by one).
  bool SupportsCapture() const override { return !op_timing_; }
  using Backend::Capture;
  absl::StatusOr<std::unique_ptr<CapturedOps>> Capture(const std::function<absl::Status()>& record,
                                                       const CaptureOptions& options) override;
  // Scratch allocations recorded beside the kernel chain so far (SetGraphAllocationsAside).
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
  CudaBackend(int device, WeightDType weight_dtype, cudaStream_t stream, cublasHandle_t cublas,
              cudaMemPool_t pool, void* cublas_workspace, unsigned int* staged_gemv_counter,
              uint32_t* route_tile_counters, void* resident_workspace);
  // One GEMM of the Gemm layout on cuBLAS. a is fp32 for fp32 weights, bf16 bits otherwise.
  void GemmOnCublas(int64_t m, int64_t n, int64_t k, const void* a, int64_t lda, WeightView w,
                    int64_t ldw, float* c, int64_t ldc, bool accumulate);
  // RoutedExperts' device-path expert GEMMs (gate_up, SiLU-mul, down) with `algo` (not kAuto):
  // plan = device counts [E] | offsets [E + 1]; `permuted` the gathered rows (fp32 for
  // kGroupedF32, bf16 otherwise); `rows` the row buffers' size; choice_row [tokens, top_k] the
  // permutation's row of each choice.
  void ExpertGemmsOnDevice(const RoutedExpertsArgs& a, DecodeMoeAlgo algo, const int32_t* plan,
                           const int32_t* choice_row, int64_t rows, const void* permuted,
                           float* expert_out);
  // While stream_ is captured into `graph`: a switch node on `handle` with `size` bodies after
  // the stream's current nodes, body(i) recording body i's cuBLAS calls (the handle moved to
  // switch_stream_ meanwhile); the stream's next node then follows the switch. Errors are
  // recorded.
  void CaptureSwitch(cudaGraph_t graph, cudaGraphConditionalHandle handle, int32_t size,
                     const std::function<void(int32_t)>& body);
  // RoutedExperts' large-batch expert GEMMs (gate_up, SiLU-mul, down) on cuBLAS; false after
  // recording an error.
  // plan: device counts [E] | offsets [E + 1] of the permutation (rows padded to chunk_rows
  // for kChunked); `rows` the row buffers' size; `permuted` the gathered rows in the weights'
  // type (bf16 or fp32); `expert_out` [rows, hidden] gets the down GEMM's output in that type.
  bool ExpertGemmsOnCublas(const RoutedExpertsArgs& a, const int32_t* plan, int32_t chunk_rows,
                           int64_t rows, const void* permuted, void* expert_out);
  // One kernels::ExpertGemmsCublas call with expert_gemm_algo_.
  bool ExpertGemms(const kernels::ExpertGemmCublasParams& g, const char* which);
  // Runs one Gemm / BatchedGemm on kernels::SmallMGemmBf16 when small_m_gemm_ is on and it takes
  // the operands; false (nothing launched) otherwise.
  bool SmallMGemm(const kernels::SmallMGemmParams& p);
  // kernels::MoeDecodeFusedF32 of p (everything but the workspace and the kernel choice set):
  // the act workspace from scratch, DecodeMoeFusedKernelsFor's kernels and the benchmark grids.
  // RoutedAndSharedExperts and NormedDenseMlp (no routed experts) launch through it.
  void LaunchMoeDecodeFused(kernels::MoeDecodeFusedParams p);
  // GemmOnCublas's product (bf16 a and w) through lt_tuner_ where SetGemmAutotune applies (c
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

  struct OpTotal {
    int64_t calls = 0;
    double seconds = 0;
  };
  bool op_timing_ = false;
  int32_t mla_prefill_min_tokens_ = kMlaPrefillMinTokens;
  int32_t mla_decode_variant_ = 0;  // kernels::MlaAttentionParams::mma_variant
  bool in_timed_op_ = false;        // GroupedGemm calls Gemm: count only the outer op
  bool mla_decode_small_ = true;
  bool mla_decode_small_early_dependents_ = false;
  bool norm_rope_cache_absorb_fused_ = true;
  kernels::MhaFlashKernel mha_flash_kernel_ = kernels::MhaFlashKernel::kAuto;
  int32_t mha_flash_pair_group_ = 0;
  bool mha_fast_expand_ = true;
  size_t mha_workspace_budget_ = 0;
  int32_t mla_decode_small_max_context_ = kMlaDecodeSmallMaxContext;
  bool small_m_gemm_ = true;
  bool fused_router_ = true;
  bool router_norm_ = false;
  bool allocations_aside_ = false;
  int64_t aside_max_tokens_ = 1;
  kernels::SmallMGemmAlgo small_m_gemm_algo_ = kernels::SmallMGemmAlgo::kAuto;
  StagedGemv staged_gemv_ = StagedGemv::kAll;
  int64_t staged_gemv_max_rows_ = 2;
  bool bf16_gate_up_ = true;
  bool gemm_autotune_ = true;
  std::unique_ptr<CublasLtGemmTuner> lt_tuner_;  // made at the first tuned GEMM
  std::map<std::string, OpTotal> op_totals_;

  kernels::ExpertGemmCublasAlgo expert_gemm_algo_ = kernels::ExpertGemmCublasAlgo::kChunked;
  DecodeMoeAlgo decode_moe_algo_ = DecodeMoeAlgo::kAuto;
  int32_t planned_chunk_rows_ = 0;  // 0: by size
  bool decode_moe_sparse_epilogue_ = true;
  DecodeMoeFused decode_moe_fused_ = DecodeMoeFused::kAuto;
  bool decode_moe_fused_kernels_auto_ = true;  // DecodeMoeFusedKernelsFor picks by size
  kernels::MoeDecodeFusedKernels decode_moe_fused_kernels_ =
      kernels::MoeDecodeFusedKernels::kPipelined;
  int32_t decode_moe_fused_gate_up_blocks_per_sm_ = 0;
  int32_t decode_moe_fused_down_blocks_per_sm_ = 0;
  bool decode_moe_graph_buckets_ = false;
  bool decode_dense_mlp_fused_ = true;
  bool decode_moe_resident_workspaces_ = false;
  cudaStream_t switch_stream_ = nullptr;  // records CaptureSwitch's bodies; made on first use

  const int device_;
  const WeightDType weight_dtype_;
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
  // cudaMalloc'ed: kResidentLogitsBytes of router logits, then kResidentActBytes of the fused
  // MoE block's act (SetDecodeMoeResidentWorkspaces).
  void* resident_workspace_;
  mutable absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  // While Capture records: errors go here instead of first_error_ (a failed recording is
  // reported by Capture and leaves the backend usable).
  bool capturing_ ABSL_GUARDED_BY(mu_) = false;
  bool capture_aside_ ABSL_GUARDED_BY(mu_) = false;  // this recording's small allocations aside
  int64_t aside_allocations_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status capture_error_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_CUDA_BACKEND_H_
