#include "tokenizer/tokenize_command.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "tokenizer/test_tokenizer_json.h"

namespace deepinfer::tokenizer {
namespace {

std::string MakeModelDir(const std::string& name, bool with_template) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
  EXPECT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  std::ofstream(dir + "/tokenizer.json") << TestTokenizerJson().dump();
  nlohmann::json config = {{"tokenizer_class", "LlamaTokenizerFast"},
                           {"add_bos_token", true},
                           {"bos_token", "<s>"},
                           {"eos_token", "</s>"}};
  if (with_template) {
    config["chat_template"] =
        "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'bad' %}"
        "{{ raise_exception('bad role') }}{% endif %}{{ m['content'] }}{{ eos_token }}"
        "{% endfor %}{% if add_generation_prompt %}<tool>{% endif %}";
  }
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  return dir;
}

struct Result {
  absl::Status status;
  std::string out, err;
};

Result RunTokenize(const std::string& dir, const std::string& input,
                   bool add_special_tokens = true) {
  std::istringstream in(input);
  std::ostringstream out, err;
  Result result;
  result.status = RunTokenizeCommand({dir, add_special_tokens}, in, out, err);
  result.out = out.str();
  result.err = err.str();
  return result;
}

TEST(TokenizeCommandTest, TextAndMessagesLines) {
  const std::string dir = MakeModelDir("model", true);
  Result r = RunTokenize(dir,
                         "{\"text\": \"hello world\"}\n"
                         "{\"messages\": [{\"role\": \"user\", \"content\": \"hello\"}]}\n");
  EXPECT_TRUE(r.status.ok()) << r.status;
  EXPECT_EQ(r.out,
            "{\"ids\":[265,259,264]}\n"
            "{\"prompt\":\"<s>hello</s><tool>\",\"ids\":[265,259,266,267]}\n");
  EXPECT_EQ(r.err, "");
  // --add-special-tokens=false drops the BOS of text lines.
  EXPECT_EQ(RunTokenize(dir, "{\"text\": \"hello\"}\n", false).out, "{\"ids\":[259]}\n");
}

TEST(TokenizeCommandTest, BadLinesGetErrorsAndOthersStillRun) {
  const std::string dir = MakeModelDir("model", true);
  Result r = RunTokenize(dir,
                         "{\"text\": \"hello\"}\n"
                         "not json\n"
                         "{\"text\": 5}\n"
                         "{\"messages\": [{\"role\": \"bad\", \"content\": \"x\"}]}\n"
                         "{\"text\": \"a\", \"messages\": []}\n"
                         "\n"
                         "{\"text\": \"\xFF\"}\n"
                         "{\"text\": \"hello\"}\n");
  EXPECT_EQ(r.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status.message(), "6 of 8 input lines failed");
  std::istringstream lines(r.out);
  std::string line;
  std::vector<std::string> out;
  while (std::getline(lines, line)) out.push_back(line);
  ASSERT_EQ(out.size(), 8u);
  EXPECT_EQ(out[0], "{\"ids\":[265,259]}");
  EXPECT_EQ(out[1], "{\"error\":\"line 2: not valid JSON (or not valid UTF-8)\"}");
  EXPECT_EQ(out[2], "{\"error\":\"line 3: \\\"text\\\" must be a string\"}");
  EXPECT_EQ(out[3], "{\"error\":\"line 4: chat template failed: bad role\"}");
  EXPECT_EQ(out[4],
            "{\"error\":\"line 5: expected exactly one of \\\"text\\\" or \\\"messages\\\"\"}");
  EXPECT_EQ(out[5], "{\"error\":\"line 6: empty line\"}");
  EXPECT_EQ(out[6], "{\"error\":\"line 7: not valid JSON (or not valid UTF-8)\"}");
  EXPECT_EQ(out[7], "{\"ids\":[265,259]}");
  EXPECT_NE(r.err.find("tokenize: line 2: not valid JSON"), std::string::npos) << r.err;
}

TEST(TokenizeCommandTest, ModelWithoutChatTemplateStillTokenizesText) {
  const std::string dir = MakeModelDir("no_template", false);
  Result r = RunTokenize(dir, "{\"text\": \"hello\"}\n{\"messages\": []}\n");
  EXPECT_FALSE(r.status.ok());
  EXPECT_EQ(r.out,
            "{\"ids\":[265,259]}\n"
            "{\"error\":\"line 2: cannot render messages: tokenizer_config.json has no "
            "chat_template\"}\n");
}

TEST(TokenizeCommandTest, DirectoryWithoutTokenizerIsAClearError) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR")) + "/empty";
  ASSERT_EQ(std::system(("mkdir -p " + dir).c_str()), 0);
  Result r = RunTokenize(dir, "{\"text\": \"hello\"}\n");
  EXPECT_EQ(r.status.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(r.status.message().find("has no readable tokenizer.json"), std::string::npos)
      << r.status;
  EXPECT_NE(r.status.message().find(dir), std::string::npos);
  EXPECT_EQ(r.out, "");
}

}  // namespace
}  // namespace deepinfer::tokenizer
