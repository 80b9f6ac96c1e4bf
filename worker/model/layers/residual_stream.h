// PlainResidualStream: the residual stream of a decoder stack, x += block(norm(x)) for every
// block (attention, MLP or MoE), over `rows` rows of width hidden. With fused ops the add of a
// block's output is deferred into the next norm (Backend::AddRmsNorm), and a block may run that
// norm inside its own first op (ResidualNorm); without them each add and norm is its own op.
// A stream with hyper-connections (several residual copies mixed per block) is a sibling class.
#ifndef DEEPINFER_WORKER_MODEL_LAYERS_RESIDUAL_STREAM_H_
#define DEEPINFER_WORKER_MODEL_LAYERS_RESIDUAL_STREAM_H_

#include <cstdint>
#include <memory>

#include "worker/backend/backend.h"
#include "worker/backend/ops/op_mode.h"

namespace deepinfer {

// The norm in front of a block, for the block to run in its first op: x += y (y null: nothing
// to add), then the normed rows into out (fp32) and out_bf16 (when set; the GEMMs' operand).
struct ResidualNorm {
  float* x = nullptr;
  const float* y = nullptr;
  const float* weight = nullptr;
  float eps = 0.0f;
  float* out = nullptr;
  uint16_t* out_bf16 = nullptr;
};

class PlainResidualStream {
 public:
  // x, block_out: [rows, hidden] device buffers the caller owns (x: the embedded tokens).
  PlainResidualStream(Backend* backend, int64_t rows, int64_t hidden, float eps, OpMode mode,
                      float* x, float* block_out);

  // Where each block writes its output.
  float* block_out() { return y_; }
  // The normed rows a block reads: fp32, and as the GEMMs take them (bf16 with bf16 operands).
  const float* h() const { return h_->as<float>(); }
  ActivationView h_gemm() const;

  // The norm in front of the next block (weight: its norm's). Without fused ops x already holds
  // every block's output: the rows are normed into h now and the result is null. With them the
  // norm is returned for the block to run (it adds the pending output of the block before).
  const ResidualNorm* Norm(const float* weight);
  // After a block wrote block_out(): without fused ops x += it now; with them it is pending
  // (added by the next norm).
  void Add();
  // Whether the last block's output is still to be added to x (the final norm adds it).
  bool pending() const { return pending_; }

 private:
  Backend* const backend_;
  const int64_t rows_, hidden_;
  const float eps_;
  const OpMode mode_;
  float* const x_;
  float* const y_;
  std::unique_ptr<DeviceBuffer> h_, h16_;
  bool pending_ = false;
  ResidualNorm norm_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_LAYERS_RESIDUAL_STREAM_H_
