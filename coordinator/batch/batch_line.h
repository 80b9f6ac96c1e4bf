// One line of an OpenAI Batch input file, parsed and checked:
//   {"custom_id": "...", "method": "POST", "url": "/v1/completions" |
//    "/v1/chat/completions", "body": {...}}
// Every error names the line and the field, so a bad line can be answered with its
// own error line while the rest of the job runs. Nothing is ignored silently: a field that
// is not served (OpenAI's or vLLM's, e.g. response_format) or not known at all is an error
// naming it, and the JSON itself is read with the limits of untrusted_json.h (depth, NUL
// bytes, duplicate keys, trailing data). docs/jobs.md lists the fields.
#ifndef DEEPINFER_COORDINATOR_BATCH_BATCH_LINE_H_
#define DEEPINFER_COORDINATOR_BATCH_BATCH_LINE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "proto/common.pb.h"

namespace deepinfer {

enum class BatchEndpoint { kCompletions, kChatCompletions };

struct BatchLine {
  std::string custom_id;
  BatchEndpoint endpoint = BatchEndpoint::kCompletions;
  // Exactly one of these is set: a text prompt, token ids, or chat messages.
  std::optional<std::string> prompt_text;
  std::optional<std::vector<int32_t>> prompt_token_ids;
  // Array of {"role", "content", "name", "tool_calls", "tool_call_id"}: roles are non-empty
  // strings (which ones the model knows is PromptBuilder's check), content a string or null
  // (a list of text parts arrives joined with "\n").
  std::optional<nlohmann::ordered_json> messages;
  // Chat only: "tools" passed to the chat template, if present.
  std::optional<nlohmann::ordered_json> tools;
  GenerationParams sampling;
  // Choices to generate (OpenAI's n, in [1, 128]); choice i > 0 samples with
  // ChoiceSeed(sampling.seed(), i).
  int32_t n = 1;
  // The body's "model" field, echoed in the response ("" if absent).
  std::string model;
};

// Parses one input line (1-based `line_number`, used in messages). On error,
// INVALID_ARGUMENT whose message starts "line N: " and names the field; if the line
// had a readable custom_id it is stored in `*custom_id_on_error` (may be null) so
// the error line can carry it.
// The seed of choice `index` of a request whose seed is `seed`: the seed itself for choice 0 (so
// n = 1 samples as it always did), SplitMix64(seed + index * 0x9E3779B97F4A7C15) for the others.
uint64_t ChoiceSeed(uint64_t seed, int32_t index);

absl::StatusOr<BatchLine> ParseBatchLine(absl::string_view line, int64_t line_number,
                                         std::string* custom_id_on_error = nullptr);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_BATCH_BATCH_LINE_H_
