#include "coordinator/batch/batch_line.h"

#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

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
  auto line =
      ParseBatchLine(Completion(R"("prompt": "x", "max_tokens": 5, "temperature": 0.7, "top_p": 0.9,
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
  auto line = ParseBatchLine(Chat(R"("messages": [{"role": "system", "content": "Be brief."},
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
  EXPECT_THAT(ErrorOf("{not json"), StartsWith("line 7: not valid JSON near byte 3: "));
  EXPECT_EQ(ErrorOf("[1]"), "line 7: a line must be a JSON object, got a list of 1 items");
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
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "n": 0)")),
            "line 7: body.n must be in [1, 128], got 0");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "n": 129)")),
            "line 7: body.n must be in [1, 128], got 129");
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

TEST(BatchLineTest, FieldsThatAreNotServedAreRefusedByName) {
  const std::pair<const char*, const char*> not_yet[] = {
      {"guided_decoding_backend", R"("xgrammar")"},
      {"guided_whitespace_pattern", R"("[ ]*")"},
      {"structural_tag", R"({"type": "structural_tag"})"},
      {"echo", "true"},
      {"best_of", "2"},
  };
  for (const auto& [field, value] : not_yet) {
    EXPECT_THAT(ErrorOf(Completion(absl::StrCat(R"("prompt": "x", ")", field, "\": ", value))),
                StartsWith(absl::StrCat("line 7: field '", field, "' is not supported yet")))
        << field << " " << value;
    EXPECT_THAT(ErrorOf(Chat(absl::StrCat(R"("messages": [{"role": "user", "content": "x"}], ")",
                                          field, "\": ", value))),
                StartsWith(absl::StrCat("line 7: field '", field, "' is not supported yet")))
        << field << " " << value;
  }
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "min_p": 0.5)")),
            "line 7: field 'min_p' is not supported yet; leave it out or set it to 0");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "audio": {"voice": "x"})")),
            "line 7: field 'audio' is not supported");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "made_up_field": 1)")),
            "line 7: unknown field 'made_up_field' in body");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "Max_Tokens": 1)")),
            "line 7: unknown field 'Max_Tokens' in body");
  EXPECT_EQ(ErrorOf(R"({"custom_id": "a", "url": "/v1/completions", "body": {"prompt": "x"},
                        "extra": 1})"),
            "line 7: unknown field 'extra' (a line holds custom_id, method, url and body)");
  // Each endpoint's own fields.
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "messages": [])")),
            "line 7: field 'messages' belongs to /v1/chat/completions, not /v1/completions");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "max_completion_tokens": 3)")),
            "line 7: field 'max_completion_tokens' belongs to /v1/chat/completions, not "
            "/v1/completions");
  EXPECT_EQ(ErrorOf(Chat(R"("messages": [{"role": "user", "content": "x"}], "prompt": "x")")),
            "line 7: field 'prompt' belongs to /v1/completions, not /v1/chat/completions");
  EXPECT_THAT(ErrorOf(Chat(R"("messages": [{"role": "user", "content": "x"}],
                              "tool_choice": "none")")),
              HasSubstr("body.tool_choice: only \"auto\" is supported"));
}

TEST(BatchLineTest, StructuredOutputFieldsAreRead) {
  auto line = ParseBatchLine(
      Completion(R"("prompt": "x", "response_format": {"type": "json_schema", "json_schema":
                    {"name": "p", "strict": true, "schema": {"type": "object", "properties":
                    {"a": {"type": "integer"}}, "required": ["a"]}}})"),
      1);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ(line->sampling.structured_output().kind(), StructuredOutputSpec::JSON_SCHEMA);
  EXPECT_EQ(
      nlohmann::json::parse(line->sampling.structured_output().text()),
      nlohmann::json::parse(
          R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})"));
  auto chat = ParseBatchLine(Chat(R"("messages": [{"role": "user", "content": "x"}],
                                     "structured_outputs": {"choice": ["yes", "no"]})"),
                             1);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->sampling.structured_output().kind(), StructuredOutputSpec::CHOICE);
  EXPECT_THAT(chat->sampling.structured_output().choices(), ElementsAre("yes", "no"));
  auto plain =
      ParseBatchLine(Completion(R"("prompt": "x", "response_format": {"type": "text"})"), 1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_FALSE(plain->sampling.has_structured_output());
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "guided_json": {"type": "object",
                                   "patternProperties": {}})")),
            "line 7: body.guided_json: json schema: keyword 'patternProperties' is not supported "
            "(at '#')");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "guided_regex": "(a", "guided_choice": ["a"])")),
            "line 7: body.guided_regex: regex: unclosed '(' at offset 0");
}

