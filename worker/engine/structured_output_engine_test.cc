// Structured output end to end in the engine: a random-weight model (the dsv3_qlora_rope
// fixture's shapes with DeepSeek-V3's 129,280-row vocabulary) over the real DeepSeek-V3
// tokenizer (tools/ci/setup.d/tokenizer_npm.sh installs it), sampled at temperature 1 with
// many seeds, constrained and unconstrained requests in one batch. Every constrained output
// must end by the grammar completing and be independently valid: JSON parsed by nlohmann and
// validated by Python's jsonschema (skipped with a message when no such Python is found),
// regexes checked with std::regex, choices by membership. Seeds make results repeatable. Outputs
// are the same with async scheduling on and off.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/tokenizer/reference_runner.h"
#include "tokenizer/tokenizer.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/engine/engine.h"
#include "worker/model/model_loader.h"

namespace deepinfer {
namespace {

using ::testing::HasSubstr;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope";
}

// A Python with the jsonschema package: $DEEPINFER_PYTHON, else python3.
std::string PythonWithJsonschema() {
  std::vector<std::string> candidates;
  if (const char* p = std::getenv("DEEPINFER_PYTHON")) candidates.push_back(p);
  candidates.push_back("python3");
  for (const std::string& py : candidates) {
    if (std::system((py + " -c 'import jsonschema' 2>/dev/null").c_str()) == 0) return py;
  }
  return "";
}

const char* const kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "member": {"type": "boolean"}},
        "required": ["name", "age", "member"], "additionalProperties": false})",
    R"({"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1,
        "maxItems": 3})",
    R"({"type": "object", "properties": {"day": {"type": "string", "format": "date"},
        "score": {"type": "number", "minimum": -1, "maximum": 1}},
        "required": ["day", "score"], "additionalProperties": false})",
};
constexpr char kRegex[] = "[A-Z]{3}-[0-9]{2,4}";
const std::vector<std::string> kChoices = {"positive", "negative", "neutral"};

class StructuredOutputEngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::string> dir = tokenizer::testing::ReferenceModelDir();
    if (!dir.ok()) GTEST_SKIP() << "no DeepSeek-V3 tokenizer: " << dir.status();
    auto tok = tokenizer::Tokenizer::FromDirectory(*dir);
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = std::move(*tok);
    nlohmann::json config = nlohmann::json::parse(ReadFile(FixtureDir() + "/config.json"));
    config["vocab_size"] = 129280;
    const std::string path = std::string(std::getenv("TEST_TMPDIR")) + "/config.json";
    std::ofstream(path) << config.dump();
    backend_ = std::make_unique<CpuBackend>(2);
    auto model = LoadModel("dummy:" + path + "@7", backend_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto eos = tokenizer_->TokenToId("<｜end▁of▁sentence｜>");
    ASSERT_TRUE(eos.has_value());
    eos_ = static_cast<int32_t>(*eos);
  }

  std::map<std::string, RequestResult> Run(std::vector<WorkItem> items,
                                           bool async_scheduling = true) {
    auto pool =
        KvBlockPool::Create(backend_.get(), KvBlockPoolOptions{model_->CacheSpec(), 512, 16});
    EXPECT_TRUE(pool.ok()) << pool.status();
    RequestQueue queue;
    EngineOptions options;
    options.eos_token_ids = {eos_};
    options.async_scheduling = async_scheduling;
    auto engine = Engine::Create(model_.get(), pool->get(), &queue, tokenizer_.get(), options);
    EXPECT_TRUE(engine.ok()) << engine.status();
    queue.Push(std::move(items));
    std::map<std::string, RequestResult> results;
    for (int steps = 0; (*engine)->HasWork() && steps < 5000; ++steps) {
      auto r = (*engine)->Step();
      EXPECT_TRUE(r.ok()) << r.status();
      if (!r.ok()) break;
      for (RequestResult& res : *r) results[res.request_id()] = std::move(res);
    }
    return results;
  }

  WorkItem Item(const std::string& id, uint64_t seed, int32_t max_tokens) {
    WorkItem item;
    item.set_request_id(id);
    const std::vector<uint32_t> prompt = tokenizer_->Encode("Answer in JSON:", true);
    item.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
    GenerationParams* p = item.mutable_params();
    p->set_max_tokens(max_tokens);
    p->set_temperature(1.0f);
    p->set_top_p(1.0f);
    p->set_seed(seed);
    p->set_logprobs(seed % 3 == 0 ? 2 : -1);
    return item;
  }

  std::unique_ptr<tokenizer::Tokenizer> tokenizer_;
  std::unique_ptr<CpuBackend> backend_;
  std::unique_ptr<CausalLm> model_;
  int32_t eos_ = -1;
};

