#include "coordinator/batch/prompt_builder.h"

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tokenizer/test_tokenizer_json.h"

namespace deepinfer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

BatchLine Parse(const std::string& line) {
  auto parsed = ParseBatchLine(line, 1);
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  return *parsed;
}

std::unique_ptr<PromptBuilder> WithTokenizer(int64_t context) {
  auto tok = tokenizer::Tokenizer::FromJson(tokenizer::TestTokenizerJson().dump(), nullptr);
  EXPECT_TRUE(tok.ok()) << tok.status();
  auto chat = tokenizer::ChatTemplate::Create(
      "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}",
      "<s>", "</s>");
  EXPECT_TRUE(chat.ok()) << chat.status();
  return std::make_unique<PromptBuilder>(ModelLimits{400, context}, std::move(*tok),
                                         std::move(*chat));
}

TEST(PromptBuilderTest, TokenIdsPassThrough) {
  PromptBuilder builder({100, 50}, nullptr, nullptr);
  auto ids = builder.Build(Parse(R"({"custom_id": "a", "url": "/v1/completions",
                                     "body": {"prompt": [1, 2, 99], "max_tokens": 3}})"));
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(1, 2, 99));
}

TEST(PromptBuilderTest, TextNeedsATokenizer) {
  PromptBuilder builder({100, 50}, nullptr, nullptr);
  auto ids = builder.Build(Parse(R"({"custom_id": "a", "url": "/v1/completions",
                                     "body": {"prompt": "hello"}})"));
  EXPECT_THAT(std::string(ids.status().message()), HasSubstr("no tokenizer"));
  auto chat = builder.Build(Parse(R"({"custom_id": "a", "url": "/v1/chat/completions",
      "body": {"messages": [{"role": "user", "content": "x"}]}})"));
  EXPECT_THAT(std::string(chat.status().message()), HasSubstr("not served"));
}

TEST(PromptBuilderTest, TextAndChatAreTokenized) {
  auto builder = WithTokenizer(100);
  auto text = builder->Build(Parse(R"({"custom_id": "a", "url": "/v1/completions",
                                       "body": {"prompt": "hello world"}})"));
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_THAT(*text, ElementsAre(259, 264));  // "hello", "Ġworld" in the test vocabulary
  auto chat = builder->Build(Parse(R"({"custom_id": "a", "url": "/v1/chat/completions",
      "body": {"messages": [{"role": "user", "content": "hello"}]}})"));
  ASSERT_TRUE(chat.ok()) << chat.status();
  // "<user>hello<assistant>" byte by byte except the merged "hello".
  EXPECT_EQ(chat->front(), '<');
  EXPECT_EQ(builder->TokenText(259), "hello");
}

// The model's vocabulary (400) is larger than the test tokenizer's (ids 0..268): ids between
// the two are valid prompt ids and name no text; ids past the model's vocabulary are refused.
TEST(PromptBuilderTest, IdsPastTheTokenizerButInTheModel) {
  auto builder = WithTokenizer(100);
  auto ids = builder->Build(Parse(R"({"custom_id": "a", "url": "/v1/completions",
                                      "body": {"prompt": [259, 300, 399]}})"));
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(*ids, ElementsAre(259, 300, 399));
  EXPECT_EQ(builder->TokenText(300), "");
  EXPECT_EQ(builder->TokenText(399), "");
  auto outside = builder->Build(Parse(R"({"custom_id": "a", "url": "/v1/completions",
                                          "body": {"prompt": [259, 400]}})"));
  EXPECT_THAT(std::string(outside.status().message()),
              HasSubstr("token id 400 is outside the vocabulary (size 400)"));
}

TEST(PromptBuilderTest, VocabularyAndContextLimits) {
  PromptBuilder builder({100, 10}, nullptr, nullptr);
  auto outside = builder.Build(Parse(R"({"custom_id": "a", "url": "/v1/completions",
                                         "body": {"prompt": [1, 100]}})"));
  EXPECT_THAT(std::string(outside.status().message()),
              HasSubstr("token id 100 is outside the vocabulary (size 100)"));
  auto too_long = builder.Build(Parse(R"({"custom_id": "a", "url": "/v1/completions",
                                          "body": {"prompt": [1, 2, 3], "max_tokens": 8}})"));
  EXPECT_THAT(std::string(too_long.status().message()),
              HasSubstr("plus max_tokens (8) exceeds the context length (10)"));
  auto fits = builder.Build(Parse(R"({"custom_id": "a", "url": "/v1/completions",
                                      "body": {"prompt": [1, 2, 3], "max_tokens": 7}})"));
  EXPECT_TRUE(fits.ok());
}

