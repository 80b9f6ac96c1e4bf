// DequantScratchOf: the dequantisation scratch terms of a rank's memory plan.
#include "worker/engine/dequant_scratch.h"

#include <string>

#include "worker/backend/backend.h"
#include "worker/model/model_weights.h"

namespace deepinfer {

DequantScratch DequantScratchOf(const ModelConfig& config, const Architecture& arch, bool keep_fp8,
                                bool mxfp4_experts) {
  DequantScratch s;
  if (keep_fp8 && arch.keeps_fp8) {
    // An upper bound that counts every matrix as FP8 (model_weights.h), so any keep_fp8 will do.
    LoadOptions load;
    load.keep_fp8 = [](const std::string&) { return true; };
    s.fp8_bytes = ModelWeights::Fp8DequantScratchBytes(config, load);
  }
  if (keep_fp8 && arch.keeps_fp8 && !mxfp4_experts && config.n_shared_experts > 1) {
    int64_t moe_layers = 0;
    for (int64_t l = 0; l < config.num_hidden_layers + config.num_draft_layers; ++l) {
      if (config.IsMoeLayer(l)) ++moe_layers;
    }
    s.shared_expert_copy_bytes = moe_layers * 2 * config.n_shared_experts *
                                 config.moe_intermediate_size * config.hidden_size;
  }
  if (mxfp4_experts && arch.keeps_mxfp4_experts) {
    s.mxfp4_bytes = Mxfp4DequantScratchBytes(config.n_routed_experts, config.hidden_size,
                                             config.moe_intermediate_size);
  }
  return s;
}

}  // namespace deepinfer
