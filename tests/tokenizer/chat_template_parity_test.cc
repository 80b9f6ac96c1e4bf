// Parity of our Jinja renderer with @huggingface/jinja: the real DeepSeek-V3 chat template on
// conversations.jsonl, and feature templates on jinja_cases.jsonl. Where the reference fails
// (e.g. raise_exception, type errors), ours must fail too. References are computed by
// reference.js at test time.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/tokenizer/reference_runner.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/jinja/template.h"
#include "tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {
namespace {

using testing::ReadJsonl;
using testing::ReferenceModelDir;
using testing::RunfilePath;
using testing::RunReference;

TEST(ChatTemplateParityTest, DeepSeekV3TemplateMatchesHuggingFaceJinja) {
  auto dir = ReferenceModelDir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto tokenizer = Tokenizer::FromDirectory(*dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto chat_template = ChatTemplate::FromTokenizerConfig((*tokenizer)->config());
  ASSERT_TRUE(chat_template.ok()) << chat_template.status();
  // What the template tells apart (read off its text): the coordinator accepts these roles
  // and refuses tools, which this template never renders.
  EXPECT_EQ((*chat_template)->roles(),
            std::vector<std::string>({"system", "user", "assistant", "tool"}));
  EXPECT_FALSE((*chat_template)->reads_tools());

  const std::string path = RunfilePath("tests/tokenizer/conversations.jsonl");
  auto conversations = ReadJsonl(path);
  ASSERT_TRUE(conversations.ok()) << conversations.status();
  auto expected = RunReference("render " + path);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(conversations->size(), expected->size());
  ASSERT_GE(conversations->size(), 10u);
  int mismatches = 0;
  for (size_t i = 0; i < conversations->size(); ++i) {
    const auto& row = (*conversations)[i];
    const bool add_generation_prompt =
        row.contains("add_generation_prompt") ? row["add_generation_prompt"].get<bool>() : true;
    const nlohmann::ordered_json tools = row.contains("tools") ? row["tools"] : nullptr;
    auto rendered = (*chat_template)->Render(row["messages"], add_generation_prompt, tools);
    const auto& want = (*expected)[i];
    if (want.contains("error")) {
      EXPECT_FALSE(rendered.ok()) << "conversation " << i + 1 << ": reference failed with "
                                  << want["error"] << " but we rendered " << *rendered;
      mismatches += rendered.ok();
      continue;
    }
    ASSERT_TRUE(rendered.ok()) << "conversation " << i + 1 << ": " << rendered.status();
    EXPECT_EQ(*rendered, want["prompt"].get<std::string>()) << "conversation " << i + 1;
    mismatches += *rendered != want["prompt"].get<std::string>();
  }
  EXPECT_EQ(mismatches, 0) << "of " << conversations->size() << " conversations";
}

TEST(ChatTemplateParityTest, JinjaFeaturesMatchHuggingFaceJinja) {
  const std::string path = RunfilePath("tests/tokenizer/jinja_cases.jsonl");
  auto cases = ReadJsonl(path);
  ASSERT_TRUE(cases.ok()) << cases.status();
  auto expected = RunReference("jinja " + path);
  ASSERT_TRUE(expected.ok()) << expected.status();
  ASSERT_EQ(cases->size(), expected->size());
  for (size_t i = 0; i < cases->size(); ++i) {
    const auto& row = (*cases)[i];
    const std::string source = row["template"].get<std::string>();
    auto parsed = jinja::Template::Parse(source);
    absl::StatusOr<std::string> rendered =
        parsed.ok() ? (*parsed)->Render(jinja::Value::FromJson(row["context"]))
                    : absl::StatusOr<std::string>(parsed.status());
    const auto& want = (*expected)[i];
    if (want.contains("error")) {
      EXPECT_FALSE(rendered.ok()) << "case " << i + 1 << " " << source << ": reference failed with "
                                  << want["error"] << " but we rendered " << *rendered;
    } else {
      ASSERT_TRUE(rendered.ok()) << "case " << i + 1 << " " << source << ": " << rendered.status();
      EXPECT_EQ(*rendered, want["output"].get<std::string>()) << "case " << i + 1 << " " << source;
    }
  }
}

}  // namespace
}  // namespace deepinfer::tokenizer
