// MakeStepMetadata: a Step batch's per-token metadata, checked and uploaded.
#include "worker/model/layer_context.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace deepinfer {

absl::StatusOr<std::unique_ptr<StepMetadata>> MakeStepMetadata(
    Backend* backend, const std::vector<SequenceStep>& batch, KvBlockPool* cache,
    int64_t vocab_size) {
  const KvBlockPoolOptions& co = cache->options();
  auto m = std::make_unique<StepMetadata>();
  LayerContext& ctx = m->ctx;
  ctx.cache = cache;
  std::vector<int32_t> ids, positions, slots, token_seq, context_len, out_rows;
  int32_t max_blocks = 1;
  for (const SequenceStep& s : batch) {
    max_blocks = std::max<int32_t>(max_blocks, static_cast<int32_t>(s.block_table.size()));
  }
  std::vector<int32_t> tables(batch.size() * max_blocks, 0);
  for (size_t si = 0; si < batch.size(); ++si) {
    const SequenceStep& s = batch[si];
    if (s.tokens.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("sequence ", si, " has no new tokens"));
    }
    const int64_t end = s.position_offset + static_cast<int64_t>(s.tokens.size());
    if (s.position_offset < 0 || static_cast<int64_t>(s.block_table.size()) * co.block_size < end) {
      return absl::InvalidArgumentError(
          absl::StrCat("sequence ", si, ": block table of ", s.block_table.size(),
                       " blocks cannot hold ", end, " positions (block size ", co.block_size, ")"));
    }
    for (size_t b = 0; b < s.block_table.size(); ++b) {
      if (s.block_table[b] < 0 || s.block_table[b] >= co.num_blocks) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", si, ": bad block id ", s.block_table[b]));
      }
      tables[si * max_blocks + b] = s.block_table[b];
    }
    ctx.spans.push_back({static_cast<int32_t>(ids.size()), static_cast<int32_t>(s.tokens.size()),
                         static_cast<int32_t>(end)});
    for (size_t i = 0; i < s.tokens.size(); ++i) {
      if (s.tokens[i] < 0 || s.tokens[i] >= vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("sequence ", si, ": token id ", s.tokens[i], " outside the vocabulary"));
      }
      const int64_t pos = s.position_offset + static_cast<int64_t>(i);
      if (s.all_logits || i + 1 == s.tokens.size()) out_rows.push_back(ids.size());
      ids.push_back(s.tokens[i]);
      positions.push_back(static_cast<int32_t>(pos));
      slots.push_back(s.block_table[pos / co.block_size] * co.block_size + pos % co.block_size);
      token_seq.push_back(static_cast<int32_t>(si));
      context_len.push_back(static_cast<int32_t>(pos + 1));  // causal: itself and before
    }
  }
  auto upload = [&](const std::vector<int32_t>& v) {
    auto buf = backend->AllocateScratch(std::max<size_t>(1, v.size()) * sizeof(int32_t));
    backend->CopyToDevice(v.data(), v.size() * sizeof(int32_t), buf->data());
    return buf;
  };
  m->ids = upload(ids);
  m->positions = upload(positions);
  m->slots = upload(slots);
  m->token_seq = upload(token_seq);
  m->context_len = upload(context_len);
  m->block_tables = upload(tables);
  m->logit_rows = upload(out_rows);
  m->num_logit_rows = static_cast<int64_t>(out_rows.size());
  ctx.num_tokens = static_cast<int64_t>(ids.size());
  ctx.max_blocks_per_seq = max_blocks;
  ctx.positions = m->positions->as<int32_t>();
  ctx.slots = m->slots->as<int32_t>();
  ctx.token_seq = m->token_seq->as<int32_t>();
  ctx.context_len = m->context_len->as<int32_t>();
  ctx.block_tables = m->block_tables->as<int32_t>();
  return m;
}

}  // namespace deepinfer
