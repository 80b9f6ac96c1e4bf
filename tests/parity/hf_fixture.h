// HfFixture: reads a parity fixture made by tools/make_fixtures.py (expected.json with prompts
// and HF's greedy continuations, logits.bin with HF's float32 logits) from the test runfiles,
// for the CPU and CUDA parity tests. Missing or malformed fields are reported as gtest failures
// and leave the fixture (partly) empty.
#ifndef DEEPINFER_TESTS_PARITY_HF_FIXTURE_H_
#define DEEPINFER_TESTS_PARITY_HF_FIXTURE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer {

struct FixturePrompt {
  std::vector<int32_t> ids;
  int64_t logits_row_offset = 0;
  std::vector<int32_t> greedy;
};

struct Fixture {
  std::string dir;
  int64_t vocab = 0;
  std::vector<float> logits;  // [rows, vocab]
  std::vector<FixturePrompt> prompts;
};

// `name` is a folder of tests/fixtures/, found under $TEST_SRCDIR/deepinfer/.
Fixture LoadFixture(const std::string& name);

}  // namespace deepinfer

#endif  // DEEPINFER_TESTS_PARITY_HF_FIXTURE_H_
