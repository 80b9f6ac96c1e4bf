// DummyFill: how the `dummy` load format makes a tensor's values — every element the same
// constant, or uniform in [-amplitude, amplitude) from the counter-based generator under a
// per-tensor key — so element i is a pure function of (fill, i). One definition for the host
// and nvcc: Backend::FillDummy can generate a weight where it lives (the CUDA backend in a
// kernel) with exactly the bits DummyWeightSource computes on the host.
#ifndef DEEPINFER_WORKER_BACKEND_DUMMY_FILL_H_
#define DEEPINFER_WORKER_BACKEND_DUMMY_FILL_H_

#include <cstdint>

#include "worker/sampling/counter_rng.h"

namespace deepinfer {

struct DummyFill {
  bool constant = false;
  float value = 0.0f;  // when constant
  uint64_t key = 0;    // otherwise: the generator's key and the values' bound
  float amplitude = 0.0f;
};

// Element i of the tensor `fill` describes. (2u - 1) is exact, so a fused multiply-add on the
// device rounds it the same way as the host's two operations.
DEEPINFER_HOST_DEVICE float DummyFillValue(const DummyFill& fill, int64_t i) {
  return fill.constant ? fill.value
                       : (2.0f * CounterUniform(fill.key, 0, i) - 1.0f) * fill.amplitude;
}

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_DUMMY_FILL_H_
