// ChooseReplica: in range, deterministic, spreads a rank's tokens and ranks' first tokens evenly.
#include "worker/model/replica_choice.h"

#include <vector>

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(ReplicaChoiceTest, OneReplicaIsAlwaysReplicaZero) {
  for (int64_t t = 0; t < 50; ++t) {
    for (int64_t r = 0; r < 4; ++r) EXPECT_EQ(ChooseReplica(t, r, 17, 1), 0);
  }
}

TEST(ReplicaChoiceTest, InRangeAndDeterministic) {
  for (int64_t n = 1; n <= 5; ++n) {
    for (int64_t t = 0; t < 40; ++t) {
      for (int64_t r = 0; r < 8; ++r) {
        for (int64_t e = 0; e < 16; ++e) {
          const int64_t c = ChooseReplica(t, r, e, n);
          EXPECT_GE(c, 0);
          EXPECT_LT(c, n);
          EXPECT_EQ(c, ChooseReplica(t, r, e, n));
        }
      }
    }
  }
}

TEST(ReplicaChoiceTest, ConsecutiveTokensOfARankSpreadEvenly) {
  // 12 tokens of one rank on an expert with 3 replicas: 4 each, whatever the rank and expert.
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t e = 0; e < 5; ++e) {
      std::vector<int> used(3, 0);
      for (int64_t t = 0; t < 12; ++t) ++used[ChooseReplica(t, r, e, 3)];
      EXPECT_EQ(used, (std::vector<int>{4, 4, 4})) << "rank " << r << " expert " << e;
    }
  }
}

TEST(ReplicaChoiceTest, FirstTokenOfEachRankSpreadsOverReplicas) {
  // Decode with one sequence per rank: every rank's row 0. Four ranks, two replicas: 2 and 2.
  std::vector<int> used(2, 0);
  for (int64_t r = 0; r < 4; ++r) ++used[ChooseReplica(0, r, 9, 2)];
  EXPECT_EQ(used, (std::vector<int>{2, 2}));
}

}  // namespace
}  // namespace deepinfer
