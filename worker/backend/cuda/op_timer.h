// CudaBackend::OpTimer and CudaBackend::PhaseTimer: the per-op timing of CudaBackend::SetOpTiming,
// used by every source file of the backend (cuda_backend*.cc); not part of its interface.
#ifndef DEEPINFER_WORKER_BACKEND_CUDA_OP_TIMER_H_
#define DEEPINFER_WORKER_BACKEND_CUDA_OP_TIMER_H_

#include <cuda_runtime_api.h>

#include <chrono>

#include "worker/backend/cuda/cuda_backend.h"

namespace deepinfer {

// RAII guard of one op when op timing is on: synchronises the stream before and after the op
// and adds the time to the op's total (only the outermost op of nested ones).
class CudaBackend::OpTimer {
 public:
  OpTimer(CudaBackend* b, const char* name)
      : b_(b), name_(name), active_(b->op_timing_ && !b->in_timed_op_) {
    if (!active_) return;
    b_->in_timed_op_ = true;
    b_->Check(cudaStreamSynchronize(b_->stream_), "cudaStreamSynchronize");
    start_ = std::chrono::steady_clock::now();
  }
  ~OpTimer() {
    if (!active_) return;
    b_->Check(cudaStreamSynchronize(b_->stream_), "cudaStreamSynchronize");
    OpTotal& t = b_->op_totals_[name_];
    ++t.calls;
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    b_->in_timed_op_ = false;
  }

 private:
  CudaBackend* b_;
  const char* name_;
  bool active_;
  std::chrono::steady_clock::time_point start_;
};

// A phase inside a timed op (op timing on and `active`): synchronises around itself and adds
// its time under its own name ("Op/phase"), which the report lists apart from the op totals.
class CudaBackend::PhaseTimer {
 public:
  PhaseTimer(CudaBackend* b, const char* name, bool active)
      : b_(b), name_(name), active_(active && b->op_timing_) {
    if (!active_) return;
    b_->Check(cudaStreamSynchronize(b_->stream_), "cudaStreamSynchronize");
    start_ = std::chrono::steady_clock::now();
  }
  ~PhaseTimer() {
    if (!active_) return;
    b_->Check(cudaStreamSynchronize(b_->stream_), "cudaStreamSynchronize");
    OpTotal& t = b_->op_totals_[name_];
    ++t.calls;
    t.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }

 private:
  CudaBackend* b_;
  const char* name_;
  bool active_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CUDA_OP_TIMER_H_
