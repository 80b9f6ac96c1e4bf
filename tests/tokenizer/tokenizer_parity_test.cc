// Parity of Tokenizer with HF tokenizers on the real DeepSeek-V3 tokenizer over corpus.jsonl:
// ids with and without special tokens, decoding, round trips, and streaming detokenization.
// The expected values come from reference.js at test time, never from our own code.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/reference_runner.h"
#include "tokenizer/incremental_decoder.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {
namespace {

using testing::ReadJsonl;
using testing::ReferenceModelDir;
using testing::RunfilePath;
using testing::RunReference;

class TokenizerParityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto dir = ReferenceModelDir();
    ASSERT_TRUE(dir.ok()) << dir.status();
    auto tokenizer = Tokenizer::FromDirectory(*dir);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = tokenizer->release();
    const std::string corpus_path = RunfilePath("tests/tokenizer/corpus.jsonl");
    auto corpus = ReadJsonl(corpus_path);
    ASSERT_TRUE(corpus.ok()) << corpus.status();
    auto expected = RunReference("encode " + corpus_path);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_EQ(corpus->size(), expected->size());
    for (const auto& row : *corpus) {
      if (row.contains("hex")) {
        std::string bytes = absl::HexStringToBytes(row["hex"].get<std::string>());
        inputs_->push_back(bytes);
      } else {
        inputs_->push_back(row["text"].get<std::string>());
      }
    }
    *expected_ = *std::move(expected);
  }

  static std::vector<uint32_t> Ids(const nlohmann::ordered_json& json) {
    return json.get<std::vector<uint32_t>>();
  }

  static Tokenizer* tokenizer_;
  static std::vector<std::string>* inputs_;
  static std::vector<nlohmann::ordered_json>* expected_;
};

Tokenizer* TokenizerParityTest::tokenizer_ = nullptr;
std::vector<std::string>* TokenizerParityTest::inputs_ = new std::vector<std::string>();
std::vector<nlohmann::ordered_json>* TokenizerParityTest::expected_ =
    new std::vector<nlohmann::ordered_json>();

