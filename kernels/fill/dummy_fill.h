// FillDummyF32 / FillDummyBf16: elements 0..n-1 of a DummyFill (worker/backend/dummy_fill.h)
// written on the device, as fp32 or as bf16 bits rounded to nearest even — the values the host
// computes for the same fill, so a dummy-format model loads in milliseconds instead of being
// generated on the host and uploaded.
#ifndef DEEPINFER_KERNELS_FILL_DUMMY_FILL_H_
#define DEEPINFER_KERNELS_FILL_DUMMY_FILL_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "worker/backend/dummy_fill.h"

namespace deepinfer {
namespace kernels {

cudaError_t FillDummyF32(const DummyFill& fill, int64_t n, float* out, cudaStream_t stream);
cudaError_t FillDummyBf16(const DummyFill& fill, int64_t n, uint16_t* out, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_FILL_DUMMY_FILL_H_
