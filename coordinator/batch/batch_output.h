// Builds OpenAI Batch output lines: a completion or chat.completion body for a finished
// request, or an error line for a request that could not run.
//
//   {"id": "batch_req_<request id>", "custom_id": ..., "response": {"status_code": 200,
//    "request_id": ..., "body": {...}}, "error": null}
//   {"id": ..., "custom_id": ..., "response": null, "error": {"code": ..., "message": ...}}
#ifndef DEEPINFER_COORDINATOR_BATCH_BATCH_OUTPUT_H_
#define DEEPINFER_COORDINATOR_BATCH_BATCH_OUTPUT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "coordinator/batch/batch_line.h"
#include "proto/cluster.pb.h"

namespace deepinfer {

// Error codes on error lines.
inline constexpr char kInvalidRequest[] = "invalid_request";
inline constexpr char kInternalError[] = "internal_error";

struct OutputContext {
  std::string request_id;  // "<job id>:<line number>"
  std::string model;       // echoed as body.model when the request named none
  int64_t created_unix_s = 0;
  // Text of one token, for logprobs ("" is fine when there is no tokenizer).
  std::function<std::string(int32_t)> token_text;
};

// The output line for a request that ran. `result` must not carry an error.
std::string FormatResultLine(const BatchLine& request, const RequestResult& result,
                             const OutputContext& context);
// The same for a request with several choices (n > 1): choices[i] is choice i (`index` i);
// usage counts the completion tokens of all of them. At least one choice, none with an error.
std::string FormatResultLine(const BatchLine& request,
                             const std::vector<const RequestResult*>& choices,
                             const OutputContext& context);

// The output line for a request that failed; `custom_id` may be empty (unreadable line).
std::string FormatErrorLine(const std::string& custom_id, const std::string& request_id,
                            const std::string& code, const std::string& message);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_BATCH_BATCH_OUTPUT_H_
