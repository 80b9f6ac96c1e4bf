#include "coordinator/batch/batch_output.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using json = nlohmann::json;

BatchLine Parse(const std::string& line) {
  auto parsed = ParseBatchLine(line, 1);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

RequestResult Result() {
  RequestResult r;
  r.set_request_id("job-1:1");
  r.add_token_ids(5);
  r.add_token_ids(6);
  r.set_text("ab");
  r.set_finish_reason("length");
  r.set_prompt_tokens(3);
  for (int id : {5, 6}) {
    TokenLogprob* lp = r.add_logprobs();
    lp->set_token_id(id);
    lp->set_logprob(-0.5f);
    lp->add_top_token_ids(id);
    lp->add_top_logprobs(-0.5f);
    lp->add_top_token_ids(9);
    lp->add_top_logprobs(-1.5f);
  }
  return r;
}

OutputContext Context() {
  OutputContext c;
  c.request_id = "job-1:1";
  c.model = "tiny";
  c.created_unix_s = 1700000000;
  c.token_text = [](int32_t id) { return std::string(1, static_cast<char>('a' + id - 5)); };
  return c;
}

TEST(BatchOutputTest, CompletionLineWithLogprobsAndTokenIds) {
  BatchLine request = Parse(R"({"custom_id": "q1", "method": "POST", "url": "/v1/completions",
      "body": {"prompt": [1, 2, 3], "max_tokens": 2, "logprobs": 1, "return_token_ids": true}})");
  json line = json::parse(FormatResultLine(request, Result(), Context()));
  EXPECT_EQ(line["custom_id"], "q1");
  EXPECT_TRUE(line["error"].is_null());
  EXPECT_EQ(line["response"]["status_code"], 200);
  const json& body = line["response"]["body"];
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["model"], "tiny");
  EXPECT_EQ(body["choices"][0]["text"], "ab");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(body["choices"][0]["token_ids"], json({5, 6}));
  const json& lp = body["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b"}));
  EXPECT_EQ(lp["token_logprobs"], json({-0.5, -0.5}));
  EXPECT_EQ(lp["top_logprobs"][0]["e"], -1.5);
  EXPECT_EQ(lp["text_offset"], json({0, 1}));
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(body["usage"]["completion_tokens"], 2);
  EXPECT_EQ(body["usage"]["total_tokens"], 5);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

// Prompt tokens the worker's prefix cache served: OpenAI's prompt_tokens_details.
TEST(BatchOutputTest, CachedPromptTokensInUsage) {
  BatchLine request = Parse(R"({"custom_id": "q1", "method": "POST", "url": "/v1/completions",
      "body": {"prompt": [1, 2, 3], "max_tokens": 2}})");
  RequestResult r = Result();
  r.set_prompt_tokens(40);
  r.set_cached_prompt_tokens(32);
  const json usage =
      json::parse(FormatResultLine(request, r, Context()))["response"]["body"]["usage"];
  EXPECT_EQ(usage["prompt_tokens"], 40);
  EXPECT_EQ(usage["prompt_tokens_details"]["cached_tokens"], 32);
  EXPECT_EQ(usage["total_tokens"], 42);
}

TEST(BatchOutputTest, ChatLineWithoutLogprobs) {
  BatchLine request = Parse(R"({"custom_id": "c", "method": "POST",
      "url": "/v1/chat/completions", "body": {"model": "mine",
      "messages": [{"role": "user", "content": "hi"}]}})");
  json line = json::parse(FormatResultLine(request, Result(), Context()));
  const json& body = line["response"]["body"];
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["model"], "mine");
  EXPECT_EQ(body["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "ab");
  EXPECT_TRUE(body["choices"][0]["logprobs"].is_null());
  EXPECT_FALSE(body["choices"][0].contains("token_ids"));
}

TEST(BatchOutputTest, ChatLogprobsHaveBytes) {
  BatchLine request = Parse(R"({"custom_id": "c", "url": "/v1/chat/completions", "body": {
      "messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 1}})");
  json line = json::parse(FormatResultLine(request, Result(), Context()));
  const json& content = line["response"]["body"]["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "a");
  EXPECT_EQ(content[0]["bytes"], json({97}));
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "e");
}

TEST(BatchOutputTest, TextOffsetsCountCharactersNotBytes) {
  BatchLine request = Parse(R"({"custom_id": "q", "url": "/v1/completions",
      "body": {"prompt": [1], "logprobs": 0}})");
  OutputContext context = Context();
  context.token_text = [](int32_t id) { return id == 5 ? std::string("喜庆") : std::string("ab"); };
  json line = json::parse(FormatResultLine(request, Result(), context));
  EXPECT_EQ(line["response"]["body"]["choices"][0]["logprobs"]["text_offset"], json({0, 2}));
}

TEST(BatchOutputTest, ErrorLine) {
  json line = json::parse(FormatErrorLine("q9", "job-1:9", kInvalidRequest, "line 9: bad"));
  EXPECT_EQ(line["custom_id"], "q9");
  EXPECT_TRUE(line["response"].is_null());
  EXPECT_EQ(line["error"]["code"], "invalid_request");
  EXPECT_EQ(line["error"]["message"], "line 9: bad");
  json anonymous = json::parse(FormatErrorLine("", "job-1:2", kInvalidRequest, "x"));
  EXPECT_TRUE(anonymous["custom_id"].is_null());
}

TEST(BatchOutputTest, InvalidUtf8TextStillGivesValidJson) {
  BatchLine request = Parse(R"({"custom_id": "q", "url": "/v1/completions",
      "body": {"prompt": "x"}})");
  RequestResult r = Result();
  r.set_text(std::string("ok\xff", 3));
  std::string line = FormatResultLine(request, r, Context());
  EXPECT_FALSE(json::parse(line, nullptr, false).is_discarded());
}

TEST(BatchOutputTest, SeveralChoicesCarryTheirIndexAndShareUsage) {
  BatchLine request = Parse(R"({"custom_id": "q1", "method": "POST", "url": "/v1/chat/completions",
      "body": {"messages": [{"role": "user", "content": "x"}], "n": 2, "return_token_ids": true}})");
  RequestResult first = Result();
  RequestResult second = Result();
  second.clear_token_ids();
  second.add_token_ids(7);
  second.set_text("c");
  second.set_finish_reason("stop");
  json line = json::parse(FormatResultLine(request, {&first, &second}, Context()));
  const json& body = line["response"]["body"];
  ASSERT_EQ(body["choices"].size(), 2u);
  EXPECT_EQ(body["choices"][0]["index"], 0);
  EXPECT_EQ(body["choices"][0]["message"]["content"], "ab");
  EXPECT_EQ(body["choices"][0]["token_ids"], json({5, 6}));
  EXPECT_EQ(body["choices"][1]["index"], 1);
  EXPECT_EQ(body["choices"][1]["message"]["content"], "c");
  EXPECT_EQ(body["choices"][1]["finish_reason"], "stop");
  EXPECT_EQ(body["choices"][1]["token_ids"], json({7}));
  EXPECT_EQ(body["usage"]["prompt_tokens"], 3);
  EXPECT_EQ(body["usage"]["completion_tokens"], 3);  // 2 + 1
  EXPECT_EQ(body["usage"]["total_tokens"], 6);
}

}  // namespace
}  // namespace deepinfer
