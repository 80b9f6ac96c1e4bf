// MoE ops: the routed experts of one rank that hosts every expert, with the shared experts, as
// one call. Where the backend has the whole block as one op for the arguments
// (Backend::RoutedAndSharedExperts, fused ops only) the call runs it; otherwise the backend's
// routed-expert op (Backend::RoutedExperts) and then the shared MLP (mlp_ops.h), as HF and
// DeepSeek add them. The routing itself is Backend::RouteTokens (one op whose default is its
// reference composition).
#ifndef DEEPINFER_WORKER_BACKEND_OPS_MOE_OPS_H_
#define DEEPINFER_WORKER_BACKEND_OPS_MOE_OPS_H_

#include "worker/backend/backend.h"
#include "worker/backend/ops/op_mode.h"

namespace deepinfer {

// a.out = routed experts (+ the shared MLP of shared_in when a.shared_inter > 0). shared_in: the
// same rows as a.hidden, as the shared MLP's GEMMs take them (bf16 with mode.bf16_operands).
// Returns false, having done nothing, where the backend cannot run these routed experts on the
// device at all: that is not a fused-versus-reference choice but where the experts live, and
// the caller then goes through its ExpertDispatcher (which may be expert-parallel).
bool ExpertsOnDevice(Backend* backend, const RoutedExpertsArgs& a, ActivationView shared_in,
                     OpMode mode);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_OPS_MOE_OPS_H_
