// Which replica of a logical expert serves a (token, expert) pair when EPLB gave that expert
// several physical slots. A pure function of the token's row in the sending rank's step, the
// sending rank and the expert -- never of timing or of other ranks -- so a step always sends
// the same rows to the same slots. Consecutive tokens of one rank alternate over the replicas,
// and the rank offset spreads the first token of every rank (decode batches of one) too.
#ifndef DEEPINFER_WORKER_MODEL_REPLICA_CHOICE_H_
#define DEEPINFER_WORKER_MODEL_REPLICA_CHOICE_H_

#include <cstdint>

namespace deepinfer {

// In [0, num_replicas); num_replicas >= 1, token_row >= 0, source_rank >= 0, expert >= 0.
inline int64_t ChooseReplica(int64_t token_row, int64_t source_rank, int64_t expert,
                             int64_t num_replicas) {
  return (token_row + source_rank + expert) % num_replicas;
}

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_REPLICA_CHOICE_H_
