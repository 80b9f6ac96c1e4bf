// The fixture of the JobManager tests: fake workers that record what the coordinator asks of
// them, a manager over a store in the test's temporary directory, a fake clock, and helpers
// to form a serving group, submit jobs and read their output.
#ifndef DEEPINFER_COORDINATOR_JOB_MANAGER_TEST_FIXTURE_H_
#define DEEPINFER_COORDINATOR_JOB_MANAGER_TEST_FIXTURE_H_

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/expert_balancer.h"
#include "coordinator/job_manager.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace deepinfer {

// Records what the coordinator asks of workers; SubmitRequests items pile up until
// the test takes them.
class FakeWorkers : public WorkerChannel {
 public:
  absl::StatusOr<std::string> PrepareGroup(const std::string& address,
                                           const PrepareGroupRequest& request) override {
    absl::MutexLock lock(&mu_);
    prepared_.push_back(address);
    return std::string("127.0.0.1:9999");
  }
  absl::Status ConfigureGroup(const std::string& address,
                              const ConfigureGroupRequest& request) override {
    absl::MutexLock lock(&mu_);
    configured_.push_back({address, request});
    return absl::OkStatus();
  }
  absl::Status SubmitRequests(const std::string& address,
                              const SubmitRequestsRequest& request) override {
    absl::MutexLock lock(&mu_);
    if (address == refuse_address_) return absl::UnavailableError("worker is gone");
    for (const WorkItem& item : request.items()) items_.push_back({address, item});
    return absl::OkStatus();
  }
  absl::Status CancelRequests(const std::string& address,
                              const CancelRequestsRequest& request) override {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : request.request_ids()) cancelled_.push_back(id);
    return absl::OkStatus();
  }

  absl::Status SetExpertPlacement(const std::string& address,
                                  const SetExpertPlacementRequest& request) override {
    absl::MutexLock lock(&mu_);
    placements_.push_back({address, request});
    return absl::OkStatus();
  }
  std::vector<std::pair<std::string, SetExpertPlacementRequest>> placements() {
    absl::MutexLock lock(&mu_);
    return placements_;
  }

  // Waits until at least `n` items were submitted in total (since the last Take).
  std::vector<std::pair<std::string, WorkItem>> Take(size_t n) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, n]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return items_.size() >= n; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(30));
    auto out = std::move(items_);
    items_.clear();
    return out;
  }
  std::vector<std::pair<std::string, ConfigureGroupRequest>> configured() {
    absl::MutexLock lock(&mu_);
    return configured_;
  }
  void Refuse(const std::string& address) {
    absl::MutexLock lock(&mu_);
    refuse_address_ = address;
  }
  std::vector<std::string> cancelled() {
    absl::MutexLock lock(&mu_);
    return cancelled_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::string> prepared_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, ConfigureGroupRequest>> configured_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, SetExpertPlacementRequest>> placements_ ABSL_GUARDED_BY(mu_);
  std::vector<std::pair<std::string, WorkItem>> items_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> cancelled_ ABSL_GUARDED_BY(mu_);
  std::string refuse_address_ ABSL_GUARDED_BY(mu_);
};

// A worker's result for `item`: its prompt reversed, so the test can tell results apart.
inline RequestResult ResultFor(const WorkItem& item) {
  RequestResult r;
  r.set_request_id(item.request_id());
  for (auto it = item.prompt_token_ids().rbegin(); it != item.prompt_token_ids().rend(); ++it) {
    r.add_token_ids(*it);
  }
  r.set_finish_reason("length");
  r.set_prompt_tokens(item.prompt_token_ids_size());
  return r;
}

inline std::string Line(const std::string& custom_id, const std::string& prompt) {
  return absl::StrCat(R"({"custom_id": ")", custom_id,
                      R"(", "method": "POST", "url": "/v1/completions", "body": {"prompt": )",
                      prompt, R"(, "max_tokens": 4, "return_token_ids": true}})");
}

class JobManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = absl::StrCat(std::getenv("TEST_TMPDIR"), "/state-",
                              ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::system(absl::StrCat("rm -rf '", state_dir_, "'").c_str());
    store_ = std::move(*BatchJobStore::Open(state_dir_));
    StartManager();
  }

  // With `eplb`, the manager gets an ExpertBalancer (balancer_) of that configuration.
  void StartManager(int min_workers = 1, std::optional<ExpertBalancerConfig> eplb = std::nullopt) {
    manager_.reset();
    balancer_.reset();
    if (eplb.has_value()) balancer_ = std::make_unique<ExpertBalancer>(*std::move(eplb));
    JobManagerConfig config;
    config.min_workers = min_workers;
    config.settle = absl::ZeroDuration();
    config.retry = absl::ZeroDuration();
    config.regroup_delay = absl::Seconds(6);
    config.tick = absl::Milliseconds(5);
    config.model_name = "tiny";
    config.validation = validation_;
    config.queued_in_memory = queued_in_memory_;
    config.max_inflight_per_rank = max_inflight_per_rank_;
    manager_ = std::make_unique<JobManager>(store_.get(), &prompts_, &registry_, &workers_, &clock_,
                                            config);
    manager_->set_expert_balancer(balancer_.get());
    ASSERT_TRUE(manager_->Start().ok());
  }

  void AddWorker(const std::string& id, uint64_t incarnation, int ranks) {
    WorkerRegistration r;
    r.worker_id = id;
    r.worker_incarnation = incarnation;
    r.listen_address = id + ":1";
    r.devices.emplace_back();
    r.num_ranks = ranks;
    ASSERT_TRUE(registry_.Register(r).ok());
    ASSERT_TRUE(registry_.Heartbeat(id, incarnation, registry_.coordinator_incarnation()).ok());
  }

  // Heartbeats every worker in `ids` with "serving generation g" once the manager
  // configured that generation.
  void ServeWhenConfigured(const std::vector<std::pair<std::string, uint64_t>>& ids,
                           uint64_t generation) {
    ASSERT_TRUE(WaitFor([&] {
      for (const auto& [address, c] : workers_.configured()) {
        if (c.generation() == generation) return true;
      }
      return false;
    }));
    for (const auto& [id, incarnation] : ids) {
      WorkerReport report;
      report.group_generation = generation;
      report.group_status = GROUP_SERVING;
      ASSERT_TRUE(
          registry_.Heartbeat(id, incarnation, registry_.coordinator_incarnation(), report).ok());
    }
  }

  template <typename F>
  bool WaitFor(F done) {
    for (int i = 0; i < 3000 && !done(); ++i) absl::SleepFor(absl::Milliseconds(10));
    return done();
  }

  Job GetJob(const std::string& id) { return *manager_->GetJob(id); }

  // Submits and waits until the input is validated (the job is past VALIDATING).
  absl::StatusOr<std::string> Submit(const std::string& name, const std::string& input) {
    absl::StatusOr<std::string> id = manager_->Submit(name, input);
    if (id.ok()) WaitValidated(*id);
    return id;
  }
  void WaitValidated(const std::string& id) {
    EXPECT_TRUE(WaitFor([&] { return GetJob(id).state() != Job::VALIDATING; })) << id;
  }

  // Lines "r0".."r<n-1>" whose prompts are the token ids [i].
  static std::vector<std::string> NumberedLines(int n) {
    std::vector<std::string> lines;
    for (int i = 0; i < n; ++i) {
      lines.push_back(Line(absl::StrCat("r", i), absl::StrCat("[", i, "]")));
    }
    return lines;
  }

  std::vector<nlohmann::json> Output(const std::string& id) {
    std::vector<nlohmann::json> out;
    auto lines = manager_->Results(id, 0, 0);
    EXPECT_TRUE(lines.ok()) << lines.status();
    for (const std::string& line : *lines) out.push_back(nlohmann::json::parse(line));
    return out;
  }

  // Set before StartManager.
  JobValidatorConfig validation_;
  int64_t queued_in_memory_ = 4096;
  int max_inflight_per_rank_ = 256;

  std::string state_dir_;
  FakeClock clock_;
  WorkerRegistry registry_{&clock_, 77, absl::Seconds(5)};
  PromptBuilder prompts_{ModelLimits{100, 64}, nullptr, nullptr};
  FakeWorkers workers_;
  std::unique_ptr<BatchJobStore> store_;
  // Declared before manager_, so destroyed after it: the manager's scheduler thread uses the
  // balancer on every tick until the manager is destroyed. Objects in a test's body are gone
  // before the fixture destroys the manager, so nothing the manager keeps may live there.
  std::unique_ptr<ExpertBalancer> balancer_;
  std::unique_ptr<JobManager> manager_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_JOB_MANAGER_TEST_FIXTURE_H_
