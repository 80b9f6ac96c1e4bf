#include "tokenizer/post_processor.h"

#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace deepinfer::tokenizer {
namespace {

using ::testing::ElementsAre;

std::vector<uint32_t> Process(const nlohmann::json& config, std::vector<uint32_t> ids) {
  auto processor = PostProcessor::FromJson(config);
  EXPECT_TRUE(processor.ok()) << processor.status();
  (*processor)->Process(&ids);
  return ids;
}

const nlohmann::json kTemplate = nlohmann::json::parse(R"({
  "type": "TemplateProcessing",
  "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
             {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
  "pair": [],
  "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [101], "tokens": ["[CLS]"]},
                     "[SEP]": {"id": "[SEP]", "ids": [102, 103], "tokens": ["[SEP]", "x"]}}})");

TEST(PostProcessorTest, TemplateProcessingSurroundsTheSequence) {
  EXPECT_THAT(Process(kTemplate, {7, 8}), ElementsAre(101, 7, 8, 102, 103));
  EXPECT_THAT(Process(kTemplate, {}), ElementsAre(101, 102, 103));
}

TEST(PostProcessorTest, ByteLevelAndSequence) {
  EXPECT_THAT(Process({{"type", "ByteLevel"}, {"trim_offsets", false}}, {1, 2}), ElementsAre(1, 2));
  EXPECT_THAT(
      Process({{"type", "Sequence"}, {"processors", {{{"type", "ByteLevel"}}, kTemplate}}}, {5}),
      ElementsAre(101, 5, 102, 103));
  auto none = PostProcessor::FromJson(nullptr);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

TEST(PostProcessorTest, RejectsBrokenOrUnsupportedConfigs) {
  nlohmann::json unknown_token = kTemplate;
  unknown_token["special_tokens"].erase("[SEP]");
  EXPECT_EQ(PostProcessor::FromJson(unknown_token).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PostProcessor::FromJson({{"type", "BertProcessing"}}).status().code(),
            absl::StatusCode::kUnimplemented);
}

}  // namespace
}  // namespace deepinfer::tokenizer
