// Generated hostile lines of an OpenAI Batch input file, for the fuzz tests of the request
// parser (coordinator/batch/batch_line_fuzz_test) and of a running coordinator
// (tests/runtime/input_hardening_test): valid completion and chat lines with one to three
// mutations each — values nested up to 100,000 levels deep, numbers too large for a double
// or an integer, invalid UTF-8, NUL bytes, every field replaced by a value of each JSON type,
// fields deleted, duplicated, unknown or refused, strange roles, cut or trailing text.
// The same seed gives the same lines; no line holds a newline.
#ifndef DEEPINFER_TESTS_TESTING_HOSTILE_LINES_H_
#define DEEPINFER_TESTS_TESTING_HOSTILE_LINES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer::testing {

// `count` lines; custom_ids are "fuzz-<i>" where the line still has one.
std::vector<std::string> MakeHostileLines(uint64_t seed, int count);

// The valid lines the mutations start from: text and token-id completions and a chat
// conversation with a system prompt, text parts, a tool call and its result, and tools.
// Each is served by a model with a tokenizer and a chat template (MakeChatModelDir).
std::vector<std::string> ValidLines(const std::string& custom_id_prefix);

}  // namespace deepinfer::testing

#endif  // DEEPINFER_TESTS_TESTING_HOSTILE_LINES_H_
