// Helpers for end-to-end tests that run batch jobs: reading a file whole, making an OpenAI Batch
// job of completion requests with random token-id prompts, and running a job with `deepinfer run`.
#ifndef DEEPINFER_TESTS_TESTING_BATCH_JOBS_H_
#define DEEPINFER_TESTS_TESTING_BATCH_JOBS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "coordinator/client/coordinator_client.h"
#include "nlohmann/json.hpp"

namespace deepinfer::testing {

// The whole file, or "" if it cannot be read.
std::string ReadFile(const std::string& path);

// `n` /v1/completions lines ("req-0" ...) with prompts of 3..22 random token ids in 2..999
// (no BOS/EOS on the fixtures), `max_tokens` each, token ids returned; every third request
// samples (temperature 0.8, top_p 0.9, seed 1000 + i), the others are greedy.
std::string MakeCompletionJob(int n, int max_tokens, uint32_t seed, bool ignore_eos = true);

// Polls job `id` until `done` holds, for at most 10 minutes; if it never does, the test fails
// with the job's last state and `diagnostics()` (e.g. the coordinator's log). Returns the last
// state seen.
Job WaitForJob(CoordinatorClient& client, const std::string& id,
               const std::function<bool(const Job&)>& done,
               const std::function<std::string()>& diagnostics);

// What `deepinfer run` gave.
struct CliJobRun {
  std::map<std::string, nlohmann::json> lines;  // the output lines by custom_id
  std::string err;                              // its stderr (the job summary)
};

// Runs `deepinfer run` (from the runfiles) on `input` with `flags` (--model=... and any others),
// --timeout-s=600 and its input, output, log and --state-dir=TempPath(name + ".state") under
// TempPath(name + ...), for at most 15 minutes. A run that fails or an output line that is not
// JSON fails the test.
CliJobRun RunCliJob(const std::string& name, const std::string& input,
                    const std::vector<std::string>& flags);

}  // namespace deepinfer::testing

#endif  // DEEPINFER_TESTS_TESTING_BATCH_JOBS_H_
