// A job's input on its way through validation, against fake workers
// (job_manager_test_fixture.h): progress chunk by chunk, a restart during validation that goes
// on from the last committed chunk, jobs whose validation cannot go on, and queued requests
// that stay in the store until the scheduler sends them.
#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_manager.h"
#include "coordinator/job_manager_test_fixture.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using json = nlohmann::json;

// What the validator's hook saw of a job before each chunk.
struct Seen {
  Job::State state;
  int64_t validated;
  int64_t failed;
};

class JobValidationTest : public JobManagerTest {
 protected:
  // Lines r0..r<n-1> (prompt [i]); every 7th line is not JSON, and line 33 (if there is one)
  // reuses r2's custom id, so that the duplicate lies chunks after the first use.
  static std::string Input(int n) {
    std::vector<std::string> lines = NumberedLines(n);
    for (int i = 6; i < n; i += 7) lines[i] = "not json";
    if (n > 33) lines[32] = Line("r2", "[5]");
    return absl::StrJoin(lines, "\n") + "\n";
  }

  // Every request handed out until the job ends, answered; returns the line numbers sent.
  std::multiset<int64_t> RunToTheEnd(const std::string& id, size_t expected) {
    std::multiset<int64_t> lines;
    while (lines.size() < expected) {
      auto items = workers_.Take(1);
      if (items.empty()) break;
      std::vector<RequestResult> results;
      for (const auto& [address, item] : items) {
        results.push_back(ResultFor(item));
        lines.insert(std::stoll(item.request_id().substr(item.request_id().rfind(':') + 1)));
      }
      EXPECT_TRUE(manager_->OnResults(results).ok());
    }
    EXPECT_TRUE(WaitFor([&] { return GetJob(id).state() == Job::COMPLETED; }))
        << Job::State_Name(GetJob(id).state());
    return lines;
  }

  absl::Mutex mu_;
  std::vector<Seen> seen_ ABSL_GUARDED_BY(mu_);
  int calls_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST_F(JobValidationTest, ProgressMovesChunkByChunk) {
  validation_.chunk_lines = 10;
  validation_.before_chunk = [this](const std::string& id) {
    Job job = *manager_->GetJob(id);
    absl::MutexLock lock(&mu_);
    seen_.push_back({job.state(), job.validated_requests(), job.failed_requests()});
    return true;
  };
  StartManager();
  auto id = manager_->Submit("progress", Input(35));
  ASSERT_TRUE(id.ok()) << id.status();
  WaitValidated(*id);
  Job job = GetJob(*id);
  EXPECT_EQ(job.state(), Job::QUEUED);
  EXPECT_EQ(job.total_requests(), 35);
  EXPECT_EQ(job.validated_requests(), 35);
  EXPECT_EQ(job.failed_requests(), 5 + 1);  // lines 7, 14, 21, 28, 35, and the duplicate
  absl::MutexLock lock(&mu_);
  ASSERT_EQ(seen_.size(), 4u);
  for (size_t i = 0; i < seen_.size(); ++i) {
    EXPECT_EQ(seen_[i].state, Job::VALIDATING);
    EXPECT_EQ(seen_[i].validated, static_cast<int64_t>(10 * i));
  }
  // Error lines are answered as their chunk is committed.
  EXPECT_EQ(seen_[1].failed, 1);
  EXPECT_EQ(seen_[3].failed, 4);  // lines 7, 14, 21, 28
}

TEST_F(JobValidationTest, ARestartDuringValidationGoesOnFromTheLastChunk) {
  validation_.chunk_lines = 10;
  // The first coordinator stops after two chunks.
  validation_.before_chunk = [this](const std::string&) {
    absl::MutexLock lock(&mu_);
    return ++calls_ <= 2;
  };
  StartManager();
  auto id = manager_->Submit("restart", Input(45));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock lock(&mu_);
    return calls_ == 3;
  }));
  EXPECT_EQ(GetJob(*id).state(), Job::VALIDATING);
  EXPECT_EQ(GetJob(*id).validated_requests(), 20);

  validation_.before_chunk = [this](const std::string& job_id) {
    Job job = *manager_->GetJob(job_id);
    absl::MutexLock lock(&mu_);
    seen_.push_back({job.state(), job.validated_requests(), job.failed_requests()});
    return true;
  };
  StartManager();
  WaitValidated(*id);
  {
    absl::MutexLock lock(&mu_);
    ASSERT_FALSE(seen_.empty());
    EXPECT_EQ(seen_[0].validated, 20);  // not from the start again
    EXPECT_EQ(seen_.size(), 3u);
  }
  Job job = GetJob(*id);
  EXPECT_EQ(job.validated_requests(), 45);
  EXPECT_EQ(job.failed_requests(), 6 + 1);  // every 7th line, and r2 again on line 33

  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  std::multiset<int64_t> sent = RunToTheEnd(*id, 45 - 7);
  EXPECT_EQ(sent.size(), 38u);
  EXPECT_EQ(std::set<int64_t>(sent.begin(), sent.end()).size(), 38u);  // none twice
  EXPECT_EQ(sent.count(33), 0u);
  std::map<int64_t, int> answered;  // line -> output lines
  std::string errors;
  for (const json& line : Output(*id)) {
    const std::string request = line["id"];
    answered[std::stoll(request.substr(request.rfind(':') + 1))]++;
    if (!line["error"].is_null()) errors += line["error"]["message"].get<std::string>() + "\n";
  }
  EXPECT_EQ(answered.size(), 45u);
  for (const auto& [line, count] : answered) EXPECT_EQ(count, 1) << "line " << line;
  EXPECT_THAT(errors, HasSubstr("line 33: duplicate custom_id 'r2' (first used on line 3)"));
  EXPECT_THAT(errors, HasSubstr("line 7: not valid JSON"));
}

