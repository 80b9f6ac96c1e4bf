// The process-wide switch for programmatic dependent launch (PDL) of our own kernels: when on,
// kernels launched through kernels/common/launch.cuh carry
// cudaLaunchAttributeProgrammaticStreamSerialization, so on sm_90+ each may be launched (and run
// the part of its code that reads no earlier kernel's output) while the kernel before it in the
// stream is still finishing; inside a CUDA graph the edges between such kernels are
// programmatic. Plain C++ so that binaries' main.cc files (flags) can set it.
#ifndef DEEPINFER_KERNELS_COMMON_PDL_H_
#define DEEPINFER_KERNELS_COMMON_PDL_H_

namespace deepinfer {
namespace kernels {

// Default on. Takes effect for launches made (or recorded into a graph) after the call; a graph
// recorded earlier keeps the edges it was recorded with.
void SetProgrammaticDependentLaunch(bool enabled);
bool ProgrammaticDependentLaunchEnabled();

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_COMMON_PDL_H_
