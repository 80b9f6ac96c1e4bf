#include "tokenizer/chat_template.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::tokenizer {
namespace {

const char kTemplate[] =
    "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}"
    "{% if tools %}<tools>{{ tools|tojson }}{% endif %}"
    "{% if add_generation_prompt %}[assistant]{% endif %}{{ eos_token }}";

TEST(ChatTemplateTest, RendersWithTheTransformersContext) {
  auto chat = ChatTemplate::Create(kTemplate, "<s>", "</s>");
  ASSERT_TRUE(chat.ok()) << chat.status();
  const auto messages = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "hi"}])");
  EXPECT_EQ(*(*chat)->Render(messages, true), "<s>[user]hi[assistant]</s>");
  EXPECT_EQ(*(*chat)->Render(messages, false), "<s>[user]hi</s>");
  const auto tools = nlohmann::ordered_json::parse(R"([{"name": "f", "a": 1}])");
  EXPECT_EQ(*(*chat)->Render(messages, false, tools),
            "<s>[user]hi<tools>[{\"name\": \"f\", \"a\": 1}]</s>");
  EXPECT_EQ((*chat)->Render(nlohmann::ordered_json::object(), true).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, FromTokenizerConfig) {
  auto from_string = ChatTemplate::FromTokenizerConfig(
      {{"chat_template", kTemplate}, {"bos_token", {{"content", "<b>"}}}, {"eos_token", "<e>"}});
  ASSERT_TRUE(from_string.ok()) << from_string.status();
  EXPECT_EQ(*(*from_string)->Render(nlohmann::ordered_json::array(), false), "<b><e>");
  auto from_list =
      ChatTemplate::FromTokenizerConfig({{"chat_template",
                                          {{{"name", "tool_use"}, {"template", "tools"}},
                                           {{"name", "default"}, {"template", "x"}}}}});
  ASSERT_TRUE(from_list.ok()) << from_list.status();
  EXPECT_EQ(*(*from_list)->Render(nlohmann::ordered_json::array(), false), "x");
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig({{"bos_token", "<s>"}}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(ChatTemplate::FromTokenizerConfig({{"chat_template", "{% if %}"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ChatTemplateTest, RaiseExceptionIsAborted) {
  auto chat = ChatTemplate::Create("{{ raise_exception('no system role') }}", "", "");
  ASSERT_TRUE(chat.ok());
  auto rendered = (*chat)->Render(nlohmann::ordered_json::array(), true);
  EXPECT_EQ(rendered.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(rendered.status().message(), "no system role");
}

TEST(ChatTemplateTest, RolesAreTheStringsComparedWithARole) {
  auto chat = ChatTemplate::Create(
      "{% for message in messages %}"
      "{% if message['role'] == 'system' %}S{% endif %}"
      "{% if message.role == \"user\" %}U{% elif 'assistant' == message['role'] %}A{% endif %}"
      "{% if message['role'] in ['tool', 'ipython'] %}T{% endif %}"
      "{% set role = message.role %}{% if role != 'developer' %}{{ role }}{% endif %}"
      "{% if message.content == 'not a role' %}{% endif %}"
      "{{ 'x' if message['role'] == 'user' else 'y' }}"
      "{% endfor %}",
      "", "");
  ASSERT_TRUE(chat.ok()) << chat.status();
  EXPECT_THAT((*chat)->roles(), ::testing::ElementsAre("system", "user", "assistant", "tool",
                                                       "ipython", "developer"));
  EXPECT_FALSE((*chat)->reads_tools());
  auto plain = ChatTemplate::Create(kTemplate, "", "");
  ASSERT_TRUE(plain.ok());
  EXPECT_TRUE((*plain)->roles().empty());
  EXPECT_TRUE((*plain)->reads_tools());
}

}  // namespace
}  // namespace deepinfer::tokenizer
