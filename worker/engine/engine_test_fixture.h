// What the engine's tests on the HF fixture dsv3_qlora_rope share: the fixture's directory, its
// prompts with HF's greedy continuations, work items, and a test base that loads the model once
// per suite on the CPU backend.
#ifndef DEEPINFER_WORKER_ENGINE_ENGINE_TEST_FIXTURE_H_
#define DEEPINFER_WORKER_ENGINE_ENGINE_TEST_FIXTURE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/cluster.pb.h"
#include "proto/worker.pb.h"
#include "worker/backend/cpu/cpu_backend.h"
#include "worker/model/causal_lm.h"

namespace deepinfer::engine_testing {

struct Prompt {
  std::vector<int32_t> ids;
  std::vector<int32_t> greedy;  // HF's 24-token greedy continuation
};

// The fixture's directory in the test's runfiles.
std::string FixtureDir();

// The whole file, or "" if it cannot be read.
std::string ReadFile(const std::string& path);

// The fixture's prompts (expected.json); none if it cannot be read.
std::vector<Prompt> LoadPrompts();

// A greedy request of `max_tokens` without logprobs, seed 1234.
WorkItem Item(const std::string& id, const std::vector<int32_t>& prompt, int32_t max_tokens);

// Item() sampled: temperature 0.9, top_p 0.95, `seed`.
WorkItem Sampled(const std::string& id, const std::vector<int32_t>& prompt, int32_t max_tokens,
                 uint64_t seed);

std::vector<int32_t> Tokens(const RequestResult& r);

// The fixture model on a two-thread CPU backend, loaded once per suite, and its four prompts.
class FixtureModelTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite();
  static void TearDownTestSuite();
  void SetUp() override;

  static CpuBackend* backend_;
  static CausalLm* model_;
  std::vector<Prompt> prompts_;
};

}  // namespace deepinfer::engine_testing

#endif  // DEEPINFER_WORKER_ENGINE_ENGINE_TEST_FIXTURE_H_
