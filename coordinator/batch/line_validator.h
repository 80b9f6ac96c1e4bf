// LineValidator: one request line of a job's input, parsed (ParseBatchLine), turned into
// prompt ids (PromptBuilder) and checked, as the store keeps it (ValidatedLine): a
// ValidatedRequest to run, or the error line that answers it. Pure and thread-safe, so that a
// job's lines are validated on every core (JobValidator). Whether a line's custom_id was used
// by an earlier line is the caller's question (the store's claims); DuplicateCustomId makes the
// error line when it was.
#ifndef DEEPINFER_COORDINATOR_BATCH_LINE_VALIDATOR_H_
#define DEEPINFER_COORDINATOR_BATCH_LINE_VALIDATOR_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "coordinator/batch/batch_job_store.h"
#include "coordinator/batch/prompt_builder.h"

namespace deepinfer {

// What validating one line gave.
struct LineOutcome {
  ValidatedLine line;
  // The line parsed, so it claims its custom_id (the first line with an id keeps it, even if
  // its prompt then fails).
  bool claims_custom_id = false;
  std::string custom_id;      // "" when the line has no readable one
  int64_t prompt_tokens = 0;  // of a request that can run
};

class LineValidator {
 public:
  // `prompts` must outlive the validator.
  LineValidator(std::string job_id, const PromptBuilder* prompts)
      : job_id_(std::move(job_id)), prompts_(prompts) {}

  // `text` is line `line_number` (1-based) of the input, without its newline, not blank.
  LineOutcome Validate(int64_t line_number, absl::string_view text) const;

  // The error line of `outcome`'s line, whose custom_id line `first_line` used first.
  std::string DuplicateCustomId(const LineOutcome& outcome, int64_t first_line) const;

 private:
  std::string ErrorLine(const std::string& custom_id, int64_t line_number,
                        const std::string& message) const;

  const std::string job_id_;
  const PromptBuilder* const prompts_;
};

// The seed of a request line that gives none: derived from its job and line, so that running
// it again (after a worker failure) gives the same tokens.
uint64_t DefaultSeed(const std::string& job_id, int64_t line_number);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_BATCH_LINE_VALIDATOR_H_