TEST_F(StructuredOutputEngineTest, EveryConstrainedOutputIsValid) {
  constexpr int kSeeds = 6;
  std::vector<WorkItem> items;
  for (size_t s = 0; s < std::size(kSchemas); ++s) {
    for (int seed = 0; seed < kSeeds; ++seed) {
      WorkItem item = Item(absl::StrCat("schema", s, "_", seed), 100 * s + seed, 400);
      item.mutable_params()->mutable_structured_output()->set_kind(
          StructuredOutputSpec::JSON_SCHEMA);
      item.mutable_params()->mutable_structured_output()->set_text(kSchemas[s]);
      items.push_back(item);
    }
  }
  for (int seed = 0; seed < kSeeds; ++seed) {
    WorkItem re = Item(absl::StrCat("regex_", seed), 1000 + seed, 100);
    re.mutable_params()->mutable_structured_output()->set_kind(StructuredOutputSpec::REGEX);
    re.mutable_params()->mutable_structured_output()->set_text(kRegex);
    items.push_back(re);
    WorkItem choice = Item(absl::StrCat("choice_", seed), 2000 + seed, 100);
    choice.mutable_params()->mutable_structured_output()->set_kind(StructuredOutputSpec::CHOICE);
    for (const std::string& c : kChoices) {
      choice.mutable_params()->mutable_structured_output()->add_choices(c);
    }
    items.push_back(choice);
    items.push_back(Item(absl::StrCat("free_", seed), 3000 + seed, 12));  // unconstrained
  }
  auto results = Run(items);
  ASSERT_EQ(results.size(), items.size());

  const std::string dir = std::getenv("TEST_TMPDIR");
  std::ofstream cases(dir + "/cases.jsonl");
  int json_docs = 0;
  for (const WorkItem& item : items) {
    const RequestResult& r = results[item.request_id()];
    SCOPED_TRACE(item.request_id() + ": " + r.text());
    ASSERT_EQ(r.error_code(), "") << r.error_message();
    if (item.params().logprobs() >= 0) {
      EXPECT_EQ(r.logprobs_size(), r.token_ids_size());
    }
    if (!item.params().has_structured_output()) {
      EXPECT_EQ(r.token_ids_size(), 12);
      continue;
    }
    // Complete: ended by the stop token, which the grammar allows only once complete.
    EXPECT_EQ(r.finish_reason(), "stop");
    const StructuredOutputSpec& spec = item.params().structured_output();
    if (spec.kind() == StructuredOutputSpec::REGEX) {
      EXPECT_TRUE(std::regex_match(r.text(), std::regex(kRegex)));
    } else if (spec.kind() == StructuredOutputSpec::CHOICE) {
      EXPECT_THAT(kChoices, ::testing::Contains(r.text()));
    } else {
      nlohmann::json doc = nlohmann::json::parse(r.text(), nullptr, false);
      EXPECT_FALSE(doc.is_discarded());
      cases << nlohmann::json{{"schema", nlohmann::json::parse(spec.text())}, {"doc", r.text()}}
                   .dump()
            << "\n";
      ++json_docs;
    }
  }
  cases.close();
  const std::string python = PythonWithJsonschema();
  if (python.empty()) {
    GTEST_SKIP() << "JSON outputs parsed but not validated: no python3 with jsonschema "
                    "(apt-get install python3-jsonschema, or set DEEPINFER_PYTHON)";
  }
  std::ofstream(dir + "/validate.py") << R"py(
import json, sys
from jsonschema import Draft202012Validator, FormatChecker
bad = 0
lines = open(sys.argv[1]).read().splitlines()
for line in lines:
    case = json.loads(line)
    errors = list(Draft202012Validator(case["schema"], format_checker=FormatChecker())
                  .iter_errors(json.loads(case["doc"])))
    if errors:
        bad += 1
        print("INVALID:", case["doc"], "--", errors[0].message)
print("checked", len(lines), "invalid", bad)
)py";
  const std::string out = dir + "/validate.out";
  std::system(
      (python + " " + dir + "/validate.py " + dir + "/cases.jsonl > " + out + " 2>&1").c_str());
  EXPECT_THAT(ReadFile(out), HasSubstr(absl::StrCat("checked ", json_docs, " invalid 0")));
}

