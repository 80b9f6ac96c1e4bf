#include "tests/testing/batch_jobs.h"

#include <fstream>
#include <random>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/subprocess.h"

namespace deepinfer::testing {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream b;
  b << in.rdbuf();
  return b.str();
}

std::string MakeCompletionJob(int n, int max_tokens, uint32_t seed, bool ignore_eos) {
  using json = nlohmann::json;
  std::mt19937 rng(seed);
  std::vector<std::string> lines;
  for (int i = 0; i < n; ++i) {
    std::vector<int> prompt(3 + rng() % 20);
    for (int& t : prompt) t = 2 + static_cast<int>(rng() % 998);
    json body = {{"prompt", prompt},
                 {"max_tokens", max_tokens},
                 {"ignore_eos", ignore_eos},
                 {"return_token_ids", true}};
    if (i % 3 == 2) {
      body["temperature"] = 0.8;
      body["top_p"] = 0.9;
      body["seed"] = 1000 + i;
    } else {
      body["temperature"] = 0;
    }
    lines.push_back(json({{"custom_id", absl::StrCat("req-", i)},
                          {"method", "POST"},
                          {"url", "/v1/completions"},
                          {"body", body}})
                        .dump());
  }
  return absl::StrJoin(lines, "\n") + "\n";
}

Job WaitForJob(CoordinatorClient& client, const std::string& id,
               const std::function<bool(const Job&)>& done,
               const std::function<std::string()>& diagnostics) {
  Job last;
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto job = client.GetJob(id);
        if (!job.ok()) return false;
        last = *job;
        return done(last);
      },
      absl::Seconds(600)))
      << "job stuck at " << last.DebugString() << "\n"
      << diagnostics();
  return last;
}

CliJobRun RunCliJob(const std::string& name, const std::string& input,
                    const std::vector<std::string>& flags) {
  const std::string in = TempPath(name + ".in.jsonl");
  const std::string out = TempPath(name + ".out.jsonl");
  std::ofstream(in) << input;
  std::vector<std::string> argv = {Runfile("coordinator/cli/deepinfer"),
                                   "run",
                                   "--input=" + in,
                                   "--output=" + out,
                                   "--timeout-s=600",
                                   "--state-dir=" + TempPath(name + ".state")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  CliJobRun run;
  auto result = RunCommand(argv, TempPath(name + ".run"), absl::Seconds(900));
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return run;
  EXPECT_EQ(result->exit_code, 0) << result->err;
  run.err = result->err;
  for (absl::string_view line : absl::StrSplit(ReadFile(out), '\n', absl::SkipEmpty())) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << line;
    if (j.is_discarded()) continue;
    run.lines[j["custom_id"].get<std::string>()] = j;
  }
  return run;
}

}  // namespace deepinfer::testing
