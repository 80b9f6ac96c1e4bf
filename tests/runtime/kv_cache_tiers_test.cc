// The prefix cache's lower tiers through `deepinfer run` (real coordinator and worker processes,
// CPU backend, the HF-made fixture tests/fixtures/dsv3_qlora_rope; docs/kv-cache.md):
//   * disk: a second run on the same --kv-cache-dir (a new worker process) serves every
//     request's full prompt blocks from the files the first run's worker left, with the same
//     tokens and logprobs as without any cache; a byte flipped in every file makes every
//     block a miss (same outputs); another cache layout's run finds nothing; a directory that
//     cannot be created turns the tier off with one log line and the job runs as without it;
//   * host: in a KV pool too small to keep a prompt until it comes again, the blocks evicted
//     to host memory come back.
// Every request has its own prompt, so hits come only from the tiers (or the same prompt run
// before, for the host test). The workers run the absorbed MLA prefill form, whose results do
// not depend on how many tokens a step computes (docs/kv-cache.md, "Identity").
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/testing/batch_jobs.h"
#include "tests/testing/subprocess.h"

namespace deepinfer {
namespace {

namespace fs = std::filesystem;
using ::deepinfer::testing::ReadFile;
using ::deepinfer::testing::RunCliJob;
using ::deepinfer::testing::TempPath;
using json = nlohmann::json;

const char kModel[] = "tests/fixtures/dsv3_qlora_rope";

// `n` requests with distinct prompts of 150..210 random ids (2..999), each line `copies` times
// in a row of n ("p<i>" then "p<i>.1", ...); greedy and seeded sampled requests with 2 top
// logprobs.
std::string DistinctPromptsJob(int n, int copies, std::map<std::string, int>* lengths) {
  std::mt19937 rng(5);
  std::vector<std::vector<int>> prompts(n);
  for (int i = 0; i < n; ++i) {
    const int len = 150 + static_cast<int>(rng() % 61);
    for (int k = 0; k < len; ++k) prompts[i].push_back(2 + static_cast<int>(rng() % 998));
  }
  std::vector<std::string> lines;
  for (int c = 0; c < copies; ++c) {
    for (int i = 0; i < n; ++i) {
      const std::string id = c == 0 ? absl::StrCat("p", i) : absl::StrCat("p", i, ".", c);
      (*lengths)[id] = static_cast<int>(prompts[i].size());
      json body = {{"prompt", prompts[i]},
                   {"max_tokens", 6},
                   {"logprobs", 2},
                   {"ignore_eos", true},
                   {"return_token_ids", true}};
      if (i % 3 == 2) {
        body["temperature"] = 0.8;
        body["seed"] = 300 + i;
      } else {
        body["temperature"] = 0;
      }
      lines.push_back(
          json({{"custom_id", id}, {"method", "POST"}, {"url", "/v1/completions"}, {"body", body}})
              .dump());
    }
  }
  return absl::StrJoin(lines, "\n") + "\n";
}

struct JobRun {
  std::map<std::string, json> lines;  // by custom_id
  std::string state_dir;
};

// `deepinfer run` with the absorbed prefill form, `extra` flags and `worker_args`.
JobRun RunJob(const std::string& name, const std::string& input,
              const std::vector<std::string>& extra, const std::string& worker_args = "") {
  std::vector<std::string> flags = {absl::StrCat("--model=", kModel), "--keep-state",
                                    "--worker-args=--prefill-attention=absorbed " + worker_args};
  flags.insert(flags.end(), extra.begin(), extra.end());
  JobRun run;
  run.state_dir = TempPath(name + ".state");  // RunCliJob's
  run.lines = RunCliJob(name, input, flags).lines;
  return run;
}

const json& Body(const json& line) { return line["response"]["body"]; }
int CachedTokens(const json& line) {
  return Body(line)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
}
// Prompt tokens a full hit serves: the full blocks before the last token.
int FullHit(int prompt_len) { return (prompt_len - 1) / 16 * 16; }

// Same tokens and logprobs as `want` in every line.
void ExpectSameOutputs(const JobRun& got, const JobRun& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.lines.size(), want.lines.size());
  for (const auto& [id, line] : want.lines) {
    SCOPED_TRACE(id);
    ASSERT_EQ(got.lines.count(id), 1u);
    const json& g = got.lines.at(id);
    ASSERT_TRUE(g["error"].is_null()) << g.dump();
    ASSERT_TRUE(line["error"].is_null()) << line.dump();
    const json& a = Body(g)["choices"][0];
    const json& b = Body(line)["choices"][0];
    EXPECT_EQ(a["token_ids"], b["token_ids"]);
    EXPECT_EQ(a["logprobs"]["token_logprobs"], b["logprobs"]["token_logprobs"]);
    EXPECT_EQ(a["logprobs"]["top_logprobs"], b["logprobs"]["top_logprobs"]);
  }
}

// Occurrences of `needle` in the files under a run's state directory (the workers' logs).
int CountInLogs(const JobRun& run, const std::string& needle) {
  int n = 0;
  for (const auto& e : fs::recursive_directory_iterator(run.state_dir)) {
    if (!e.is_regular_file()) continue;
    const std::string text = ReadFile(e.path().string());
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
      ++n;
    }
  }
  return n;
}

int BlockFiles(const std::string& dir) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path().extension() == ".kvb";
  return n;
}