TEST_F(StructuredOutputEngineTest, SameSeedSameOutputBadSpecsAndSamplingControls) {
  WorkItem a = Item("a", 42, 200);
  a.mutable_params()->mutable_structured_output()->set_kind(StructuredOutputSpec::JSON_SCHEMA);
  a.mutable_params()->mutable_structured_output()->set_text(kSchemas[0]);
  WorkItem b = a;
  b.set_request_id("b");
  WorkItem bad = Item("bad", 1, 10);
  bad.mutable_params()->mutable_structured_output()->set_kind(StructuredOutputSpec::REGEX);
  bad.mutable_params()->mutable_structured_output()->set_text("(a");
  WorkItem eos = a;
  eos.set_request_id("ignore_eos");
  eos.mutable_params()->set_ignore_eos(true);
  // Sampling controls apply after the grammar's mask: a +100 bias on a token the grammar
  // forbids ("a" against [A-Z]...) cannot bring it back, and penalties keep outputs valid.
  WorkItem biased = Item("biased", 7, 100);
  biased.mutable_params()->mutable_structured_output()->set_kind(StructuredOutputSpec::REGEX);
  biased.mutable_params()->mutable_structured_output()->set_text(kRegex);
  const std::vector<uint32_t> lower_a = tokenizer_->Encode("a", false);
  ASSERT_EQ(lower_a.size(), 1u);
  (*biased.mutable_params()->mutable_logit_bias())[static_cast<int32_t>(lower_a[0])] = 100.0f;
  biased.mutable_params()->set_presence_penalty(1.5f);
  biased.mutable_params()->set_repetition_penalty(1.3f);
  // A grammar that can only end before min_tokens fails its request, naming min_tokens.
  WorkItem short_choice = Item("min_tokens", 8, 100);
  short_choice.mutable_params()->mutable_structured_output()->set_kind(
      StructuredOutputSpec::CHOICE);
  short_choice.mutable_params()->mutable_structured_output()->add_choices("yes");
  short_choice.mutable_params()->set_min_tokens(50);
  auto results = Run({a, b, bad, eos, biased, short_choice});
  EXPECT_EQ(results["a"].error_code(), "");
  EXPECT_EQ(results["a"].text(), results["b"].text());
  EXPECT_THAT(
      std::vector<int32_t>(results["a"].token_ids().begin(), results["a"].token_ids().end()),
      ::testing::ElementsAreArray(results["b"].token_ids()));
  EXPECT_EQ(results["bad"].error_code(), "INVALID_ARGUMENT");
  EXPECT_THAT(results["bad"].error_message(), HasSubstr("structured output: regex: unclosed '('"));
  EXPECT_THAT(results["ignore_eos"].error_message(), HasSubstr("ignore_eos cannot be combined"));
  EXPECT_EQ(results["biased"].error_code(), "") << results["biased"].error_message();
  EXPECT_EQ(results["biased"].finish_reason(), "stop");
  EXPECT_TRUE(std::regex_match(results["biased"].text(), std::regex(kRegex)))
      << results["biased"].text();
  EXPECT_EQ(results["min_tokens"].error_code(), "FAILED_PRECONDITION");
  EXPECT_THAT(results["min_tokens"].error_message(), HasSubstr("min_tokens is 50"));
}

// A constrained sequence's next mask needs its last token in the matcher: with async scheduling
// it waits for that token instead of being scheduled ahead, and every output is the same as with
// synchronous steps (constrained and free requests in one batch, penalties, logprobs).
TEST_F(StructuredOutputEngineTest, AsyncSchedulingChangesNoOutput) {
  std::vector<WorkItem> items;
  for (int seed = 0; seed < 2; ++seed) {
    WorkItem schema = Item(absl::StrCat("schema_", seed), 40 + seed, 60);
    schema.mutable_params()->mutable_structured_output()->set_kind(
        StructuredOutputSpec::JSON_SCHEMA);
    schema.mutable_params()->mutable_structured_output()->set_text(kSchemas[seed]);
    items.push_back(schema);
    WorkItem re = Item(absl::StrCat("regex_", seed), 50 + seed, 30);
    re.mutable_params()->mutable_structured_output()->set_kind(StructuredOutputSpec::REGEX);
    re.mutable_params()->mutable_structured_output()->set_text(kRegex);
    if (seed == 1) re.mutable_params()->set_presence_penalty(0.8f);
    items.push_back(re);
    WorkItem choice = Item(absl::StrCat("choice_", seed), 60 + seed, 30);
    choice.mutable_params()->mutable_structured_output()->set_kind(StructuredOutputSpec::CHOICE);
    for (const std::string& c : kChoices) {
      choice.mutable_params()->mutable_structured_output()->add_choices(c);
    }
    items.push_back(choice);
    items.push_back(Item(absl::StrCat("free_", seed), 70 + seed, 20));
  }
  const auto off = Run(items, false);
  const auto on = Run(items, true);
  ASSERT_EQ(off.size(), items.size());
  ASSERT_EQ(on.size(), items.size());
  for (const auto& [id, want] : off) {
    const RequestResult& got = on.at(id);
    SCOPED_TRACE(id);
    EXPECT_EQ(got.error_code(), want.error_code());
    EXPECT_THAT(std::vector<int32_t>(got.token_ids().begin(), got.token_ids().end()),
                ::testing::ElementsAreArray(want.token_ids()));
    EXPECT_EQ(got.text(), want.text());
    EXPECT_EQ(got.finish_reason(), want.finish_reason());
    ASSERT_EQ(got.logprobs_size(), want.logprobs_size());
    for (int i = 0; i < got.logprobs_size(); ++i) {
      EXPECT_EQ(got.logprobs(i).ShortDebugString(), want.logprobs(i).ShortDebugString());
    }
  }
  EXPECT_EQ(on.at("choice_0").finish_reason(), "stop");
}

}  // namespace
}  // namespace deepinfer
