// Single-thread encode throughput of Tokenizer on a JSONL corpus ({"text": ...} lines).
//
//   bazel run -c opt //tokenizer:tokenizer_bench -- MODEL_DIR CORPUS.jsonl [SECONDS]
//
// Prints bytes, tokens, MB/s and tokens/s; tests/tokenizer/bench_hf.js prints the same for HF.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"
#include "tokenizer/tokenizer.h"

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: tokenizer_bench MODEL_DIR CORPUS.jsonl [SECONDS]\n");
    return 2;
  }
  const double min_seconds = argc > 3 ? std::atof(argv[3]) : 3.0;
  auto tokenizer = deepinfer::tokenizer::Tokenizer::FromDirectory(argv[1]);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> texts;
  std::ifstream corpus(argv[2]);
  std::string line;
  size_t bytes_per_pass = 0;
  while (std::getline(corpus, line)) {
    const nlohmann::json row = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (row.is_discarded() || !row.is_object()) continue;
    auto text = row.find("text");
    if (text == row.end() || !text->is_string()) continue;
    texts.push_back(text->get<std::string>());
    bytes_per_pass += texts.back().size();
  }
  if (texts.empty()) {
    std::fprintf(stderr, "no {\"text\": ...} lines in %s\n", argv[2]);
    return 1;
  }
  // One warm-up pass (fills the word cache, as a long-running worker would have).
  for (const std::string& text : texts) (*tokenizer)->Encode(text, false);
  size_t passes = 0, tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  double seconds = 0;
  do {
    for (const std::string& text : texts) tokens += (*tokenizer)->Encode(text, false).size();
    ++passes;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (seconds < min_seconds);
  const double bytes = static_cast<double>(bytes_per_pass) * passes;
  std::printf("deepinfer: %zu texts, %zu passes, %.1f MB/s, %.0f tokens/s\n", texts.size(), passes,
              bytes / seconds / 1e6, tokens / seconds);
  return 0;
}
