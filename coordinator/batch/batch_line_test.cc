#include "coordinator/batch/batch_line.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string Completion(const std::string& body_fields) {
  return R"({"custom_id": "r1", "method": "POST", "url": "/v1/completions", "body": {)" +
         body_fields + "}}";
}

std::string Chat(const std::string& body_fields) {
  return R"({"custom_id": "c1", "method": "POST", "url": "/v1/chat/completions", "body": {)" +
         body_fields + "}}";
}

// The error message of parsing `line` as line 7 ("" if it parsed).
std::string ErrorOf(const std::string& line) {
  auto parsed = ParseBatchLine(line, 7);
  if (parsed.ok()) return "";
  EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(parsed.status().message());
}

TEST(BatchLineTest, TextCompletionWithDefaults) {
  auto line = ParseBatchLine(Completion(R"("model": "m", "prompt": "Hello")"), 1);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->custom_id, "r1");
  EXPECT_EQ(line->endpoint, BatchEndpoint::kCompletions);
  EXPECT_EQ(line->prompt_text, "Hello");
  EXPECT_FALSE(line->prompt_token_ids.has_value());
  EXPECT_EQ(line->model, "m");
  EXPECT_EQ(line->sampling.max_tokens(), 16);  // OpenAI's completions default
  EXPECT_FLOAT_EQ(line->sampling.temperature(), 1.0f);
  EXPECT_FLOAT_EQ(line->sampling.top_p(), 1.0f);
  EXPECT_EQ(line->sampling.top_k(), 0);
  EXPECT_FALSE(line->sampling.has_seed());
  EXPECT_EQ(line->sampling.logprobs(), -1);
}

TEST(BatchLineTest, TokenIdPromptsInBothShapes) {
  auto flat = ParseBatchLine(Completion(R"("prompt": [1, 2, 3])"), 1);
  ASSERT_TRUE(flat.ok()) << flat.status();
  EXPECT_THAT(*flat->prompt_token_ids, ElementsAre(1, 2, 3));
  auto nested = ParseBatchLine(Completion(R"("prompt": [[4, 5]])"), 1);
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_THAT(*nested->prompt_token_ids, ElementsAre(4, 5));
  auto single_text = ParseBatchLine(Completion(R"("prompt": ["hi"])"), 1);
  ASSERT_TRUE(single_text.ok());
  EXPECT_EQ(single_text->prompt_text, "hi");
}

TEST(BatchLineTest, AllSamplingFields) {
  auto line = ParseBatchLine(
      Completion(R"("prompt": "x", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9,
                 "top_k": 40, "seed": 1234, "stop": ["\n\n", "END"], "stop_token_ids": [7],
                 "ignore_eos": true, "logprobs": 3, "return_token_ids": true)"),
      1);
  ASSERT_TRUE(line.ok()) << line.status();
  const GenerationParams& s = line->sampling;
  EXPECT_EQ(s.max_tokens(), 5);
  EXPECT_FLOAT_EQ(s.temperature(), 0.7f);
  EXPECT_FLOAT_EQ(s.top_p(), 0.9f);
  EXPECT_EQ(s.top_k(), 40);
  EXPECT_EQ(s.seed(), 1234u);
  EXPECT_THAT(s.stop(), ElementsAre("\n\n", "END"));
  EXPECT_THAT(s.stop_token_ids(), ElementsAre(7));
  EXPECT_TRUE(s.ignore_eos());
  EXPECT_EQ(s.logprobs(), 3);
  EXPECT_TRUE(s.return_token_ids());
}

