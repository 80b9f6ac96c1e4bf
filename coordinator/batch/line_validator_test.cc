#include "coordinator/batch/line_validator.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "proto/validated_request.pb.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using json = nlohmann::json;

class LineValidatorTest : public ::testing::Test {
 protected:
  PromptBuilder prompts_{ModelLimits{100, 64}, nullptr, nullptr};
  LineValidator validator_{"job-1", &prompts_};
};

TEST_F(LineValidatorTest, ARequestThatCanRunIsStoredWithItsSeed) {
  LineOutcome out = validator_.Validate(
      3,
      R"({"custom_id": "a", "url": "/v1/chat/completions", "body": {"messages": [{"role": "user", "content": "hi"}]}})");
  // No tokenizer: chat is refused, but the line parsed, so it claims its id.
  EXPECT_TRUE(out.claims_custom_id);
  EXPECT_EQ(out.custom_id, "a");
  EXPECT_TRUE(out.line.request.empty());

  out = validator_.Validate(
      4,
      R"({"custom_id": "b", "url": "/v1/completions", "body": {"prompt": [5, 6], "max_tokens": 7, "n": 3, "model": "m"}})");
  ASSERT_FALSE(out.line.request.empty());
  EXPECT_TRUE(out.line.error_line.empty());
  EXPECT_EQ(out.line.line_number, 4);
  EXPECT_EQ(out.line.reserved_tokens, 7 * 3);
  ValidatedRequest request;
  ASSERT_TRUE(request.ParseFromString(out.line.request));
  EXPECT_EQ(request.custom_id(), "b");
  EXPECT_FALSE(request.chat());
  EXPECT_EQ(request.model(), "m");
  EXPECT_EQ(request.n(), 3);
  EXPECT_THAT(request.prompt_token_ids(), ElementsAre(5, 6));
  EXPECT_EQ(request.sampling().max_tokens(), 7);
  EXPECT_EQ(request.sampling().seed(), DefaultSeed("job-1", 4));

  // A given seed stays.
  out = validator_.Validate(
      5,
      R"({"custom_id": "c", "url": "/v1/completions", "body": {"prompt": [1, 2, 3], "seed": 9}})");
  ASSERT_TRUE(request.ParseFromString(out.line.request));
  EXPECT_EQ(request.sampling().seed(), 9u);
  EXPECT_EQ(out.line.reserved_tokens, 16);  // OpenAI's default max_tokens for completions
}

TEST_F(LineValidatorTest, LinesThatCannotRunGetTheirErrorLine) {
  LineOutcome out = validator_.Validate(2, "{broken");
  EXPECT_FALSE(out.claims_custom_id);
  EXPECT_TRUE(out.line.request.empty());
  json line = json::parse(out.line.error_line);
  EXPECT_EQ(line["id"], "batch_req_job-1:2");
  EXPECT_TRUE(line["custom_id"].is_null());
  EXPECT_EQ(line["error"]["code"], "invalid_request");
  EXPECT_THAT(line["error"]["message"].get<std::string>(), ::testing::StartsWith("line 2: "));

  out = validator_.Validate(
      5, R"({"custom_id": "x", "url": "/v1/completions", "body": {"prompt": [100]}})");
  EXPECT_TRUE(out.claims_custom_id);
  line = json::parse(out.line.error_line);
  EXPECT_EQ(line["custom_id"], "x");
  EXPECT_EQ(line["error"]["message"], "line 5: token id 100 is outside the vocabulary (size 100)");

  line = json::parse(validator_.DuplicateCustomId(out, 1));
  EXPECT_EQ(line["custom_id"], "x");
  EXPECT_EQ(line["error"]["message"], "line 5: duplicate custom_id 'x' (first used on line 1)");
}

}  // namespace
}  // namespace deepinfer
