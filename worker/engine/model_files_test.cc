// ModelFiles: config, EOS ids and tokenizer from a model directory; unusable ones are refused
// with a message naming the problem.
#include "worker/engine/model_files.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tokenizer/test_tokenizer_json.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope";
}

std::string TempDir(const std::string& name) {
  std::string d = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  std::filesystem::create_directories(d);
  return d;
}

std::string FileText(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ModelFilesTest, FixtureHasEosFromGenerationConfigAndNoTokenizer) {
  auto files = ModelFiles::Open(FixtureDir());
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ((*files)->config.vocab_size, 1000);
  EXPECT_EQ((*files)->eos_token_ids, std::vector<int32_t>{1});
  EXPECT_EQ((*files)->tokenizer, nullptr);
  EXPECT_EQ((*files)->dir, FixtureDir());
}

TEST(ModelFilesTest, DummyWithTokenizerAndEosList) {
  const std::string dir = TempDir("dummy");
  std::filesystem::copy_file(FixtureDir() + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": [7, 9]})";
  std::ofstream(dir + "/tokenizer.json") << tokenizer::TestTokenizerJson().dump();
  auto files = ModelFiles::Open("dummy:" + dir + "/config.json@3");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ((*files)->eos_token_ids, (std::vector<int32_t>{7, 9}));
  EXPECT_NE((*files)->tokenizer, nullptr);
}

// The prefix cache's model identity: the same checkpoint anywhere is the same model; another
// config or other dummy weights are not.
TEST(ModelFilesTest, FingerprintFollowsConfigAndWeightsNotThePath) {
  auto fixture = ModelFiles::Open(FixtureDir());
  ASSERT_TRUE(fixture.ok()) << fixture.status();
  const std::string copy = TempDir("copy");
  for (const char* f : {"config.json", "generation_config.json", "model.safetensors"}) {
    std::filesystem::copy_file(FixtureDir() + "/" + f, copy + "/" + f,
                               std::filesystem::copy_options::overwrite_existing);
  }
  auto copied = ModelFiles::Open(copy);
  ASSERT_TRUE(copied.ok()) << copied.status();
  EXPECT_EQ((*copied)->fingerprint, (*fixture)->fingerprint);
  EXPECT_FALSE((*fixture)->fingerprint.empty());
  // A checkpoint of another size.
  std::ofstream(copy + "/model.safetensors", std::ios::app) << " ";
  auto grown = ModelFiles::Open(copy);
  ASSERT_TRUE(grown.ok()) << grown.status();
  EXPECT_NE((*grown)->fingerprint, (*fixture)->fingerprint);
  // Dummy weights: the seed and the config count.
  auto seed3 = ModelFiles::Open("dummy:" + FixtureDir() + "/config.json@3");
  auto seed4 = ModelFiles::Open("dummy:" + FixtureDir() + "/config.json@4");
  ASSERT_TRUE(seed3.ok() && seed4.ok());
  EXPECT_NE((*seed3)->fingerprint, (*seed4)->fingerprint);
  EXPECT_NE((*seed3)->fingerprint, (*fixture)->fingerprint);
  std::ofstream(copy + "/config2.json") << FileText(FixtureDir() + "/config.json") << "\n";
  auto other_config = ModelFiles::Open("dummy:" + copy + "/config2.json@3");
  ASSERT_TRUE(other_config.ok()) << other_config.status();
  EXPECT_NE((*other_config)->fingerprint, (*seed3)->fingerprint);
}

TEST(ModelFilesTest, RefusesUnusableDirectories) {
  auto missing = ModelFiles::Open(TempDir("empty"));
  EXPECT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("config.json"));

  const std::string dir = TempDir("noweights");
  std::filesystem::copy_file(FixtureDir() + "/config.json", dir + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto no_weights = ModelFiles::Open(dir);
  EXPECT_FALSE(no_weights.ok());
  EXPECT_THAT(std::string(no_weights.status().message()), HasSubstr(dir));

  const std::string bad_tok = TempDir("badtok");
  std::filesystem::copy_file(FixtureDir() + "/config.json", bad_tok + "/config.json",
                             std::filesystem::copy_options::overwrite_existing);
  std::ofstream(bad_tok + "/tokenizer.json") << "{not json";
  auto tok = ModelFiles::Open("dummy:" + bad_tok + "/config.json");
  EXPECT_FALSE(tok.ok());
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("tokenizer"));
}

}  // namespace
}  // namespace deepinfer
