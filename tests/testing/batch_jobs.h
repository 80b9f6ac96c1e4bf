// Helpers for end-to-end tests that run batch jobs: reading a file whole, and making an
// OpenAI Batch job of completion requests with random token-id prompts.
#ifndef DEEPINFER_TESTS_TESTING_BATCH_JOBS_H_
#define DEEPINFER_TESTS_TESTING_BATCH_JOBS_H_

#include <cstdint>
#include <functional>
#include <string>

#include "coordinator/client/coordinator_client.h"

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

}  // namespace deepinfer::testing

#endif  // DEEPINFER_TESTS_TESTING_BATCH_JOBS_H_
