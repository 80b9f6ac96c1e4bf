// JobManager on a state directory that fills mid-job (SimulatedFullDisk: SQLite's writes fail
// with ENOSPC): results that cannot be stored are kept and stored once each when there is
// room, the job shows why it is stalled and gets no new requests meanwhile, results past the
// limit are refused for the worker to resend, a cancel is refused without changing anything,
// and a coordinator started on the full disk resumes its job.
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/batch/simulated_full_disk.h"
#include "coordinator/job_manager.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// Keeps the requests it is sent until the test takes them.
class FakeWorkers : public WorkerChannel {
 public:
  absl::StatusOr<std::string> PrepareGroup(const std::string&,
                                           const PrepareGroupRequest&) override {
    return std::string("127.0.0.1:9999");
  }
  absl::Status ConfigureGroup(const std::string&, const ConfigureGroupRequest& request) override {
    absl::MutexLock lock(&mu_);
    configured_generation_ = request.generation();
    return absl::OkStatus();
  }
  absl::Status SubmitRequests(const std::string&, const SubmitRequestsRequest& request) override {
    absl::MutexLock lock(&mu_);
    items_.insert(items_.end(), request.items().begin(), request.items().end());
    return absl::OkStatus();
  }
  absl::Status CancelRequests(const std::string&, const CancelRequestsRequest&) override {
    return absl::OkStatus();
  }
  absl::Status SetExpertPlacement(const std::string&, const SetExpertPlacementRequest&) override {
    return absl::OkStatus();
  }

  // Waits (up to 30 s) until at least `n` requests came since the last Take; returns them.
  std::vector<WorkItem> Take(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return items_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
    return std::exchange(items_, {});
  }
  uint64_t configured_generation() {
    absl::MutexLock lock(&mu_);
    return configured_generation_;
  }

 private:
  absl::Mutex mu_;
  std::vector<WorkItem> items_ ABSL_GUARDED_BY(mu_);
  uint64_t configured_generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// A worker's result: the prompt reversed.
RequestResult ResultFor(const WorkItem& item) {
  RequestResult r;
  r.set_request_id(item.request_id());
  for (auto it = item.prompt_token_ids().rbegin(); it != item.prompt_token_ids().rend(); ++it) {
    r.add_token_ids(*it);
  }
  r.set_finish_reason("length");
  r.set_prompt_tokens(item.prompt_token_ids_size());
  return r;
}

// Lines "r0".."r<n-1>" whose prompts are the token ids [i, i + 1].
std::string NumberedJob(int n) {
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    lines.push_back(absl::StrCat(R"({"custom_id": "r)", i,
                                 R"(", "url": "/v1/completions", "body": {"prompt": [)", i, ", ",
                                 i + 1, R"(], "max_tokens": 4, "return_token_ids": true}})"));
  }
  return absl::StrJoin(lines, "\n");
}

class JobManagerFullDiskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/state-",
                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::system(absl::StrCat("rm -rf '", state_dir_, "'").c_str());
    OpenStore();
    StartManager();
  }

  void OpenStore() {
    auto store = BatchJobStore::Open(state_dir_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
  }

  void StartManager(int64_t max_held_bytes = int64_t{1} << 20) {
    manager_.reset();
    JobManagerConfig config;
    config.settle = absl::ZeroDuration();
    config.retry = absl::ZeroDuration();
    config.tick = absl::Milliseconds(5);
    config.max_inflight_per_rank = 4;
    config.model_name = "tiny";
    config.store_writes = {max_held_bytes, absl::Seconds(1), absl::Seconds(4)};
    manager_ = std::make_unique<JobManager>(store_.get(), &prompts_, &registry_, &workers_, &clock_,
                                            config);
    ASSERT_TRUE(manager_->Start().ok());
  }

  // One worker with one rank, serving the first group.
  void StartWorker() {
    WorkerRegistration r;
    r.worker_id = "w1";
    r.worker_incarnation = 1;
    r.listen_address = "w1:1";
    r.devices.emplace_back();
    r.num_ranks = 1;
    ASSERT_TRUE(registry_.Register(r).ok());
    ASSERT_TRUE(registry_.Heartbeat("w1", 1, registry_.coordinator_incarnation()).ok());
    ASSERT_TRUE(WaitFor([&] { return workers_.configured_generation() == 1; }));
    WorkerReport report;
    report.group_generation = 1;
    report.group_status = GROUP_SERVING;
    ASSERT_TRUE(registry_.Heartbeat("w1", 1, registry_.coordinator_incarnation(), report).ok());
  }

  template <typename F>
  bool WaitFor(F done) {
    for (int i = 0; i < 3000 && !done(); ++i) absl::SleepFor(absl::Milliseconds(10));
    return done();
  }

  // Lets the scheduler retry the held writes once more: moves the clock past the longest
  // wait between retries and waits until the store refused another write.
  void RetryOnceMore() {
    const int64_t refused = disk_.refused_writes();
    clock_.Advance(absl::Seconds(4));
    ASSERT_TRUE(WaitFor([&] { return disk_.refused_writes() > refused; }));
  }

  Job GetJob(const std::string& id) { return *manager_->GetJob(id); }

  // Output lines by custom_id; fails on a duplicate.
  std::map<std::string, json> Output(const std::string& id) {
    std::map<std::string, json> out;
    auto lines = manager_->Results(id, 0, 0);
    EXPECT_TRUE(lines.ok()) << lines.status();
    for (const std::string& line : *lines) {
      json j = json::parse(line);
      EXPECT_TRUE(out.emplace(j["custom_id"].get<std::string>(), j).second) << line;
    }
    return out;
  }

  SimulatedFullDisk disk_;
  std::string state_dir_;
  FakeClock clock_;
  WorkerRegistry registry_{&clock_, 77, absl::Seconds(5)};
  PromptBuilder prompts_{ModelLimits{100, 64}, nullptr, nullptr};
  FakeWorkers workers_;
  std::unique_ptr<BatchJobStore> store_;
  std::unique_ptr<JobManager> manager_;
};

TEST_F(JobManagerFullDiskTest, ResultsAreKeptAndStoredOnceEachWhenThereIsRoom) {
  auto id = manager_->Submit("fills", NumberedJob(8));
  ASSERT_TRUE(id.ok()) << id.status();
  StartWorker();
  std::vector<WorkItem> items = workers_.Take(4);  // 4 in flight per rank at most
  ASSERT_EQ(items.size(), 4u);
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[0])}).ok());
  std::vector<WorkItem> more = workers_.Take(1);  // its slot is filled again
  ASSERT_EQ(more.size(), 1u);
  items.push_back(more[0]);
  EXPECT_EQ(GetJob(*id).completed_requests(), 1);

  disk_.set_full(true);
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[1]), ResultFor(items[2])}).ok());
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[1])}).ok());  // a resend
  Job job = GetJob(*id);
  EXPECT_EQ(job.state(), Job::RUNNING);
  EXPECT_EQ(job.completed_requests(), 1);
  EXPECT_EQ(job.running_requests(), 2);  // the held ones are not running any more
  EXPECT_THAT(job.stalled_reason(), HasSubstr("sqlite: database or disk is full"));
  EXPECT_THAT(job.stalled_reason(), HasSubstr("goes on by itself"));
  EXPECT_THAT(manager_->storage_error(), HasSubstr("2 result(s) held in memory"));
  // While results cannot be stored, the free slots get no new requests.
  RetryOnceMore();
  RetryOnceMore();
  EXPECT_TRUE(workers_.Take(0).empty());
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[3])}).ok());

  disk_.set_full(false);
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(WaitFor([&] { return GetJob(*id).completed_requests() == 4; }));
  job = GetJob(*id);
  EXPECT_EQ(job.stalled_reason(), "");
  EXPECT_EQ(manager_->storage_error(), "");
  // Requests flow again.
  std::vector<WorkItem> rest = workers_.Take(3);
  ASSERT_EQ(rest.size(), 3u);
  std::vector<RequestResult> results = {ResultFor(items[4])};
  for (const WorkItem& item : rest) results.push_back(ResultFor(item));
  for (const WorkItem& item : items) results.push_back(ResultFor(item));  // resends, all of them
  ASSERT_TRUE(manager_->OnResults(results).ok());
  job = GetJob(*id);
  EXPECT_EQ(job.state(), Job::COMPLETED);
  EXPECT_EQ(job.completed_requests(), 8);
  std::map<std::string, json> out = Output(*id);
  ASSERT_EQ(out.size(), 8u);
  for (int i = 0; i < 8; ++i) {
    const json& line = out[absl::StrCat("r", i)];
    EXPECT_EQ(line["response"]["body"]["choices"][0]["token_ids"], json({i + 1, i})) << i;
  }
}