TEST(KvCacheTiersRunTest, DiskTierAcrossWorkerRestarts) {
  std::map<std::string, int> lengths;
  const std::string job = DistinctPromptsJob(8, 1, &lengths);
  const std::string dir = TempPath("kv_dir");
  fs::remove_all(dir);
  const JobRun reference = RunJob("reference", job, {"--no-prefix-caching"});
  ASSERT_EQ(reference.lines.size(), 8u);

  // Cold: nothing to find; the worker leaves its cached blocks in the directory when it stops.
  const JobRun cold = RunJob("cold", job, {"--kv-cache-dir=" + dir});
  ExpectSameOutputs(cold, reference, "cold");
  for (const auto& [id, line] : cold.lines) EXPECT_EQ(CachedTokens(line), 0) << id;
  const int files = BlockFiles(dir);
  EXPECT_GT(files, 0);

  // Warm: a new worker finds every request's full prompt blocks on disk.
  const JobRun warm = RunJob("warm", job, {"--kv-cache-dir=" + dir});
  ExpectSameOutputs(warm, reference, "warm");
  int64_t prompt = 0, cached = 0;
  for (const auto& [id, line] : warm.lines) {
    EXPECT_EQ(CachedTokens(line), FullHit(lengths[id])) << id;
    prompt += lengths[id];
    cached += CachedTokens(line);
  }
  EXPECT_GE(static_cast<double>(cached), 0.9 * static_cast<double>(prompt));

  // One byte flipped in every block file: every file fails its check and is a miss.
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().extension() != ".kvb") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-3, std::ios::end);
    char c = 0;
    f.read(&c, 1);
    c ^= 0x10;
    f.seekp(-3, std::ios::end);
    f.write(&c, 1);
  }
  const JobRun corrupt = RunJob("corrupt", job, {"--kv-cache-dir=" + dir});
  ExpectSameOutputs(corrupt, reference, "corrupt");
  for (const auto& [id, line] : corrupt.lines) EXPECT_EQ(CachedTokens(line), 0) << id;
  EXPECT_GT(CountInLogs(corrupt, "fails its checksum"), 0);

  // Another cache layout (bfloat16 entries: another cache key) finds nothing of this one.
  const JobRun other =
      RunJob("other_layout", job, {"--kv-cache-dir=" + dir}, "--kv-cache-dtype=bfloat16");
  ASSERT_EQ(other.lines.size(), 8u);
  for (const auto& [id, line] : other.lines) EXPECT_EQ(CachedTokens(line), 0) << id;
}

// The FP8 latent cache (--kv-cache-dtype fp8): its blocks (their own bytes per token) go to
// disk and come back to a new worker with the outputs of a run without prefix caching; a bf16
// cache (another key) finds none of them.
TEST(KvCacheTiersRunTest, Fp8CacheBlocksComeBackFromDisk) {
  std::map<std::string, int> lengths;
  const std::string job = DistinctPromptsJob(4, 1, &lengths);
  const std::string dir = TempPath("kv_dir_fp8");
  fs::remove_all(dir);
  const std::string fp8 = "--kv-cache-dtype=fp8";
  const JobRun reference = RunJob("fp8_reference", job, {"--no-prefix-caching"}, fp8);
  ASSERT_EQ(reference.lines.size(), 4u);
  const JobRun cold = RunJob("fp8_cold", job, {"--kv-cache-dir=" + dir}, fp8);
  ExpectSameOutputs(cold, reference, "fp8 cold");
  EXPECT_GT(BlockFiles(dir), 0);
  const JobRun warm = RunJob("fp8_warm", job, {"--kv-cache-dir=" + dir}, fp8);
  ExpectSameOutputs(warm, reference, "fp8 warm");
  for (const auto& [id, line] : warm.lines)
    EXPECT_EQ(CachedTokens(line), FullHit(lengths[id])) << id;
  const JobRun bf16 =
      RunJob("fp8_then_bf16", job, {"--kv-cache-dir=" + dir}, "--kv-cache-dtype=bfloat16");
  ASSERT_EQ(bf16.lines.size(), 4u);
  for (const auto& [id, line] : bf16.lines) EXPECT_EQ(CachedTokens(line), 0) << id;
}

TEST(KvCacheTiersRunTest, UnusableDirectoryTurnsTheTierOffAndTheJobRuns) {
  std::map<std::string, int> lengths;
  const std::string job = DistinctPromptsJob(4, 1, &lengths);
  const std::string file = TempPath("not_a_dir");
  std::ofstream(file) << "x";
  const JobRun reference = RunJob("unusable_reference", job, {"--no-prefix-caching"});
  const JobRun run = RunJob("unusable", job, {"--kv-cache-dir=" + file + "/kv"});
  ExpectSameOutputs(run, reference, "unusable dir");
  EXPECT_EQ(CountInLogs(run, "KV cache disk tier off"), 1);
}

TEST(KvCacheTiersRunTest, HostTierServesBlocksEvictedFromASmallPool) {
  // 6 prompts of 150..210 tokens, then the same 6 again, one request at a time in a pool of 256
  // tokens: each prompt evicts the one before it from the pool.
  std::map<std::string, int> lengths;
  const std::string job = DistinctPromptsJob(6, 2, &lengths);
  const std::string small = "--kv-cache-tokens=256 --max-running=1";
  const JobRun reference = RunJob("host_reference", job, {"--no-prefix-caching"}, small);
  const JobRun without = RunJob("host_none", job, {"--kv-host-cache-gb=0"}, small);
  const JobRun with = RunJob("host", job, {"--kv-host-cache-gb=1"}, small);
  ExpectSameOutputs(without, reference, "no host tier");
  ExpectSameOutputs(with, reference, "host tier");
  for (const auto& [id, len] : lengths) {
    const bool second = id.find('.') != std::string::npos;
    EXPECT_EQ(CachedTokens(without.lines.at(id)), 0) << id;
    EXPECT_EQ(CachedTokens(with.lines.at(id)), second ? FullHit(len) : 0) << id;
  }
}

}  // namespace
}  // namespace deepinfer
