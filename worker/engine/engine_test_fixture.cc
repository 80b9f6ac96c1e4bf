// The engine tests' fixture model, prompts and work items.
#include "worker/engine/engine_test_fixture.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "nlohmann/json.hpp"
#include "worker/model/model_loader.h"

namespace deepinfer::engine_testing {
namespace {

std::vector<int32_t> IntList(const nlohmann::json& obj, const char* key) {
  std::vector<int32_t> out;
  auto it = obj.find(key);
  if (it == obj.end() || !it->is_array()) return out;
  for (const auto& v : *it) {
    if (v.is_number_integer()) out.push_back(v.get<int32_t>());
  }
  return out;
}

}  // namespace

std::string FixtureDir() {
  const char* src = std::getenv("TEST_SRCDIR");
  return std::string(src ? src : ".") + "/deepinfer/tests/fixtures/dsv3_qlora_rope";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<Prompt> LoadPrompts() {
  std::vector<Prompt> out;
  nlohmann::json j = nlohmann::json::parse(ReadFile(FixtureDir() + "/expected.json"), nullptr,
                                           /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("prompts") || !j["prompts"].is_array()) return out;
  for (const auto& p : j["prompts"]) {
    if (p.is_object()) out.push_back({IntList(p, "ids"), IntList(p, "greedy_24")});
  }
  return out;
}

WorkItem Item(const std::string& id, const std::vector<int32_t>& prompt, int32_t max_tokens) {
  WorkItem item;
  item.set_request_id(id);
  item.mutable_prompt_token_ids()->Add(prompt.begin(), prompt.end());
  item.mutable_params()->set_max_tokens(max_tokens);
  item.mutable_params()->set_logprobs(-1);
  item.mutable_params()->set_seed(1234);
  return item;
}

WorkItem Sampled(const std::string& id, const std::vector<int32_t>& prompt, int32_t max_tokens,
                 uint64_t seed) {
  WorkItem item = Item(id, prompt, max_tokens);
  item.mutable_params()->set_temperature(0.9f);
  item.mutable_params()->set_top_p(0.95f);
  item.mutable_params()->set_seed(seed);
  return item;
}

std::vector<int32_t> Tokens(const RequestResult& r) {
  return std::vector<int32_t>(r.token_ids().begin(), r.token_ids().end());
}

CpuBackend* FixtureModelTest::backend_ = nullptr;
CausalLm* FixtureModelTest::model_ = nullptr;

void FixtureModelTest::SetUpTestSuite() {
  backend_ = new CpuBackend(2);
  auto m = LoadModel(FixtureDir(), backend_);
  ASSERT_TRUE(m.ok()) << m.status();
  model_ = m->release();
}

void FixtureModelTest::TearDownTestSuite() {
  delete model_;
  model_ = nullptr;
  delete backend_;
  backend_ = nullptr;
}

void FixtureModelTest::SetUp() {
  prompts_ = LoadPrompts();
  ASSERT_EQ(prompts_.size(), 4u);
  for (const Prompt& p : prompts_) ASSERT_EQ(p.greedy.size(), 24u);
}

}  // namespace deepinfer::engine_testing
