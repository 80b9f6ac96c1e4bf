// A model directory that serves chat for tests: the weights and config of an HF-made
// fixture (tests/fixtures/) linked in, with the small test tokenizer
// (tokenizer/test_tokenizer_json.h, its vocabulary padded with "<unused_N>" tokens
// up to the model's) and a chat template shaped like DeepSeek-V3's
// (system prompt first, tools, user / assistant with tool calls / tool turns).
#ifndef DEEPINFER_TESTS_TESTING_CHAT_MODEL_H_
#define DEEPINFER_TESTS_TESTING_CHAT_MODEL_H_

#include <string>

#include "absl/status/status.h"

namespace deepinfer::testing {

// The chat template written by MakeChatModelDir.
extern const char kTestChatTemplate[];

// Creates `out_dir` with links to every file of `fixture_dir` and the tokenizer files.
absl::Status MakeChatModelDir(const std::string& fixture_dir, const std::string& out_dir);

}  // namespace deepinfer::testing

#endif  // DEEPINFER_TESTS_TESTING_CHAT_MODEL_H_