TEST_F(JobValidationTest, JobsThatCannotBeValidatedFailAndTheOthersRun) {
  // The first coordinator stops before any chunk of any job.
  validation_.before_chunk = [this](const std::string&) {
    absl::MutexLock lock(&mu_);
    ++calls_;
    return false;
  };
  StartManager();
  auto gone = manager_->Submit("gone", Line("g", "[1]"));
  auto crashing = manager_->Submit("crashing", Line("c", "[4]"));
  auto fine = manager_->Submit("fine", Line("f", "[5]"));
  ASSERT_TRUE(gone.ok() && crashing.ok() && fine.ok());
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock lock(&mu_);
    return calls_ == 3;
  }));
  manager_.reset();
  ASSERT_EQ(std::remove(store_->InputPath(*gone).c_str()), 0);
  // Another coordinator died validating this one, without getting further.
  ASSERT_EQ(*store_->StartLoading(*crashing), 2);
  validation_.before_chunk = nullptr;
  StartManager();
  WaitValidated(*gone);
  WaitValidated(*crashing);
  WaitValidated(*fine);

  Job job = GetJob(*gone);
  EXPECT_EQ(job.state(), Job::FAILED);
  EXPECT_EQ(job.error(),
            "cannot validate the job's input: input file of job " + *gone + " is missing");
  job = GetJob(*crashing);
  EXPECT_EQ(job.state(), Job::FAILED);
  EXPECT_THAT(job.error(), HasSubstr("a coordinator stopped 2 times while validating its input"));
  // One died while validating this one: it is validated again.
  EXPECT_EQ(GetJob(*fine).state(), Job::QUEUED);
  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  RunToTheEnd(*fine, 1);
}

TEST_F(JobValidationTest, AnInputThatShrankBelowWhatWasValidatedFailsTheJob) {
  validation_.chunk_lines = 10;
  validation_.before_chunk = [this](const std::string&) {
    absl::MutexLock lock(&mu_);
    return ++calls_ <= 1;
  };
  StartManager();
  auto id = manager_->Submit("shrunk", Input(25));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(WaitFor([&] {
    absl::MutexLock lock(&mu_);
    return calls_ == 2;
  }));
  manager_.reset();
  std::ofstream(store_->InputPath(*id), std::ios::trunc) << Line("r0", "[0]") << "\n";
  validation_.before_chunk = nullptr;
  StartManager();
  WaitValidated(*id);
  Job job = GetJob(*id);
  EXPECT_EQ(job.state(), Job::FAILED);
  EXPECT_THAT(job.error(), HasSubstr("input file of job " + *id + " is shorter ("));
  EXPECT_THAT(job.error(), HasSubstr("bytes validated before"));
}

