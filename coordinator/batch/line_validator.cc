#include "coordinator/batch/line_validator.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "coordinator/batch/batch_line.h"
#include "coordinator/batch/batch_output.h"
#include "proto/validated_request.pb.h"

namespace deepinfer {

uint64_t DefaultSeed(const std::string& job_id, int64_t line_number) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : absl::StrCat(job_id, ":", line_number)) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

std::string LineValidator::ErrorLine(const std::string& custom_id, int64_t line_number,
                                     const std::string& message) const {
  return FormatErrorLine(custom_id, absl::StrCat(job_id_, ":", line_number), kInvalidRequest,
                         message);
}

LineOutcome LineValidator::Validate(int64_t line_number, absl::string_view text) const {
  LineOutcome out;
  out.line.line_number = line_number;
  absl::StatusOr<BatchLine> line = ParseBatchLine(text, line_number, &out.custom_id);
  if (!line.ok()) {
    out.line.error_line =
        ErrorLine(out.custom_id, line_number, std::string(line.status().message()));
    return out;
  }
  out.custom_id = line->custom_id;
  out.claims_custom_id = true;
  absl::StatusOr<std::vector<int32_t>> prompt = prompts_->Build(*line);
  if (!prompt.ok()) {
    out.line.error_line =
        ErrorLine(out.custom_id, line_number,
                  absl::StrCat("line ", line_number, ": ", prompt.status().message()));
    return out;
  }
  ValidatedRequest request;
  request.set_custom_id(line->custom_id);
  request.set_chat(line->endpoint == BatchEndpoint::kChatCompletions);
  request.set_model(line->model);
  request.set_n(line->n);
  *request.mutable_sampling() = std::move(line->sampling);
  if (!request.sampling().has_seed()) {
    request.mutable_sampling()->set_seed(DefaultSeed(job_id_, line_number));
  }
  const int64_t prompt_tokens = static_cast<int64_t>(prompt->size());
  out.prompt_tokens = prompt_tokens;
  request.mutable_prompt_token_ids()->Assign(prompt->begin(), prompt->end());
  const int64_t max_tokens = request.sampling().max_tokens() > 0
                                 ? request.sampling().max_tokens()
                                 : prompts_->limits().max_context - prompt_tokens;
  out.line.reserved_tokens = max_tokens * request.n();
  out.line.request = request.SerializeAsString();
  return out;
}

std::string LineValidator::DuplicateCustomId(const LineOutcome& outcome, int64_t first_line) const {
  const int64_t n = outcome.line.line_number;
  return ErrorLine(outcome.custom_id, n,
                   absl::StrCat("line ", n, ": duplicate custom_id '", outcome.custom_id,
                                "' (first used on line ", first_line, ")"));
}

}  // namespace deepinfer
