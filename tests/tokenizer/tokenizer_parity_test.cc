// Parity of Tokenizer with HF tokenizers on the real DeepSeek-V3 tokenizer over corpus.jsonl:
// ids with and without special tokens, decoding, round trips, and streaming detokenization.
// The expected values come from reference.js at test time, never from our own code.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "tests/tokenizer/reference_runner.h"
#include "worker/tokenizer/incremental_decoder.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/tokenizer/utf8.h"

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
      auto piece = decoder.Add(ids[k - 1]);
      ASSERT_TRUE(piece.ok()) << piece.status();
      EXPECT_TRUE(IsValidUtf8(*piece));
      streamed += *piece;
      auto one_shot = tokenizer_->Decode(absl::MakeConstSpan(ids).subspan(0, k), false);
      ASSERT_TRUE(one_shot.ok());
      IncrementalDecoder flushed = decoder;
      auto rest = flushed.Finish();
      ASSERT_TRUE(rest.ok());
      ASSERT_EQ(streamed + *rest, *one_shot) << "corpus line " << i + 1 << " prefix " << k;
    }
  }
}

}  // namespace
}  // namespace deepinfer::tokenizer
