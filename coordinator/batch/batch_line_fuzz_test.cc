// Fuzzes the coordinator's request path without a network: generated hostile lines
// (tests/testing/hostile_lines.h, a fixed seed) through ParseBatchLine, PromptBuilder::Build
// (the test tokenizer and a DeepSeek-V3-shaped chat template) and the output line
// formatting. It runs on a thread with a small stack, so that a walk that recurses as deep
// as the input fails here rather than in a coordinator. Every line must give a request or an
// INVALID_ARGUMENT that names its line in a short message, and every output line must be
// one line of JSON. tests/runtime/input_hardening_test sends such lines to a running
// coordinator.
#include <pthread.h>

#include <cstdlib>
#include <functional>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "coordinator/batch/batch_line.h"
#include "coordinator/batch/batch_output.h"
#include "coordinator/batch/prompt_builder.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/chat_model.h"
#include "tests/testing/hostile_lines.h"

namespace deepinfer {
namespace {

constexpr uint64_t kSeed = 27;
constexpr int kLines = 3000;
// A sixteenth of a usual thread stack.
constexpr size_t kStackBytes = 512 << 10;
// Longer than any message needs; a message that printed a user's value whole would be
// longer (the generator's values run to 100,000 bytes and levels).
constexpr size_t kMaxMessageBytes = 1000;

void RunOnSmallStack(const std::function<void()>& body) {
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, kStackBytes), 0);
  pthread_t thread;
  auto run = [](void* arg) -> void* {
    (*static_cast<const std::function<void()>*>(arg))();
    return nullptr;
  };
  ASSERT_EQ(pthread_create(&thread, &attr, run, const_cast<std::function<void()>*>(&body)), 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
}

// One line of JSON, an object.
bool IsOneJsonLine(const std::string& text) {
  if (text.find('\n') != std::string::npos) return false;
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return !j.is_discarded() && j.is_object();
}

class BatchLineFuzzTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = absl::StrCat(std::getenv("TEST_TMPDIR"), "/chat_model");
    ASSERT_TRUE(testing::MakeChatModelDir("tests/fixtures/dsv3_qlora_rope", dir).ok());
    auto builder = PromptBuilder::FromModel(dir);
    ASSERT_TRUE(builder.ok()) << builder.status();
    builder_ = std::move(*builder);
  }

  // Parses and builds line `n`; records how it ended in `outcomes_`.
  void Check(const std::string& text, int64_t n) {
    const std::string prefix = absl::StrCat("line ", n, ": ");
    const std::string request_id = absl::StrCat("job-fuzz:", n);
    std::string custom_id;
    absl::StatusOr<BatchLine> line = ParseBatchLine(text, n, &custom_id);
    std::string error;
    if (!line.ok()) {
      EXPECT_EQ(line.status().code(), absl::StatusCode::kInvalidArgument) << line.status();
      error = std::string(line.status().message());
      EXPECT_TRUE(absl::StartsWith(error, prefix)) << error;
    } else {
      absl::StatusOr<std::vector<int32_t>> prompt = builder_->Build(*line);
      if (!prompt.ok()) {
        EXPECT_EQ(prompt.status().code(), absl::StatusCode::kInvalidArgument) << prompt.status();
        error = prefix + std::string(prompt.status().message());
        custom_id = line->custom_id;
      } else {
        RequestResult result;
        result.set_request_id(request_id);
        result.add_token_ids(prompt->front());
        result.set_text("t");
        result.set_finish_reason("length");
        result.set_prompt_tokens(static_cast<int32_t>(prompt->size()));
        OutputContext context{request_id, "m", 0,
                              [this](int32_t id) { return builder_->TokenText(id); }};
        EXPECT_TRUE(IsOneJsonLine(FormatResultLine(*line, result, context))) << text.substr(0, 200);
        ++outcomes_["ok"];
        return;
      }
    }
    EXPECT_LT(error.size(), kMaxMessageBytes) << error.substr(0, 2000);
    EXPECT_TRUE(IsOneJsonLine(FormatErrorLine(custom_id, request_id, kInvalidRequest, error)));
    for (const char* kind :
         {"nested more than", "NUL byte", "not valid JSON", "data after", "duplicate key",
          "unknown field", "is not supported", "is not a role", "chat template", "must be"}) {
      if (absl::StrContains(error, kind)) ++outcomes_[kind];
    }
    ++outcomes_["error"];
  }

  std::unique_ptr<PromptBuilder> builder_;
  std::map<std::string, int> outcomes_;
};

TEST_F(BatchLineFuzzTest, EveryLineGivesARequestOrAShortErrorNamingIt) {
  // The lines the mutations start from are served.
  for (const std::string& line : testing::ValidLines("valid-")) {
    auto parsed = ParseBatchLine(line, 1);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    auto prompt = builder_->Build(*parsed);
    ASSERT_TRUE(prompt.ok()) << prompt.status() << " " << line;
  }
  const std::vector<std::string> lines = testing::MakeHostileLines(kSeed, kLines);
  ASSERT_EQ(lines.size(), static_cast<size_t>(kLines));
  RunOnSmallStack([&] {
    for (size_t i = 0; i < lines.size(); ++i) Check(lines[i], static_cast<int64_t>(i + 1));
  });
  std::string summary;
  for (const auto& [kind, count] : outcomes_) absl::StrAppend(&summary, kind, ": ", count, "\n");
  std::cerr << summary;
  EXPECT_EQ(outcomes_["ok"] + outcomes_["error"], kLines) << summary;
  // The seed's lines reach every kind of refusal (and some still run).
  for (const char* kind :
       {"ok", "nested more than", "NUL byte", "not valid JSON", "data after", "duplicate key",
        "unknown field", "is not supported", "is not a role", "must be"}) {
    EXPECT_GT(outcomes_[kind], 0) << kind << "\n" << summary;
  }
}

}  // namespace
}  // namespace deepinfer