TEST(BatchLineTest, DefaultsOfRefusedFieldsAndNullsAreAccepted) {
  auto line =
      ParseBatchLine(Completion(R"("prompt": "x", "presence_penalty": 0, "frequency_penalty": 0.0,
                    "repetition_penalty": 1, "min_tokens": 0, "echo": false, "best_of": 1,
                    "logit_bias": {}, "response_format": {"type": "text"}, "guided_json": null,
                    "user": "u1", "stream": false, "n": 1, "top_logprobs": null)"),
                     1);
  ASSERT_TRUE(line.ok()) << line.status();
  auto chat = ParseBatchLine(Chat(R"("messages": [{"role": "user", "content": "x"}],
                                     "tool_choice": "auto", "max_tokens": 4,
                                     "max_completion_tokens": 4)"),
                             1);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->sampling.max_tokens(), 4);
  EXPECT_THAT(ErrorOf(Chat(R"("messages": [{"role": "user", "content": "x"}], "max_tokens": 4,
                              "max_completion_tokens": 5)")),
              HasSubstr("differ"));
}

TEST(BatchLineTest, WrongTypesAreNamed) {
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "model": 5)")),
            "line 7: body.model must be a string, got 5");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "stream": "no")")),
            "line 7: body.stream must be true or false, got \"no\"");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "temperature": [1])")),
            "line 7: body.temperature must be a number, got a list of 1 items");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "max_tokens": 1e30)")),
            "line 7: body.max_tokens must be an integer, got 1e+30");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "max_tokens": 18446744073709551615)")),
            "line 7: body.max_tokens must be in [1, 2147483647], got 18446744073709551615");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": [1, 4294967297])")),
            "line 7: body.prompt must hold non-negative integer token ids, found 4294967297");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": {"a": 1})")),
            "line 7: body.prompt must be a string or a list of token ids, got an object of 1 keys");
}

TEST(BatchLineTest, ChatMessagesAreChecked) {
  EXPECT_EQ(ErrorOf(Chat(R"("messages": [{"role": "", "content": "x"}])")),
            "line 7: body.messages[0].role is empty");
  EXPECT_EQ(ErrorOf(Chat(R"("messages": [{"role": 3, "content": "x"}])")),
            "line 7: body.messages[0].role must be a string, got 3");
  EXPECT_EQ(ErrorOf(Chat(R"("messages": [{"role": "user", "content": "x", "mood": "happy"}])")),
            "line 7: unknown field 'mood' in body.messages[0]");
  EXPECT_EQ(ErrorOf(Chat(R"("messages": [{"role": "user", "content": "x", "audio": {}}])")),
            "line 7: field 'audio' in body.messages[0] is not supported");
  EXPECT_EQ(ErrorOf(Chat(R"("messages": [{"role": "user", "content": [
                              {"type": "image_url", "image_url": {"url": "http://x"}}]}])")),
            "line 7: body.messages[0].content[0]: content part type 'image_url' is not supported "
            "(text parts only)");
  EXPECT_EQ(ErrorOf(Chat(R"("messages": [{"role": "user", "content": 5}])")),
            "line 7: body.messages[0].content must be a string, a list of text parts, or null, "
            "got 5");
  EXPECT_EQ(ErrorOf(Chat(R"("messages": [{"role": "user", "content": "x"}], "tools": [1])")),
            "line 7: body.tools[0] must be an object, got 1");
  // Text parts become one string; the other message fields pass to the chat template.
  auto line = ParseBatchLine(Chat(R"("messages": [{"role": "user", "name": "ann", "content": [
                               {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                           {"role": "assistant", "content": null, "tool_calls": [
                               {"id": "c0", "type": "function",
                                "function": {"name": "f", "arguments": "{}"}}]},
                           {"role": "tool", "tool_call_id": "c0", "content": "1"}])"),
                             1);
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_EQ((*line->messages)[0]["content"], "a\nb");
  EXPECT_EQ((*line->messages)[0]["name"], "ann");
  EXPECT_EQ((*line->messages)[1]["tool_calls"][0]["function"]["name"], "f");
  EXPECT_EQ((*line->messages)[2]["tool_call_id"], "c0");
}

