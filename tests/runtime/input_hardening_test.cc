// Hostile input through real processes: a coordinator and a worker on loopback serving the
// HF-made fixture tests/fixtures/dsv3_qlora_rope with the test tokenizer and a chat template
// (tests/testing/chat_model.h), CPU backend.
//   * A prompt nested 30,000 lists deep, as a completion and as chat content, gets an error
//     line; neither the coordinator nor its restart on the persisted job crashes.
//     (tests/runtime/job_intake_test has a job whose input file is gone at a restart.)
//   * Generated hostile lines (tests/testing/hostile_lines.h, a fixed seed) and hostile
//     whole inputs each get their lines, and the coordinator serves a valid job afterwards.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "coordinator/client/coordinator_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/batch_jobs.h"
#include "tests/testing/chat_model.h"
#include "tests/testing/hostile_lines.h"
#include "tests/testing/subprocess.h"

namespace deepinfer {
namespace {

using ::deepinfer::testing::Runfile;
using ::deepinfer::testing::Subprocess;
using ::deepinfer::testing::TempPath;
using ::deepinfer::testing::WaitForPortFile;
using ::testing::HasSubstr;
using ::testing::StartsWith;
using json = nlohmann::json;

constexpr uint64_t kSeed = 2711;
constexpr int kHostileLines = 300;

bool IsFinal(const Job& job) {
  return job.state() == Job::COMPLETED || job.state() == Job::FAILED ||
         job.state() == Job::CANCELLED;
}

class InputHardeningTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = TempPath(name_ + ".model");
    ASSERT_TRUE(testing::MakeChatModelDir("tests/fixtures/dsv3_qlora_rope", model_).ok());
  }

  std::string StateDir() const { return TempPath(name_ + ".state"); }

  void StartCoordinator(int port) {
    const std::string port_file = TempPath(absl::StrCat(name_, ".port.", ++starts_));
    auto p = Subprocess::Start(
        {Runfile("coordinator/deepinfer-coordinator"), absl::StrCat("--listen=127.0.0.1:", port),
         "--port-file=" + port_file, "--model=" + model_, "--state-dir=" + StateDir(),
         "--heartbeat-interval-ms=200", "--heartbeat-timeout-ms=2000"},
        TempPath(absl::StrCat(name_, ".coordinator.", starts_)));
    ASSERT_TRUE(p.ok()) << p.status();
    coordinator_.emplace(std::move(*p));
    const int bound = WaitForPortFile(port_file, absl::Seconds(60));
    ASSERT_GT(bound, 0) << coordinator_->ReadStderr();
    port_ = bound;
    client_.emplace(
        CoordinatorClientOptions{absl::StrCat("127.0.0.1:", bound), "", "test", absl::Seconds(60)});
  }

  void KillCoordinator() {
    coordinator_->Signal(SIGKILL);
    ASSERT_TRUE(coordinator_->Wait(absl::Seconds(10)).ok());
  }

  void StartWorker() {
    auto p = Subprocess::Start(
        {Runfile("worker/deepinfer-worker"), absl::StrCat("--coordinator=127.0.0.1:", port_),
         "--model=" + model_, "--worker-id=w0", "--threads=1"},
        TempPath(absl::StrCat(name_, ".worker.", ++starts_)));
    ASSERT_TRUE(p.ok()) << p.status();
    worker_.emplace(std::move(*p));
  }

  std::string Submit(const std::string& input) {
    auto id = client_->SubmitJob(name_, input);
    EXPECT_TRUE(id.ok()) << id.status() << "\n" << coordinator_->ReadStderr();
    return id.ok() ? *id : "";
  }

  Job WaitForJob(const std::string& id, const std::function<bool(const Job&)>& done) {
    return testing::WaitForJob(*client_, id, done, [&] {
      return "coordinator:\n" + coordinator_->ReadStderr().substr(0, 20000);
    });
  }

  std::vector<json> Output(const std::string& id) {
    std::vector<json> out;
    EXPECT_TRUE(client_
                    ->ReadResults(id,
                                  [&](const std::string& line) {
                                    json j = json::parse(line, nullptr, false);
                                    EXPECT_TRUE(j.is_object()) << line;
                                    out.push_back(j);
                                  })
                    .ok());
    return out;
  }

  // Error messages by custom_id ("(none)" for lines without a readable one).
  std::map<std::string, std::string> Errors(const std::vector<json>& output) {
    std::map<std::string, std::string> errors;
    for (const json& line : output) {
      if (line["error"].is_null()) continue;
      errors[line["custom_id"].is_string() ? line["custom_id"].get<std::string>() : "(none)"] +=
          line["error"]["message"].get<std::string>() + "\n";
    }
    return errors;
  }

  const std::string name_ = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  std::string model_;
  int starts_ = 0;
  int port_ = 0;
  std::optional<Subprocess> coordinator_;
  std::optional<Subprocess> worker_;
  std::optional<CoordinatorClient> client_;
};

