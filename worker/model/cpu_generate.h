// GenerateGreedyOnCpu: the smallest end-to-end entry point (for the `deepinfer` CLI and smoke
// tests): load a model on the CPU backend and greedily extend one prompt of token ids,
// prefill once and then one token per step through the paged latent KV cache.
#ifndef DEEPINFER_WORKER_MODEL_CPU_GENERATE_H_
#define DEEPINFER_WORKER_MODEL_CPU_GENERATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace deepinfer {

// model: checkpoint directory or "dummy:<config.json>[@seed]" (see model_loader.h).
// Returns the max_new_tokens generated ids (the prompt is not repeated).
// num_threads <= 0: one per hardware thread.
absl::StatusOr<std::vector<int32_t>> GenerateGreedyOnCpu(const std::string& model,
                                                         const std::vector<int32_t>& prompt,
                                                         int32_t max_new_tokens,
                                                         int num_threads = 0);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_CPU_GENERATE_H_
