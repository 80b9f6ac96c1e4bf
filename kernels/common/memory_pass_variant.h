// The process-wide switch between the vectorised memory-bound passes of the prefill path
// (SiLU-mul with fp32 input, the MoE permutation's multi-block plan and by-token gather, the
// combine with its loads issued together, the row gather; docs/kernels.md) and the kernels
// they replaced, kept for before/after measurements in one binary (`deepinfer-bench
// --vectorised-passes=false`, the kernels' benches). Both give the same values bit for bit.
// Plain C++ so that binaries' main.cc files (flags) can set it.
#ifndef DEEPINFER_KERNELS_COMMON_MEMORY_PASS_VARIANT_H_
#define DEEPINFER_KERNELS_COMMON_MEMORY_PASS_VARIANT_H_

namespace deepinfer {
namespace kernels {

// Default on. Takes effect for launches made (or recorded into a graph) after the call.
void SetVectorisedMemoryPasses(bool enabled);
bool VectorisedMemoryPassesEnabled();

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_COMMON_MEMORY_PASS_VARIANT_H_