TEST_F(InputHardeningTest, DeepPromptsCrashNeitherTheCoordinatorNorItsRestart) {
  StartCoordinator(0);
  const std::string deep = absl::StrCat(std::string(30000, '['), std::string(30000, ']'));
  const std::vector<std::string> lines = {
      absl::StrCat(R"({"custom_id": "deep-prompt", "method": "POST", "url": "/v1/completions", )",
                   R"("body": {"prompt": )", deep, "}}"),
      absl::StrCat(R"({"custom_id": "deep-chat", "method": "POST", "url": )",
                   R"("/v1/chat/completions", "body": {"messages": [{"role": "user", )",
                   R"("content": )", deep, "}]}}"),
      std::string(R"({"custom_id": "nul", "method": "POST", "url": "/v1/completions", )"
                  R"("body": {"prompt": [1, 2]}})") +
          std::string("\0{\"trailing\": 1}", 16),
      R"({"custom_id": "ok", "method": "POST", "url": "/v1/completions", "body": {"prompt": [1, 2, 3], "max_tokens": 2}})"};
  const std::string id = Submit(absl::StrJoin(lines, "\n") + "\n");
  ASSERT_FALSE(id.empty());
  Job job = WaitForJob(id, [](const Job& j) { return j.state() != Job::VALIDATING; });
  EXPECT_EQ(job.failed_requests(), 3);
  ASSERT_TRUE(coordinator_->Running());

  // The job waits for a worker; a restarted coordinator resumes it.
  KillCoordinator();
  StartCoordinator(port_);
  StartWorker();
  Job done = WaitForJob(id, IsFinal);
  EXPECT_EQ(done.state(), Job::COMPLETED);
  EXPECT_EQ(done.completed_requests(), 1);
  EXPECT_EQ(done.failed_requests(), 3);
  EXPECT_TRUE(coordinator_->Running());
  auto errors = Errors(Output(id));
  const std::string too_deep =
      "nested more than 64 levels deep (objects and lists inside each other)";
  EXPECT_EQ(errors["(none)"],
            absl::StrCat("line 1: ", too_deep, "\nline 2: ", too_deep,
                         "\nline 3: a NUL byte at byte ", lines[2].find('\0') + 1, "\n"));
  EXPECT_EQ(errors.count("ok"), 0u);
}

TEST_F(InputHardeningTest, FuzzedLinesEachGetTheirLineAndAValidJobRunsAfterwards) {
  StartCoordinator(0);
  StartWorker();
  const std::vector<std::string> lines = testing::MakeHostileLines(kSeed, kHostileLines);
  const std::string input = absl::StrJoin(lines, "\n") + "\n";
  // The lines with a request, as the coordinator numbers them.
  std::set<int64_t> request_lines;
  int64_t n = 0;
  for (absl::string_view text : absl::StrSplit(input, '\n')) {
    ++n;
    if (!absl::StripAsciiWhitespace(text).empty()) request_lines.insert(n);
  }
  const std::string id = Submit(input);
  ASSERT_FALSE(id.empty());
  Job job = WaitForJob(id, IsFinal);
  EXPECT_EQ(job.state(), Job::COMPLETED);
  EXPECT_EQ(job.completed_requests() + job.failed_requests(),
            static_cast<int64_t>(request_lines.size()));
  EXPECT_GT(job.completed_requests(), 0);
  EXPECT_GT(job.failed_requests(), 0);
  std::set<int64_t> answered;
  for (const json& line : Output(id)) {
    // "batch_req_<job id>:<line>"
    const std::string request_id = line["id"].get<std::string>();
    int64_t line_number = 0;
    ASSERT_TRUE(absl::SimpleAtoi(request_id.substr(request_id.rfind(':') + 1), &line_number))
        << request_id;
    EXPECT_TRUE(answered.insert(line_number).second) << "line " << line_number << " twice";
    if (line["error"].is_null()) {
      EXPECT_EQ(line["response"]["status_code"], 200) << line.dump();
    } else {
      EXPECT_EQ(line["error"]["code"], "invalid_request");
      EXPECT_THAT(line["error"]["message"].get<std::string>(),
                  StartsWith(absl::StrCat("line ", line_number, ": ")));
    }
  }
  EXPECT_EQ(answered, request_lines);

  // Whole inputs that are one hostile line each.
  const std::string hostile_inputs[] = {
      std::string("\0", 1),
      std::string(100000, '['),
      "\xff\xfe\xfd",
      std::string(R"({"custom_id": "x", "body": )") + std::string(200000, '{'),
      absl::StrCat(R"({"custom_id": "big", "method": "POST", "url": "/v1/completions", )",
                   R"("body": {"prompt": ")", std::string(1 << 20, 'a'), R"(", "seed": 1e999}})"),
  };
  for (const std::string& hostile : hostile_inputs) {
    const std::string one = Submit(hostile);
    ASSERT_FALSE(one.empty());
    Job result = WaitForJob(one, IsFinal);
    EXPECT_EQ(result.state(), Job::COMPLETED);
    EXPECT_EQ(result.failed_requests(), 1);
  }

  ASSERT_TRUE(coordinator_->Running());
  const std::string valid = Submit(absl::StrJoin(testing::ValidLines("after-"), "\n"));
  ASSERT_FALSE(valid.empty());
  Job after = WaitForJob(valid, IsFinal);
  EXPECT_EQ(after.state(), Job::COMPLETED);
  EXPECT_EQ(after.failed_requests(), 0);
  EXPECT_EQ(after.completed_requests(), static_cast<int64_t>(testing::ValidLines("").size()));
  for (const json& line : Output(valid)) {
    EXPECT_EQ(line["response"]["status_code"], 200) << line.dump();
    EXPECT_FALSE(line["response"]["body"]["choices"][0]["token_ids"].empty()) << line.dump();
  }
  EXPECT_TRUE(coordinator_->Running());
}

}  // namespace
}  // namespace deepinfer