TEST_F(JobValidationTest, CancellingStopsValidation) {
  validation_.chunk_lines = 10;
  validation_.before_chunk = [this](const std::string& id) {
    {
      absl::MutexLock lock(&mu_);
      if (++calls_ != 2) return true;
    }
    EXPECT_EQ(manager_->Cancel(id)->state(), Job::CANCELLED);
    return true;
  };
  StartManager();
  auto id = manager_->Submit("cancelled", Input(45));
  ASSERT_TRUE(id.ok());
  ASSERT_TRUE(WaitFor([&] { return GetJob(*id).state() == Job::CANCELLED; }));
  manager_.reset();  // the validator has stopped: it is joined here
  absl::MutexLock lock(&mu_);
  EXPECT_EQ(calls_, 2);
  EXPECT_EQ(store_->GetJob(*id)->state(), Job::CANCELLED);
}

TEST_F(JobValidationTest, QueuedRequestsStayInTheStoreUntilSent) {
  queued_in_memory_ = 16;
  max_inflight_per_rank_ = 4;
  StartManager();
  std::vector<std::string> lines;
  for (int i = 0; i < 500; ++i)
    lines.push_back(Line(absl::StrCat("r", i), absl::StrCat("[", i % 100, "]")));
  auto id = Submit("many", absl::StrJoin(lines, "\n"));
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(manager_->requests_in_memory(), 0u);  // nothing is read before a group serves
  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  std::set<int64_t> sent;
  size_t most = 0;
  while (sent.size() < 500) {
    auto items = workers_.Take(1);
    ASSERT_FALSE(items.empty());
    most = std::max(most, manager_->requests_in_memory());
    std::vector<RequestResult> results;
    for (const auto& [address, item] : items) {
      EXPECT_TRUE(
          sent.insert(std::stoll(item.request_id().substr(item.request_id().rfind(':') + 1)))
              .second)
          << item.request_id();
      results.push_back(ResultFor(item));
    }
    ASSERT_TRUE(manager_->OnResults(results).ok());
  }
  // At most the queue window and what is in flight.
  EXPECT_LE(most, 16u + 4u);
  ASSERT_TRUE(WaitFor([&] { return GetJob(*id).state() == Job::COMPLETED; }));
  EXPECT_EQ(GetJob(*id).completed_requests(), 500);
  EXPECT_EQ(manager_->requests_in_memory(), 0u);
}

TEST_F(JobValidationTest, AResultResentAfterARestartIsTakenForALineNotReadYet) {
  queued_in_memory_ = 16;
  max_inflight_per_rank_ = 4;
  StartManager();
  auto id = Submit("resent", absl::StrJoin(NumberedLines(100), "\n"));
  ASSERT_TRUE(id.ok());
  // A worker finished line 90 for the coordinator before this one (its result was never
  // acknowledged); this coordinator has not read line 90 from the store yet.
  RequestResult resent;
  resent.set_request_id(absl::StrCat(*id, ":90"));
  resent.add_token_ids(89);
  resent.set_finish_reason("length");
  resent.set_prompt_tokens(1);
  AddWorker("w1", 1, 1);
  ServeWhenConfigured({{"w1", 1}}, 1);
  ASSERT_TRUE(manager_->OnResults({resent}).ok());
  EXPECT_EQ(GetJob(*id).completed_requests(), 1);
  std::multiset<int64_t> sent = RunToTheEnd(*id, 99);
  EXPECT_EQ(sent.count(90), 0u);
  EXPECT_EQ(sent.size(), 99u);
  EXPECT_EQ(GetJob(*id).completed_requests(), 100);
}

}  // namespace
}  // namespace deepinfer
