// `deepinfer bench ...`: the benchmark needs the model and backend code (CUDA included), which
// the CLI does not link, so it lives in its own binary, deepinfer-bench, and the subcommand
// replaces this process with it, passing every argument on (`deepinfer bench --help` prints
// deepinfer-bench's help).
#ifndef DEEPINFER_COORDINATOR_CLI_BENCH_COMMAND_H_
#define DEEPINFER_COORDINATOR_CLI_BENCH_COMMAND_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace deepinfer {

// deepinfer-bench next to the CLI binary in `self_dir` (bin/ of tools/setup.sh), or where
// Bazel puts it relative to coordinator/cli (bazel-bin/tools/bench/). The environment variable
// DEEPINFER_BENCH, when set, names the binary instead. NOT_FOUND lists the places tried.
absl::StatusOr<std::string> FindBenchBinary(const std::string& self_dir);

// Finds deepinfer-bench and execs it with `args`; returns only on failure (exit code 1 or 127,
// after printing why).
int BenchCommand(const std::vector<std::string>& args);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_CLI_BENCH_COMMAND_H_
