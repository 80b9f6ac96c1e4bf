// MoE ops: the whole block as one op where the backend has it, else routed then shared.
#include "worker/backend/ops/moe_ops.h"

#include "worker/backend/ops/mlp_ops.h"

namespace deepinfer {

bool ExpertsOnDevice(Backend* backend, const RoutedExpertsArgs& a, ActivationView shared_in,
                     OpMode mode) {
  // The op-by-op mode keeps the separate shared-expert ops.
  if (mode.fused && a.shared_inter > 0 && backend->RoutedAndSharedExperts(a)) return true;
  if (!backend->RoutedExperts(a)) return false;
  if (a.shared_inter > 0) {
    const SwiGluWeights shared{a.shared_inter, a.SharedGateUp(), a.SharedDown()};
    AddSwiGlu(backend, a.num_tokens, a.hidden_size, shared, shared_in, a.out, mode);
  }
  return true;
}

}  // namespace deepinfer
