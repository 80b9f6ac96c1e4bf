// GenerateGreedyOnCpu: CpuBackend + LoadDeepseekV3 + a private KvBlockPool.
#include "worker/model/cpu_generate.h"

#include <algorithm>

#include "worker/backend/cpu/cpu_backend.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/model_loader.h"

namespace deepinfer {

absl::StatusOr<std::vector<int32_t>> GenerateGreedyOnCpu(const std::string& model,
                                                         const std::vector<int32_t>& prompt,
                                                         int32_t max_new_tokens, int num_threads) {
  if (prompt.empty()) return absl::InvalidArgumentError("GenerateGreedyOnCpu: empty prompt");
  if (max_new_tokens <= 0) return std::vector<int32_t>{};
  CpuBackend backend(num_threads);
  auto m = LoadModel(model, &backend);
  if (!m.ok()) return m.status();
  CausalLm& net = **m;
  constexpr int32_t kBlockSize = 16;
  const int64_t total = static_cast<int64_t>(prompt.size()) + max_new_tokens;
  const int32_t blocks = static_cast<int32_t>((total + kBlockSize - 1) / kBlockSize);
  auto pool =
      KvBlockPool::Create(&backend, KvBlockPoolOptions{net.CacheSpec(), blocks, kBlockSize});
  if (!pool.ok()) return pool.status();
  auto table = (*pool)->Allocate(blocks);
  if (!table.ok()) return table.status();
  SequenceStep step;
  step.tokens = prompt;
  step.block_table = *table;
  std::vector<int32_t> out;
  const int64_t vocab = net.config().vocab_size;
  while (static_cast<int32_t>(out.size()) < max_new_tokens) {
    auto r = net.Step({step}, pool->get());
    if (!r.ok()) return r.status();
    const std::vector<float>& l = r->logits[0];
    const int32_t next =
        static_cast<int32_t>(std::max_element(l.begin(), l.begin() + vocab) - l.begin());
    out.push_back(next);
    step.position_offset += static_cast<int64_t>(step.tokens.size());
    step.tokens = {next};
  }
  return out;
}

}  // namespace deepinfer
