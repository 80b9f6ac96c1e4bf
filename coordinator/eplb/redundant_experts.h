// How many redundant (extra) physical expert slots a deployment has per MoE layer, and
// whether logical plus redundant experts spread evenly over the ranks. The count comes
// from, in order: the environment variable DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS (an
// operator's override, so it wins over any flag), the --num-redundant-experts flag, and
// the default 32 (the figure DeepSeek and vLLM use at scale).
#ifndef DEEPINFER_COORDINATOR_EPLB_REDUNDANT_EXPERTS_H_
#define DEEPINFER_COORDINATOR_EPLB_REDUNDANT_EXPERTS_H_

#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace deepinfer {

inline constexpr int kDefaultNumRedundantExperts = 32;
inline constexpr char kOverrideNumExtraExpertsEnv[] = "DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS";
// Far above any real deployment (32 is the usual figure at scale); keeps plans
// of absurd sizes from exhausting memory or time.
inline constexpr int kMaxRedundantExperts = 4096;

// `flag_value`: the flag's value, nullopt when it was not given. `env_value`: the
// environment variable's value, nullptr when unset; an empty value counts as unset.
// INVALID_ARGUMENT naming the source when the chosen value is not an integer in
// [0, kMaxRedundantExperts].
absl::StatusOr<int> ResolveNumRedundantExperts(std::optional<int64_t> flag_value,
                                               const char* env_value);

// As above, reading DEEPINFER_OVERRIDE_NUM_EXTRA_EXPERTS from this process's environment.
absl::StatusOr<int> ResolveNumRedundantExpertsFromEnv(std::optional<int64_t> flag_value);

// INVALID_ARGUMENT unless num_logical + num_redundant physical experts divide evenly over
// num_ranks; the message names the nearest redundant-expert counts that would.
absl::Status CheckExpertsDivideOverRanks(int num_logical, int num_redundant, int num_ranks);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_EPLB_REDUNDANT_EXPERTS_H_
