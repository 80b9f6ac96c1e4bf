// Test support: a DeepSeek-V4 fixture of tests/fixtures (made by HF, which saves no MTP module)
// with one generated MTP module, so that tests can draft with it: the fixture's config with
// `num_nextn_predict_layers` 1, the fixture's tensors, and the dummy source's values for the
// module's (`mtp.0.*`), plus the fixture's prompts and HF's greedy continuations.
#ifndef DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_MTP_FIXTURE_H_
#define DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_MTP_FIXTURE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/model_config.h"
#include "worker/model/weight_source.h"

namespace deepinfer {

struct V4MtpFixture {
  struct Prompt {
    std::vector<int32_t> ids;
    std::vector<int32_t> greedy;  // HF's greedy_24
  };
  // num_draft_layers 1 and the given speculative_tokens (the cache's spare rows).
  ModelConfig config;
  std::unique_ptr<WeightSource> source;
  std::vector<Prompt> prompts;
};

// `name`: a folder of tests/fixtures (dsv4_bf16, dsv4_mix), found under TEST_SRCDIR.
absl::StatusOr<V4MtpFixture> OpenV4MtpFixture(const std::string& name, int64_t speculative_tokens);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_DEEPSEEK_V4_V4_MTP_FIXTURE_H_
