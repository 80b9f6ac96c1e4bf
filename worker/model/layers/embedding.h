// TokenEmbedding: the first rows of the residual stream, x[t] = embed_tokens[ids[t]].
#ifndef DEEPINFER_WORKER_MODEL_LAYERS_EMBEDDING_H_
#define DEEPINFER_WORKER_MODEL_LAYERS_EMBEDDING_H_

#include <cstdint>

#include "worker/backend/backend.h"

namespace deepinfer {

class TokenEmbedding {
 public:
  // table: device fp32 [vocab, hidden_size], owned by the caller's weights.
  TokenEmbedding(Backend* backend, const float* table, int64_t hidden_size)
      : backend_(backend), table_(table), hidden_size_(hidden_size) {}
  // ids: device int32 [rows]; x: [rows, hidden_size].
  void Forward(int64_t rows, const int32_t* ids, float* x) const {
    backend_->GatherRows(rows, hidden_size_, table_, ids, x);
  }

 private:
  Backend* const backend_;
  const float* const table_;
  const int64_t hidden_size_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_LAYERS_EMBEDDING_H_
