// The request body fields that ask for structured output, read into a StructuredOutputSpec and
// compiled once so that a schema, regex or grammar that does not compile is answered with an
// error line naming the problem:
//   OpenAI  response_format: {"type": "text" | "json_object"} or
//           {"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}
//   vLLM    structured_outputs: {"json" | "regex" | "choice" | "grammar" | "json_object": true}
//           guided_json, guided_regex, guided_choice, guided_grammar
// At most one of them may ask for something.
#ifndef DEEPINFER_COORDINATOR_BATCH_STRUCTURED_OUTPUT_FIELDS_H_
#define DEEPINFER_COORDINATOR_BATCH_STRUCTURED_OUTPUT_FIELDS_H_

#include "absl/status/status.h"
#include "common/grammar/structured_output.h"
#include "nlohmann/json.hpp"
#include "proto/common.pb.h"

namespace deepinfer {

// The body fields this reads (CheckBodyFields accepts them on both endpoints).
inline constexpr const char* kStructuredOutputFields[] = {"response_format", "structured_outputs",
                                                          "guided_json",     "guided_regex",
                                                          "guided_choice",   "guided_grammar"};

// Fills `*spec` (left unset when nothing is asked for). INVALID_ARGUMENT whose message names
// the field ("body.response_format.json_schema.schema: ..."), without a line prefix.
absl::Status ParseStructuredOutput(const nlohmann::ordered_json& body, StructuredOutputSpec* spec);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_BATCH_STRUCTURED_OUTPUT_FIELDS_H_
