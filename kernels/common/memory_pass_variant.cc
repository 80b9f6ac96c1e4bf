#include "kernels/common/memory_pass_variant.h"

#include <atomic>

namespace deepinfer {
namespace kernels {
namespace {

std::atomic<bool> vectorised{true};

}  // namespace

void SetVectorisedMemoryPasses(bool enabled) {
  vectorised.store(enabled, std::memory_order_relaxed);
}

bool VectorisedMemoryPassesEnabled() { return vectorised.load(std::memory_order_relaxed); }

}  // namespace kernels
}  // namespace deepinfer
