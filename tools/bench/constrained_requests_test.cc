// deepinfer-bench with constrained requests, end to end on the CPU backend: a tiny dummy model
// with DeepSeek-V3's 129,280-row vocabulary and the real tokenizer (installed by
// tools/ci/setup.d/tokenizer_npm.sh). Every constrained request's sampled token must be one its
// grammar allows (the run fails otherwise), and what sequence 0 (constrained) decodes starts
// as the schema's documents do; the flag refusals.
#include "tools/bench/constrained_requests.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/tokenizer/reference_runner.h"
#include "tokenizer/tokenizer.h"
#include "tools/bench/bench_runner.h"

namespace deepinfer {
namespace {

std::string TmpPath(const std::string& name) {
  return std::string(std::getenv("TEST_TMPDIR")) + "/" + name;
}

// The parity fixture's config with DeepSeek-V3's vocabulary size.
std::string WideVocabConfig() {
  const char* src = std::getenv("TEST_SRCDIR");
  std::ifstream in(std::string(src ? src : ".") +
                   "/deepinfer/tests/fixtures/dsv3_qlora_rope/config.json");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json config = nlohmann::json::parse(text.str());
  config["vocab_size"] = 129280;
  const std::string path = TmpPath("config.json");
  std::ofstream(path) << config.dump();
  return path;
}

BenchConfig ConstrainedConfig(const std::string& tokenizer_dir) {
  BenchConfig c;
  c.model = DummyModelSpec(WideVocabConfig(), 7);
  c.backend = "cpu";
  c.dtype = "float32";
  c.decode_num_requests = {4};
  c.context_length = 8;
  c.prefill_batch_tokens = 0;
  c.output_len = 6;
  c.warmup = 1;
  c.constrained_fraction = 0.5;
  c.tokenizer = tokenizer_dir;
  const std::string schema = TmpPath("schema.json");
  std::ofstream(schema) << R"({"type": "object", "properties": {"name": {"type": "string"},
      "n": {"type": "integer"}}, "required": ["name", "n"], "additionalProperties": false})";
  c.constrained_spec = schema;
  return c;
}

TEST(ConstrainedRequestsTest, BenchDecodesConstrainedRequestsWithinTheirGrammar) {
  absl::StatusOr<std::string> dir = tokenizer::testing::ReferenceModelDir();
  ASSERT_TRUE(dir.ok()) << dir.status();
  const BenchConfig c = ConstrainedConfig(*dir);
  auto r = RunBenchmark(c);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->decode.size(), 1u);
  const DecodeResult& d = r->decode[0];
  EXPECT_EQ(d.constrained_requests, 2);
  EXPECT_GT(d.mask_fill_seconds_per_step, 0);
  ASSERT_EQ(d.seq0_tokens.size(), 6u);
  auto tok = tokenizer::Tokenizer::FromDirectory(*dir);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const std::vector<uint32_t> ids(d.seq0_tokens.begin(), d.seq0_tokens.end());
  auto decoded = (*tok)->Decode(ids, false);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  const std::string text = *decoded;
  // The schema's documents start {"name": (the space is optional).
  const std::string start = "{\"name\":";
  EXPECT_EQ(text.substr(0, std::min(text.size(), start.size())),
            start.substr(0, std::min(text.size(), start.size())))
      << text;
  EXPECT_NE(FormatBenchReport(c, *r).find("constrained (batch 4): 2 requests"), std::string::npos);
  EXPECT_NE(FormatBenchJson(c, *r).find("\"constrained_requests\": 2"), std::string::npos);
}

TEST(ConstrainedRequestsTest, RefusesBadFlags) {
  BenchConfig c = ConstrainedConfig("");
  auto no_tokenizer = RunBenchmark(c);
  EXPECT_EQ(no_tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_tokenizer.status().message().find("--tokenizer"), std::string::npos);
  c.tokenizer = "/nonexistent";
  c.constrained_fraction = 1.5;
  EXPECT_NE(RunBenchmark(c).status().message().find("--constrained-fraction must be in [0, 1]"),
            std::string::npos);
  c.constrained_fraction = 0.5;
  auto bad_dir = RunBenchmark(c);
  EXPECT_EQ(bad_dir.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_dir.status().message().find("--tokenizer '/nonexistent'"), std::string::npos)
      << bad_dir.status();
}

}  // namespace
}  // namespace deepinfer