TEST(BatchLineTest, HostileJsonGetsShortErrors) {
  // A prompt nested 30,000 lists deep, as a completion and as chat content: refused before
  // anything walks it (copying or printing it recursed past the stack).
  const std::string deep(30000, '[');
  const std::string deep_end(30000, ']');
  EXPECT_EQ(ErrorOf(Completion(absl::StrCat(R"("prompt": )", deep, deep_end))),
            "line 7: nested more than 64 levels deep (objects and lists inside each other)");
  EXPECT_EQ(ErrorOf(Chat(absl::StrCat(R"("messages": [{"role": "user", "content": )", deep,
                                      deep_end, "}]"))),
            "line 7: nested more than 64 levels deep (objects and lists inside each other)");
  // Shallow enough to parse, still never printed whole.
  const std::string nested = absl::StrCat(std::string(50, '['), "1", std::string(50, ']'));
  EXPECT_EQ(ErrorOf(Completion(absl::StrCat(R"("prompt": [)", nested, "]"))),
            "line 7: body.prompt must hold non-negative integer token ids, found a list of 1 "
            "items");
  EXPECT_THAT(ErrorOf(Completion(absl::StrCat(R"("prompt": "x", "stop": [)", nested, "]"))),
              HasSubstr("found a list of 1 items"));
  // A NUL byte, or anything after the object, is an error, not the end of the line.
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x")") + std::string("\0{\"trailing\": 1}", 16)),
            absl::StrCat("line 7: a NUL byte at byte ", Completion(R"("prompt": "x")").size() + 1));
  EXPECT_THAT(ErrorOf(Completion(R"("prompt": "x")") + R"({"trailing": 1})"),
              StartsWith("line 7: data after the JSON value"));
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "max_tokens": 1, "max_tokens": 9)")),
            "line 7: duplicate key 'max_tokens' in one object");
  const std::string long_role(100000, 'r');
  std::string custom_id;
  auto parsed =
      ParseBatchLine(Chat(absl::StrCat(R"("messages": [{"role": "user", "content": "x", ")",
                                       long_role, R"(": 1}])")),
                     7, &custom_id);
  EXPECT_EQ(parsed.status().message(), absl::StrCat("line 7: unknown field '", std::string(40, 'r'),
                                                    "...' in body.messages[0]"));
  EXPECT_EQ(custom_id, "c1");
}

TEST(BatchLineTest, DemoRequestsStillParse) {
  std::ifstream in("tools/demo/requests.jsonl");
  ASSERT_TRUE(in.good());
  std::string text;
  int n = 0;
  std::vector<std::string> errors;
  while (std::getline(in, text)) {
    auto line = ParseBatchLine(text, ++n);
    if (!line.ok()) errors.push_back(std::string(line.status().message()));
  }
  EXPECT_EQ(n, 5);
  // The demo's last line is bad on purpose.
  EXPECT_THAT(errors, ElementsAre("line 5: body.max_tokens must be in [1, 2147483647], got -1"));
}

