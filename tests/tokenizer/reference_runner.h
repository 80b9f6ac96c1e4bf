// Runs tests/tokenizer/reference.js (Node + the HF reference npm packages) from a Bazel test
// and returns its JSONL output. A missing package or node makes the call fail with a message
// saying how to install them, so parity tests fail loudly instead of skipping.
#ifndef TESTS_TOKENIZER_REFERENCE_RUNNER_H_
#define TESTS_TOKENIZER_REFERENCE_RUNNER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace deepinfer::tokenizer::testing {

// Path of a file of this workspace in the test's runfiles, e.g. "tests/tokenizer/corpus.jsonl".
std::string RunfilePath(const std::string& workspace_path);

// `node reference.js <args>`: stdout as one JSON value per line.
absl::StatusOr<std::vector<nlohmann::ordered_json>> RunReference(const std::string& args);

// `node reference.js model_dir`: the real DeepSeek-V3 tokenizer directory.
absl::StatusOr<std::string> ReferenceModelDir();

// The lines of a JSONL file, parsed (ordered, so key order survives into templates).
absl::StatusOr<std::vector<nlohmann::ordered_json>> ReadJsonl(const std::string& path);

}  // namespace deepinfer::tokenizer::testing

#endif  // TESTS_TOKENIZER_REFERENCE_RUNNER_H_
