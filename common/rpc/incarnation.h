// Incarnation numbers: a random non-zero 64-bit value drawn once per process start.
// Both the coordinator and every worker send theirs on each call, so the other side
// notices a restart even when the process comes back under the same name and port.
#ifndef DEEPINFER_COMMON_RPC_INCARNATION_H_
#define DEEPINFER_COMMON_RPC_INCARNATION_H_

#include <cstdint>

namespace deepinfer {

// Returns a fresh random incarnation (never 0, which means "none" on the wire).
uint64_t NewIncarnation();

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_RPC_INCARNATION_H_
