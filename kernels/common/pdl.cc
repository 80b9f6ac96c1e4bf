#include "kernels/common/pdl.h"

#include <atomic>

namespace deepinfer {
namespace kernels {
namespace {

std::atomic<bool> pdl_enabled{true};

}  // namespace

void SetProgrammaticDependentLaunch(bool enabled) {
  pdl_enabled.store(enabled, std::memory_order_relaxed);
}

bool ProgrammaticDependentLaunchEnabled() { return pdl_enabled.load(std::memory_order_relaxed); }

}  // namespace kernels
}  // namespace deepinfer
