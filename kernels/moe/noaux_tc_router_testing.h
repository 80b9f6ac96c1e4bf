// Host-side helpers for the noaux_tc router tests (noaux_tc_router_test,
// noaux_tc_router_fused_test).
#ifndef DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_TESTING_H_
#define DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_TESTING_H_

#include <algorithm>
#include <cmath>
#include <vector>

namespace deepinfer {
namespace testing {

// Smallest gap, in the host's double-precision view of one token's biased scores
// (sigmoid(logit) + bias), at the two decisions that matter: the last kept group vs the first
// dropped one (groups scored by their best two), and the k-th kept expert vs the next. Tests
// accept a different choice only where this is tiny (a near-tie).
inline double NoauxTcDecisionMargin(const float* logits, const float* bias, int experts,
                                    int groups, int topk_groups, int top_k) {
  const int per = experts / groups;
  std::vector<double> choice(experts), group(groups);
  for (int x = 0; x < experts; ++x) {
    choice[x] = 1.0 / (1.0 + std::exp(-static_cast<double>(logits[x]))) + bias[x];
  }
  for (int g = 0; g < groups; ++g) {
    std::vector<double> v(choice.begin() + g * per, choice.begin() + (g + 1) * per);
    std::sort(v.rbegin(), v.rend());
    group[g] = per >= 2 ? v[0] + v[1] : v[0];
  }
  std::vector<double> sorted_groups = group;
  std::sort(sorted_groups.rbegin(), sorted_groups.rend());
  double margin = 1e9;
  if (topk_groups < groups) {
    margin = sorted_groups[topk_groups - 1] - sorted_groups[topk_groups];
  }
  std::vector<double> kept;
  for (int x = 0; x < experts; ++x) {
    if (group[x / per] >= sorted_groups[topk_groups - 1]) kept.push_back(choice[x]);
  }
  std::sort(kept.rbegin(), kept.rend());
  if (top_k < static_cast<int>(kept.size())) {
    margin = std::min(margin, kept[top_k - 1] - kept[top_k]);
  }
  return margin;
}

}  // namespace testing
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_TESTING_H_
