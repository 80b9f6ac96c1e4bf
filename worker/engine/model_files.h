// ModelFiles: what a worker reads from its model before any rank loads weights: the config,
// the end-of-sequence ids, and the tokenizer when the directory has one. Opening it checks
// that the model is usable (config parses, checkpoint headers are valid, tokenizer loads), so
// a worker with a bad --model refuses to start with a message naming the problem instead of
// failing later inside ConfigureGroup.
#ifndef DEEPINFER_WORKER_ENGINE_MODEL_FILES_H_
#define DEEPINFER_WORKER_ENGINE_MODEL_FILES_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tokenizer/tokenizer.h"
#include "worker/model/model_config.h"

namespace deepinfer {

struct ModelFiles {
  // `spec` is a checkpoint directory or "dummy:<config.json>[@seed]" (see model_loader.h).
  static absl::StatusOr<std::unique_ptr<ModelFiles>> Open(const std::string& spec);

  std::string spec;
  // Directory holding config.json (and, if any, the tokenizer and generation_config.json).
  std::string dir;
  ModelConfig config;
  // generation_config.json's eos_token_id (a number or a list), else config.json's, else the
  // tokenizer's eos_token. Empty when none is named: only stop conditions end a request.
  std::vector<int32_t> eos_token_ids;
  // Null when the directory has no tokenizer.json.
  std::unique_ptr<tokenizer::Tokenizer> tokenizer;
  // The model's identity in the prefix cache's key (docs/kv-cache.md): hashes of config.json's
  // bytes and of the checkpoint's *.safetensors names and sizes (dummy weights: of the seed).
  // Not a hash of the weights themselves (a checkpoint rewritten with same-sized files looks
  // the same); independent of where the directory is.
  std::string fingerprint;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_ENGINE_MODEL_FILES_H_