TEST_F(JobManagerFullDiskTest, RefusesResultsOnceTheHeldOnesReachTheLimit) {
  StartManager(/*max_held_bytes=*/1);
  auto id = manager_->Submit("limit", NumberedJob(2));
  ASSERT_TRUE(id.ok()) << id.status();
  StartWorker();
  std::vector<WorkItem> items = workers_.Take(2);
  ASSERT_EQ(items.size(), 2u);
  disk_.set_full(true);
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[0])}).ok());  // held, at the limit now
  absl::Status refused = manager_->OnResults({ResultFor(items[1])});
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr("send them again later"));
  EXPECT_EQ(GetJob(*id).running_requests(), 1);  // the refused one is still running
  disk_.set_full(false);
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(WaitFor([&] { return GetJob(*id).completed_requests() == 1; }));
  ASSERT_TRUE(manager_->OnResults({ResultFor(items[1])}).ok());  // the worker sends it again
  EXPECT_EQ(GetJob(*id).state(), Job::COMPLETED);
  EXPECT_EQ(Output(*id).size(), 2u);
}

TEST_F(JobManagerFullDiskTest, StartsOnAFullDiskAndResumesOnceThereIsRoom) {
  auto id = manager_->Submit("resumed", NumberedJob(3));
  ASSERT_TRUE(id.ok()) << id.status();
  auto other = manager_->Submit("cancelled", NumberedJob(1));
  ASSERT_TRUE(other.ok()) << other.status();
  manager_.reset();
  store_.reset();

  disk_.set_full(true);
  OpenStore();
  StartManager();
  EXPECT_EQ(GetJob(*id).state(), Job::QUEUED);
  EXPECT_EQ(GetJob(*id).total_requests(), 3);
  // A cancel needs room: refused, and nothing changes.
  auto cancel = manager_->Cancel(*other);
  EXPECT_TRUE(absl::IsResourceExhausted(cancel.status())) << cancel.status();
  EXPECT_EQ(GetJob(*other).state(), Job::QUEUED);
  StartWorker();
  std::vector<WorkItem> items = workers_.Take(4);
  ASSERT_EQ(items.size(), 4u);
  std::vector<RequestResult> results;
  for (const WorkItem& item : items) results.push_back(ResultFor(item));
  ASSERT_TRUE(manager_->OnResults(results).ok());
  Job job = GetJob(*id);
  EXPECT_EQ(job.state(), Job::RUNNING);  // held, shown as if stored
  EXPECT_EQ(job.completed_requests(), 0);
  EXPECT_THAT(job.stalled_reason(), HasSubstr("database or disk is full"));

  disk_.set_full(false);
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(WaitFor([&] { return GetJob(*id).state() == Job::COMPLETED; }));
  EXPECT_EQ(GetJob(*other).state(), Job::COMPLETED);
  EXPECT_EQ(Output(*id).size(), 3u);
  EXPECT_EQ(Output(*other).size(), 1u);
}

}  // namespace
}  // namespace deepinfer