TEST(BatchLineTest, SamplingControlsAreRead) {
  auto line = ParseBatchLine(
      Completion(R"("prompt": "x", "max_tokens": 8, "logit_bias": {"500": 100, "7": -2.5},
                   "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.2,
                   "min_tokens": 5, "n": 3, "stop_token_ids": [9], "ignore_eos": true)"),
      1);
  ASSERT_TRUE(line.ok()) << line.status();
  const GenerationParams& s = line->sampling;
  ASSERT_EQ(s.logit_bias_size(), 2);
  EXPECT_EQ(s.logit_bias().at(500), 100.0f);
  EXPECT_EQ(s.logit_bias().at(7), -2.5f);
  EXPECT_EQ(s.presence_penalty(), 0.5f);
  EXPECT_EQ(s.frequency_penalty(), -1.0f);
  EXPECT_EQ(s.repetition_penalty(), 1.2f);
  EXPECT_EQ(s.min_tokens(), 5);
  EXPECT_EQ(line->n, 3);
  EXPECT_THAT(s.stop_token_ids(), ElementsAre(9));
  EXPECT_TRUE(s.ignore_eos());
  // Left out: no bias, no penalties (repetition 1), one choice.
  auto plain = ParseBatchLine(Chat(R"("messages": [{"role": "user", "content": "x"}])"), 1);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->sampling.logit_bias_size(), 0);
  EXPECT_EQ(plain->sampling.presence_penalty(), 0.0f);
  EXPECT_EQ(plain->sampling.frequency_penalty(), 0.0f);
  EXPECT_EQ(plain->sampling.repetition_penalty(), 1.0f);
  EXPECT_EQ(plain->sampling.min_tokens(), 0);
  EXPECT_EQ(plain->n, 1);
  // The same fields on chat.
  auto chat = ParseBatchLine(Chat(R"("messages": [{"role": "user", "content": "x"}],
                                     "logit_bias": {"1": 1}, "min_tokens": 100, "n": 2)"),
                             1);
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_EQ(chat->sampling.min_tokens(), 100);  // chat has no max_tokens default
  EXPECT_EQ(chat->n, 2);
}

TEST(BatchLineTest, BadSamplingControlsNameTheField) {
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "logit_bias": [1])")),
            "line 7: body.logit_bias must be an object mapping token ids to biases, got a list of "
            "1 items");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "logit_bias": {"abc": 1})")),
            "line 7: body.logit_bias: key 'abc' is not a token id (a non-negative integer)");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "logit_bias": {"-3": 1})")),
            "line 7: body.logit_bias: key '-3' is not a token id (a non-negative integer)");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "logit_bias": {"99999999999": 1})")),
            "line 7: body.logit_bias: key '99999999999' is not a token id (a non-negative "
            "integer)");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "logit_bias": {"50": 100.5})")),
            "line 7: body.logit_bias['50'] must be a number in [-100, 100], got 100.5");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "logit_bias": {"50": "1"})")),
            "line 7: body.logit_bias['50'] must be a number in [-100, 100], got \"1\"");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "presence_penalty": 2.5)")),
            "line 7: body.presence_penalty must be in [-2, 2], got 2.5");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "frequency_penalty": -3)")),
            "line 7: body.frequency_penalty must be in [-2, 2], got -3");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "frequency_penalty": true)")),
            "line 7: body.frequency_penalty must be a number, got true");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "repetition_penalty": 0)")),
            "line 7: body.repetition_penalty must be in (0, 1e+06], got 0");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "min_tokens": -1)")),
            "line 7: body.min_tokens must be in [0, 2147483647], got -1");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "min_tokens": 1.5)")),
            "line 7: body.min_tokens must be an integer, got 1.5");
  // Completions' default max_tokens is 16.
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "min_tokens": 17)")),
            "line 7: body.min_tokens (17) must not exceed the maximum number of tokens (16)");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "max_tokens": 4, "min_tokens": 5)")),
            "line 7: body.min_tokens (5) must not exceed the maximum number of tokens (4)");
  EXPECT_EQ(ErrorOf(Completion(R"("prompt": "x", "n": "2")")),
            "line 7: body.n must be an integer, got \"2\"");
}

TEST(BatchLineTest, ChoiceSeeds) {
  EXPECT_EQ(ChoiceSeed(42, 0), 42u);  // choice 0 samples as n = 1 does
  // SplitMix64 of seed + i * 0x9E3779B97F4A7C15, its published first output for state 0 being
  // 0xE220A8397B1DCDAF: seed 0, choice 1.
  EXPECT_EQ(ChoiceSeed(0, 1), 0xE220A8397B1DCDAFull);
  EXPECT_NE(ChoiceSeed(42, 1), ChoiceSeed(42, 2));
}

}  // namespace
}  // namespace deepinfer
