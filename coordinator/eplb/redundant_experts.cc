#include "coordinator/eplb/redundant_experts.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"

namespace deepinfer {
namespace {

absl::Status CheckRange(int64_t value, absl::string_view source) {
  if (value < 0 || value > kMaxRedundantExperts) {
    return absl::InvalidArgumentError(absl::StrCat(source, " = ", value,
                                                   ": the number of redundant experts must be "
                                                   "between 0 and ",
                                                   kMaxRedundantExperts));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int> ResolveNumRedundantExperts(std::optional<int64_t> flag_value,
                                               const char* env_value) {
  if (env_value != nullptr && env_value[0] != '\0') {
    int64_t value = 0;
    if (!absl::SimpleAtoi(env_value, &value)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kOverrideNumExtraExpertsEnv, "=\"", env_value,
                       "\" is not an integer; set it to the number of redundant experts (e.g. ",
                       kDefaultNumRedundantExperts, ") or unset it"));
    }
    if (absl::Status s = CheckRange(value, kOverrideNumExtraExpertsEnv); !s.ok()) return s;
    return static_cast<int>(value);
  }
  if (flag_value.has_value()) {
    if (absl::Status s = CheckRange(*flag_value, "--num-redundant-experts"); !s.ok()) return s;
    return static_cast<int>(*flag_value);
  }
  return kDefaultNumRedundantExperts;
}

absl::StatusOr<int> ResolveNumRedundantExpertsFromEnv(std::optional<int64_t> flag_value) {
  return ResolveNumRedundantExperts(flag_value, std::getenv(kOverrideNumExtraExpertsEnv));
}

absl::Status CheckExpertsDivideOverRanks(int num_logical, int num_redundant, int num_ranks) {
  if (num_logical <= 0 || num_ranks <= 0 || num_redundant < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "need at least one logical expert and one rank and no negative redundant count; got ",
        num_logical, " logical experts, ", num_redundant, " redundant, ", num_ranks, " ranks"));
  }
  const int64_t physical = static_cast<int64_t>(num_logical) + num_redundant;
  if (physical % num_ranks == 0) return absl::OkStatus();
  // The redundant counts just below and just above that make the total a multiple of the
  // rank count; the one below only if it is not negative.
  const int64_t up = physical / num_ranks * num_ranks + num_ranks;
  const int64_t down = up - num_ranks;
  std::vector<std::string> options;
  if (down - num_logical >= 0) {
    options.push_back(absl::StrCat(down - num_logical, " redundant (", down, " physical, ",
                                   down / num_ranks, " per rank)"));
  }
  options.push_back(absl::StrCat(up - num_logical, " redundant (", up, " physical, ",
                                 up / num_ranks, " per rank)"));
  return absl::InvalidArgumentError(
      absl::StrCat(physical, " physical experts (", num_logical, " logical + ", num_redundant,
                   " redundant) do not divide evenly over ", num_ranks,
                   " ranks; nearest that work: ", absl::StrJoin(options, " or ")));
}

}  // namespace deepinfer