TEST(PromptBuilderTest, FromModelFixtureHasNoTokenizer) {
  auto builder = PromptBuilder::FromModel("tests/fixtures/dsv3_qlora_rope");
  ASSERT_TRUE(builder.ok()) << builder.status();
  EXPECT_FALSE((*builder)->has_tokenizer());
  EXPECT_EQ((*builder)->TokenText(42), "token_id:42");
  EXPECT_GT((*builder)->limits().vocab_size, 0);
  auto missing = PromptBuilder::FromModel("/nonexistent/model");
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/model"));
}

TEST(PromptBuilderTest, RolesMustBeOpenAIsOrTheTemplatesOwn) {
  auto builder = WithTokenizer(100);
  EXPECT_THAT(builder->roles(), ElementsAre("system", "user", "assistant", "tool"));
  auto chat = [&](const std::string& messages) {
    return builder->Build(Parse(
        absl::StrCat(R"({"custom_id": "a", "url": "/v1/chat/completions", "body": {"messages": )",
                     messages, "}}")));
  };
  EXPECT_TRUE(chat(R"([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                       {"role": "assistant", "content": "a"}, {"role": "tool", "content": "t"}])")
                  .ok());
  EXPECT_EQ(chat(R"([{"role": "user", "content": "hi"}, {"role": "hacker", "content": "x"}])")
                .status()
                .message(),
            "body.messages[1].role 'hacker' is not a role of the model's chat template (system, "
            "user, assistant, tool)");
  EXPECT_THAT(std::string(chat(R"([{"role": "wizard", "content": "x"}])").status().message()),
              HasSubstr("'wizard' is not a role"));
  // A template's own roles are accepted too.
  auto tok = tokenizer::Tokenizer::FromJson(tokenizer::TestTokenizerJson().dump(), nullptr);
  ASSERT_TRUE(tok.ok());
  auto templ = tokenizer::ChatTemplate::Create(
      "{% for m in messages %}{% if m['role'] == 'developer' %}D{% endif %}{{ m.content }}"
      "{% endfor %}",
      "", "");
  ASSERT_TRUE(templ.ok());
  PromptBuilder developer(ModelLimits{400, 100}, std::move(*tok), std::move(*templ));
  EXPECT_THAT(developer.roles(), ElementsAre("system", "user", "assistant", "tool", "developer"));
  EXPECT_TRUE(developer
                  .Build(Parse(R"({"custom_id": "a", "url": "/v1/chat/completions", "body":
                                   {"messages": [{"role": "developer", "content": "x"}]}})"))
                  .ok());
}

TEST(PromptBuilderTest, ToolsAreRefusedWhenTheTemplateDoesNotRenderThem) {
  auto builder = WithTokenizer(100);  // its template never mentions tools
  const auto line = [](const std::string& tools) {
    return Parse(absl::StrCat(R"({"custom_id": "a", "url": "/v1/chat/completions", "body":
        {"messages": [{"role": "user", "content": "x"}], "tools": )",
                              tools, "}}"));
  };
  EXPECT_EQ(builder->Build(line(R"([{"type": "function", "function": {"name": "f"}}])"))
                .status()
                .message(),
            "body.tools: the model's chat template does not render tools; leave them out");
  EXPECT_TRUE(builder->Build(line("[]")).ok());
}

TEST(PromptBuilderTest, StopTokenIdsMustBeInTheVocabulary) {
  PromptBuilder builder({100, 50}, nullptr, nullptr);
  auto ids = builder.Build(Parse(R"({"custom_id": "a", "url": "/v1/completions",
                                     "body": {"prompt": [1], "stop_token_ids": [5, 100]}})"));
  EXPECT_EQ(ids.status().message(),
            "body.stop_token_ids: token id 100 is outside the vocabulary (size 100)");
}

TEST(PromptBuilderTest, LogitBiasKeysMustBeInTheVocabulary) {
  PromptBuilder builder({100, 50}, nullptr, nullptr);
  auto ok = builder.Build(Parse(R"({"custom_id": "a", "url": "/v1/completions",
                                    "body": {"prompt": [1], "logit_bias": {"99": 5}}})"));
  EXPECT_TRUE(ok.ok()) << ok.status();
  auto ids = builder.Build(Parse(R"({"custom_id": "a", "url": "/v1/completions",
                                     "body": {"prompt": [1], "logit_bias": {"5": 1, "100": -1}}})"));
  EXPECT_EQ(ids.status().message(),
            "body.logit_bias: key \"100\" is outside the vocabulary (size 100)");
}

}  // namespace
}  // namespace deepinfer