TEST_F(TokenizerParityTest, IdsMatchHfTokenizers) {
  ASSERT_NE(tokenizer_, nullptr);
  ASSERT_GT(inputs_->size(), 100u);
  int mismatches = 0;
  for (size_t i = 0; i < inputs_->size(); ++i) {
    const std::vector<uint32_t> ids = tokenizer_->Encode((*inputs_)[i], false);
    const std::vector<uint32_t> with_special = tokenizer_->Encode((*inputs_)[i], true);
    const std::vector<uint32_t> want = Ids((*expected_)[i]["ids"]);
    const std::vector<uint32_t> want_special = Ids((*expected_)[i]["ids_with_special"]);
    if (ids != want || with_special != want_special) {
      ++mismatches;
      ADD_FAILURE() << "corpus line " << i + 1 << " '" << absl::CHexEscape((*inputs_)[i])
                    << "'\n ours: " << absl::StrJoin(ids, ",")
                    << "\n   hf: " << absl::StrJoin(want, ",");
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << inputs_->size() << " corpus lines";
}

TEST_F(TokenizerParityTest, DecodeMatchesHfAndRoundTrips) {
  ASSERT_NE(tokenizer_, nullptr);
  for (size_t i = 0; i < inputs_->size(); ++i) {
    const std::vector<uint32_t> ids = Ids((*expected_)[i]["ids"]);
    auto decoded = tokenizer_->Decode(ids, false);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, (*expected_)[i]["decoded"].get<std::string>()) << "corpus line " << i + 1;
    const std::vector<uint32_t> with_special = Ids((*expected_)[i]["ids_with_special"]);
    auto skipping = tokenizer_->Decode(with_special, /*skip_special_tokens=*/true);
    ASSERT_TRUE(skipping.ok()) << skipping.status();
    EXPECT_EQ(*skipping, (*expected_)[i]["decoded_skipping_special"].get<std::string>())
        << "corpus line " << i + 1;
    // Invalid UTF-8 comes back repaired (U+FFFD), everything else unchanged.
    auto round_trip = tokenizer_->Decode(tokenizer_->Encode((*inputs_)[i], false), false);
    ASSERT_TRUE(round_trip.ok()) << round_trip.status();
    EXPECT_EQ(*round_trip, RepairUtf8((*inputs_)[i])) << "corpus line " << i + 1;
  }
}

TEST_F(TokenizerParityTest, IncrementalDecodingEqualsOneShotAtEveryPrefix) {
  ASSERT_NE(tokenizer_, nullptr);
  for (size_t i = 0; i < inputs_->size(); ++i) {
    // With special tokens, so added tokens stream too.
    const std::vector<uint32_t> ids = tokenizer_->Encode((*inputs_)[i], true);
    IncrementalDecoder decoder(tokenizer_, /*skip_special_tokens=*/false);
    std::string streamed;
    for (size_t k = 1; k <= ids.size(); ++k) {
      const std::string piece = decoder.Add(ids[k - 1]);
      EXPECT_TRUE(IsValidUtf8(piece));
      streamed += piece;
      auto one_shot = tokenizer_->Decode(absl::MakeConstSpan(ids).subspan(0, k), false);
      ASSERT_TRUE(one_shot.ok());
      IncrementalDecoder flushed = decoder;
      ASSERT_EQ(streamed + flushed.Finish(), *one_shot)
          << "corpus line " << i + 1 << " prefix " << k;
    }
  }
}

// Ids past the tokenizer (a model's extra embedding rows) decode to nothing, one-shot and
// streamed, as HF's decode leaves them out.
TEST_F(TokenizerParityTest, UnknownIdsDecodeAsHfLeavesThemOut) {
  ASSERT_NE(tokenizer_, nullptr);
  for (size_t i = 0; i < inputs_->size(); ++i) {
    const std::vector<uint32_t> ids = Ids((*expected_)[i]["ids_with_unknown"]);
    const std::string want = (*expected_)[i]["decoded_with_unknown"].get<std::string>();
    EXPECT_EQ(tokenizer_->DecodeSkippingUnknown(ids, false), want) << "corpus line " << i + 1;
    EXPECT_FALSE(tokenizer_->Decode(ids, false).ok());
    IncrementalDecoder decoder(tokenizer_, /*skip_special_tokens=*/false);
    std::string streamed;
    for (uint32_t id : ids) streamed += decoder.Add(id);
    EXPECT_EQ(streamed + decoder.Finish(), want) << "corpus line " << i + 1;
  }
}

// The real tokenizer.json with one component swapped, so that configurations DeepSeek-V3 does
// not use (other pre-tokenizers and Split behaviors, added-token options, normalizers, a
// TemplateProcessing post-processor) are checked against HF too.
struct Variant {
  const char* name;
  std::function<void(nlohmann::json*)> apply;
};

nlohmann::json AddedToken(int id, const char* content, bool special, bool normalized, bool lstrip,
                          bool rstrip, bool single_word) {
  return {{"id", id},          {"content", content}, {"single_word", single_word},
          {"lstrip", lstrip},  {"rstrip", rstrip},   {"normalized", normalized},
          {"special", special}};
}

std::vector<Variant> Variants() {
  const nlohmann::json byte_level = {{"type", "ByteLevel"},
                                     {"add_prefix_space", false},
                                     {"trim_offsets", true},
                                     {"use_regex", false}};
  return {
      {"gpt2_byte_level",
       [](nlohmann::json* t) {
         (*t)["pre_tokenizer"] = {{"type", "ByteLevel"},
                                  {"add_prefix_space", true},
                                  {"trim_offsets", true},
                                  {"use_regex", true}};
       }},
      {"split_behaviors",
       [byte_level](nlohmann::json* t) {
         auto split = [](nlohmann::json pattern, const char* behavior, bool invert) {
           return nlohmann::json{
               {"type", "Split"}, {"pattern", pattern}, {"behavior", behavior}, {"invert", invert}};
         };
         (*t)["pre_tokenizer"] = {{"type", "Sequence"},
                                  {"pretokenizers",
                                   {split({{"Regex", "\\s+"}}, "MergedWithPrevious", false),
                                    split({{"String", ","}}, "MergedWithNext", false),
                                    split({{"Regex", "[A-Z]"}}, "Contiguous", false),
                                    split({{"Regex", "\\x{3000}"}}, "Removed", false),
                                    split({{"Regex", "[^\\p{P}]+"}}, "Isolated", true),
                                    {{"type", "Digits"}, {"individual_digits", true}},
                                    byte_level}}};
       }},
      {"digits_contiguous",
       [](nlohmann::json* t) {
         (*t)["pre_tokenizer"] = {{"type", "Sequence"},
                                  {"pretokenizers",
                                   {{{"type", "Digits"}, {"individual_digits", false}},
                                    {{"type", "ByteLevel"},
                                     {"add_prefix_space", false},
                                     {"trim_offsets", true},
                                     {"use_regex", true}}}}};
       }},
      {"added_token_options",
       [](nlohmann::json* t) {
         auto& added = (*t)["added_tokens"];
         added.push_back(AddedToken(128815, "<tool>", false, false, true, true, false));
         added.push_back(AddedToken(128816, "cat", false, false, false, false, true));
         added.push_back(AddedToken(128817, "Hello", false, true, true, false, false));
         added.push_back(AddedToken(128818, "世界", true, false, false, true, true));
         added.push_back(AddedToken(128819, "ab", false, true, false, false, false));
         added.push_back(AddedToken(128820, "abc", false, false, false, false, false));
       }},
      {"normalizers",
       [](nlohmann::json* t) {
         (*t)["normalizer"] = {
             {"type", "Sequence"},
             {"normalizers",
              {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
               {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}},
               {{"type", "Replace"}, {"pattern", {{"String", "\t"}}}, {"content", "<tab>"}},
               {{"type", "Prepend"}, {"prepend", "^"}}}}};
         auto& added = (*t)["added_tokens"];
         added.push_back(AddedToken(128815, "<tab>", false, true, false, false, false));
         added.push_back(AddedToken(128816, "^Hello", false, true, false, false, false));
       }},
      {"template_post_processor",
       [](nlohmann::json* t) {
         (*t)["post_processor"] = {
             {"type", "TemplateProcessing"},
             {"single",
              {{{"SpecialToken", {{"id", "<｜begin▁of▁sentence｜>"}, {"type_id", 0}}}},
               {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
               {{"SpecialToken", {{"id", "<｜end▁of▁sentence｜>"}, {"type_id", 0}}}}}},
             {"pair",
              {{{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
               {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}}},
             {"special_tokens",
              {{"<｜begin▁of▁sentence｜>",
                {{"id", "<｜begin▁of▁sentence｜>"},
                 {"ids", {0}},
                 {"tokens", {"<｜begin▁of▁sentence｜>"}}}},
               {"<｜end▁of▁sentence｜>",
                {{"id", "<｜end▁of▁sentence｜>"},
                 {"ids", {1}},
                 {"tokens", {"<｜end▁of▁sentence｜>"}}}}}}};
       }},
  };
}

TEST_F(TokenizerParityTest, VariantConfigurationsMatchHfTokenizers) {
  ASSERT_NE(tokenizer_, nullptr);
  auto dir = ReferenceModelDir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  std::ifstream file(*dir + "/tokenizer.json");
  std::stringstream text;
  text << file.rdbuf();
  const nlohmann::json original = nlohmann::json::parse(text.str(), nullptr, false);
  ASSERT_FALSE(original.is_discarded());
  const std::string corpus_path = RunfilePath("tests/tokenizer/corpus.jsonl");
  for (const Variant& variant : Variants()) {
    SCOPED_TRACE(variant.name);
    nlohmann::json modified = original;
    variant.apply(&modified);
    const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/" + variant.name + ".json";
    std::ofstream(path) << modified.dump();
    auto tokenizer = Tokenizer::FromParsedJson(modified, nullptr);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    auto expected = RunReference("encode " + corpus_path + " " + path);
    ASSERT_TRUE(expected.ok()) << expected.status();
    ASSERT_EQ(expected->size(), inputs_->size());
    int mismatches = 0;
    for (size_t i = 0; i < inputs_->size(); ++i) {
      const std::vector<uint32_t> ids = (*tokenizer)->Encode((*inputs_)[i], false);
      const std::vector<uint32_t> with_special = (*tokenizer)->Encode((*inputs_)[i], true);
      auto decoded = (*tokenizer)->Decode(ids, false);
      ASSERT_TRUE(decoded.ok());
      const auto& want = (*expected)[i];
      if (ids != Ids(want["ids"]) || with_special != Ids(want["ids_with_special"]) ||
          *decoded != want["decoded"].get<std::string>()) {
        if (++mismatches <= 3) {
          ADD_FAILURE() << "corpus line " << i + 1 << " '" << absl::CHexEscape((*inputs_)[i])
                        << "'\n ours: " << absl::StrJoin(with_special, ",")
                        << "\n   hf: " << absl::StrJoin(Ids(want["ids_with_special"]), ",");
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << "of " << inputs_->size() << " corpus lines";
  }
}

}  // namespace
}  // namespace deepinfer::tokenizer
