#include "tools/admin/cluster_status_format.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

ClusterStatusResponse TwoWorkers() {
  ClusterStatusResponse status;
  status.set_coordinator_incarnation(0xabc);
  status.set_coordinator_uptime_ms(12000);
  WorkerStatus* a = status.add_workers();
  a->set_worker_id("node-a:4000");
  a->set_state(READY);
  a->set_node_name("node-a");
  a->set_listen_address("10.0.0.1:4000");
  for (int i = 0; i < 8; ++i) {
    Device* d = a->add_devices();
    d->set_kind(Device::CUDA);
    d->set_index(i);
    d->set_name("NVIDIA H200");
  }
  a->set_last_seen_ms_ago(250);
  WorkerStatus* b = status.add_workers();
  b->set_worker_id("node-b:4000");
  b->set_state(LOST);
  b->add_devices()->set_kind(Device::CPU);
  b->set_last_seen_ms_ago(9000);
  b->set_restarts(2);
  return status;
}

TEST(ClusterStatusFormatTest, TableHasOneRowPerWorkerAndStateCounts) {
  std::string table = FormatClusterStatusTable(TwoWorkers());
  EXPECT_THAT(table, HasSubstr("2 worker(s)"));
  EXPECT_THAT(table, HasSubstr("WORKER"));
  EXPECT_THAT(table, HasSubstr("node-a:4000  READY"));
  EXPECT_THAT(table, HasSubstr("8x NVIDIA H200"));
  EXPECT_THAT(table, HasSubstr("1x cpu"));
  EXPECT_THAT(table, HasSubstr("9.0s ago"));
  EXPECT_THAT(table, HasSubstr("1 LOST, 1 READY"));
}

TEST(ClusterStatusFormatTest, TableSaysWhyTheGroupCouldNotForm) {
  ClusterStatusResponse status = TwoWorkers();
  EXPECT_THAT(FormatClusterStatusTable(status), Not(HasSubstr("group")));
  status.set_group_generation(3);
  status.set_group_formation_error("worker w reports the group failed: rank 0: out of memory");
  EXPECT_THAT(FormatClusterStatusTable(status),
              AllOf(HasSubstr("group generation 3: not serving\n"),
                    HasSubstr("the group could not form: worker w reports the group failed: rank "
                              "0: out of memory\n")));
  status.set_group_serving(true);
  status.clear_group_formation_error();
  EXPECT_THAT(FormatClusterStatusTable(status), HasSubstr("group generation 3: serving\n"));
}

TEST(ClusterStatusFormatTest, TableSaysWhatTheStateDirectoryDoesNotTake) {
  ClusterStatusResponse status = TwoWorkers();
  EXPECT_THAT(FormatClusterStatusTable(status), Not(HasSubstr("state directory")));
  status.set_storage_error("3 result(s) held in memory (1 KiB): sqlite: database or disk is full");
  EXPECT_THAT(FormatClusterStatusTable(status),
              HasSubstr("state directory: 3 result(s) held in memory (1 KiB): sqlite: database or "
                        "disk is full\n"));
}

TEST(ClusterStatusFormatTest, RanksShowTheExchangeAndTheDataParallelBalance) {
  ClusterStatusResponse status = TwoWorkers();
  EXPECT_THAT(FormatClusterStatusTable(status), Not(HasSubstr("RANK")));
  RankLoad* r0 = status.mutable_workers(0)->add_rank_loads();
  r0->set_rank(0);
  r0->set_running_requests(12);
  r0->set_kv_blocks_used(30);
  r0->set_kv_blocks_total(120);
  r0->set_expert_exchange("device exchange (low latency)");
  r0->set_window_steps(64);
  r0->set_window_step_tokens_mean(30.0);
  r0->set_window_step_tokens_max(40);
  r0->set_decode_batch(11);
  RankLoad* r1 = status.mutable_workers(0)->add_rank_loads();
  r1->set_rank(1);
  r1->set_window_steps(64);
  r1->set_window_step_tokens_mean(10.0);
  r1->set_window_step_tokens_max(16);
  const std::string table = FormatClusterStatusTable(status);
  EXPECT_THAT(table, HasSubstr("EXPERT EXCHANGE"));
  EXPECT_THAT(table, HasSubstr("device exchange (low latency)"));
  EXPECT_THAT(table, HasSubstr("30/120 (25%)"));
  // Means 30 and 10: mean of the ranks 20, busiest 30, ratio 1.50.
  EXPECT_THAT(table, HasSubstr("data-parallel balance: max/mean tokens per step 1.50 (rank 0 "
                               "busiest: 30.0, mean of 2 ranks 20.0)"));
}

TEST(ClusterStatusFormatTest, EmptyClusterSaysSo) {
  ClusterStatusResponse status;
  EXPECT_THAT(FormatClusterStatusTable(status), HasSubstr("0 worker(s)"));
}

TEST(ClusterStatusFormatTest, JsonParsesWithEnumNames) {
  auto json = nlohmann::json::parse(FormatClusterStatusJson(TwoWorkers()), nullptr, false);
  ASSERT_FALSE(json.is_discarded());
  ASSERT_EQ(json["workers"].size(), 2u);
  EXPECT_EQ(json["workers"][0]["state"], "READY");
  EXPECT_EQ(json["workers"][1]["restarts"], 2);
}

}  // namespace
}  // namespace deepinfer
