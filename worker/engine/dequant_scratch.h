// The device scratch a rank reserves, beside its activation reserve, for widening weights kept
// in a stored low precision to bf16 at prefill sizes, and for the FP8 shared experts' copies the
// decode path makes. The rank builder adds it to the memory
// plan's reserve and `deepinfer-admin memory-plan` reports it, both through DequantScratchOf.
#ifndef DEEPINFER_WORKER_ENGINE_DEQUANT_SCRATCH_H_
#define DEEPINFER_WORKER_ENGINE_DEQUANT_SCRATCH_H_

#include <cstdint>

#include "worker/model/architecture.h"
#include "worker/model/model_config.h"

namespace deepinfer {

struct DequantScratch {
  // The largest FP8 projection or MLP matrix as bf16 (ModelWeights::Fp8DequantScratchBytes).
  int64_t fp8_bytes = 0;
  // One group of MXFP4 routed experts as bf16 (Mxfp4DequantScratchBytes, backend.h).
  int64_t mxfp4_bytes = 0;
  // The FP8 shared experts' gate_up as n_shared_experts parts of moe_intermediate_size rows each
  // (gate rows then up rows), copied once per MoE layer for the decode swap path's grouped GEMMs
  // (CudaBackend::Fp8SwapSharedGroups; none with one shared expert, which is read in place). The
  // copies' elements only: their per-part scales and tables are a few KB a layer.
  int64_t shared_expert_copy_bytes = 0;

  int64_t total() const { return fp8_bytes + mxfp4_bytes + shared_expert_copy_bytes; }
};

// `keep_fp8`: the precision keeps the checkpoint's FP8 matrices where the architecture does
// (KeepsCheckpointFp8: CUDA with --dtype auto or mxfp4); the FP8 term is counted only when
// `arch.keeps_fp8` as well. `mxfp4_experts`: the precision keeps the routed experts MXFP4
// (KeepsExpertsMxfp4: CUDA with --dtype mxfp4); the MXFP4 term is counted only when
// `arch.keeps_mxfp4_experts` as well, for all config.n_routed_experts (the engine runs MXFP4
// experts on one rank hosting every expert). The shared-expert term: keep_fp8, arch.keeps_fp8,
// FP8 routed experts (not mxfp4_experts) and n_shared_experts > 1, for every MoE layer of the
// main model and of its num_draft_layers draft layers.
DequantScratch DequantScratchOf(const ModelConfig& config, const Architecture& arch, bool keep_fp8,
                                bool mxfp4_experts);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_DEQUANT_SCRATCH_H_