TEST(BatchLineTest, ChatWithToolsAndLogprobs) {
  auto line = ParseBatchLine(
      Chat(R"("messages": [{"role": "system", "content": "Be brief."},
                           {"role": "user", "content": "Hi"}],
              "tools": [{"type": "function", "function": {"name": "f"}}],
              "logprobs": true, "top_logprobs": 2, "max_completion_tokens": 9, "stop": "x")"),
      1);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->endpoint, BatchEndpoint::kChatCompletions);
  ASSERT_TRUE(line->messages.has_value());
  EXPECT_EQ(line->messages->size(), 2u);
  EXPECT_EQ(line->tools->size(), 1u);
  EXPECT_EQ(line->sampling.logprobs(), 2);
  EXPECT_EQ(line->sampling.max_tokens(), 9);
  EXPECT_THAT(line->sampling.stop(), ElementsAre("x"));
  auto defaults = ParseBatchLine(Chat(R"("messages": [{"role": "user", "content": "Hi"}])"), 1);
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->sampling.max_tokens(), 0);  // chat: until EOS or the context limit
  EXPECT_EQ(defaults->sampling.logprobs(), -1);
}

TEST(BatchLineTest, ErrorsNameLineAndField) {
  EXPECT_EQ(ErrorOf("{not json"), "line 7: not valid JSON");
  EXPECT_EQ(ErrorOf("[1]"), "line 7: not a JSON object");
  EXPECT_THAT(ErrorOf(R"({"url": "/v1/completions", "body": {"prompt": "x"}})"),
              HasSubstr("custom_id"));
  EXPECT_THAT(ErrorOf(R"({"custom_id": "a", "method": "GET", "url": "/v1/completions",
                          "body": {"prompt": "x"}})"),
              HasSubstr("method must be \"POST\""));
  EXPECT_THAT(ErrorOf(R"({"custom_id": "a", "url": "/v1/embeddings", "body": {}})"),
              HasSubstr("url \"/v1/embeddings\" is not served"));
  EXPECT_THAT(ErrorOf(Completion(R"("max_tokens": 5)")), HasSubstr("body.prompt is missing"));
  EXPECT_THAT(ErrorOf(Completion(R"("prompt": ["a", "b"])")), HasSubstr("several prompts"));
  EXPECT_THAT(ErrorOf(Completion(R"("prompt": [1, -2])")), HasSubstr("token ids"));
  EXPECT_THAT(ErrorOf(Completion(R"("prompt": "x", "max_tokens": 0)")),
              HasSubstr("body.max_tokens must be in [1, "));
  EXPECT_THAT(ErrorOf(Completion(R"("prompt": "x", "max_tokens": "5")")),
              HasSubstr("body.max_tokens must be an integer"));
  EXPECT_THAT(ErrorOf(Completion(R"("prompt": "x", "temperature": -1)")),
              HasSubstr("body.temperature"));
  EXPECT_THAT(ErrorOf(Completion(R"("prompt": "x", "top_p": 0)")), HasSubstr("body.top_p"));
  EXPECT_THAT(ErrorOf(Completion(R"("prompt": "x", "logprobs": 21)")),
              HasSubstr("body.logprobs must be in [0, 20]"));
  EXPECT_THAT(ErrorOf(Completion(R"("prompt": "x", "n": 2)")), HasSubstr("only n = 1"));
  EXPECT_THAT(ErrorOf(Completion(R"("prompt": "x", "stream": true)")), HasSubstr("stream"));
  EXPECT_THAT(ErrorOf(Completion(R"("prompt": "x", "stop": [""])")), HasSubstr("empty string"));
  EXPECT_THAT(ErrorOf(Chat(R"("messages": [])")), HasSubstr("non-empty list"));
  EXPECT_THAT(ErrorOf(Chat(R"("messages": [{"content": "x"}])")),
              HasSubstr("body.messages[0].role"));
  EXPECT_THAT(ErrorOf(Chat(R"("messages": [{"role": "user", "content": "x"}], "top_logprobs": 2)")),
              HasSubstr("needs body.logprobs"));
}

TEST(BatchLineTest, CustomIdIsKeptForErrorLines) {
  std::string custom_id;
  auto parsed = ParseBatchLine(Completion(R"("prompt": 5)"), 3, &custom_id);
  EXPECT_FALSE(parsed.ok());
  EXPECT_EQ(custom_id, "r1");
}

}  // namespace
}  // namespace deepinfer
