#include "tests/parity/v4_parity_runs.h"

#include <algorithm>
#include <cmath>

namespace deepinfer {

std::vector<int32_t> CoveredIds(const FixturePrompt& p) {
  std::vector<int32_t> ids = p.ids;
  if (!p.greedy.empty()) ids.insert(ids.end(), p.greedy.begin(), p.greedy.end() - 1);
  return ids;
}

absl::StatusOr<std::vector<float>> RunInSteps(CausalLm* model, KvBlockPool* pool,
                                              const std::vector<int32_t>& ids, int64_t chunk) {
  auto blocks = pool->Allocate(pool->BlocksFor(static_cast<int64_t>(ids.size())));
  if (!blocks.ok()) return blocks.status();
  std::vector<float> logits;
  const int64_t n = static_cast<int64_t>(ids.size());
  const int64_t step = chunk > 0 ? chunk : n;
  absl::Status st;
  for (int64_t at = 0; at < n && st.ok(); at += step) {
    SequenceStep s;
    s.tokens.assign(ids.begin() + at, ids.begin() + std::min(n, at + step));
    s.position_offset = at;
    s.block_table = *blocks;
    s.all_logits = true;
    auto r = model->Step({s}, pool);
    if (!r.ok()) {
      st = r.status();
    } else {
      logits.insert(logits.end(), r->logits[0].begin(), r->logits[0].end());
    }
  }
  absl::Status freed = pool->Free(*blocks);
  if (!st.ok()) return st;
  if (!freed.ok()) return freed;
  return logits;
}

std::vector<double> CoveredRowErrors(const Fixture& fx, const FixturePrompt& p,
                                     const std::vector<float>& ours) {
  const int64_t V = fx.vocab, n = static_cast<int64_t>(CoveredIds(p).size());
  const float* hf = fx.logits.data() + p.logits_row_offset * V;
  double max_hf = 0;
  for (int64_t i = 0; i < n * V; ++i) max_hf = std::max<double>(max_hf, std::fabs(hf[i]));
  std::vector<double> err(n, 0.0);
  for (int64_t r = 0; r < n && (r + 1) * V <= static_cast<int64_t>(ours.size()); ++r) {
    for (int64_t i = r * V; i < (r + 1) * V; ++i) {
      err[r] = std::max<double>(err[r], std::fabs(ours[i] - hf[i]) / max_hf);
    }
  }
  return err;
}

int32_t ArgmaxRow(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

LogitRowErrors RowErrors(const std::vector<float>& got, const std::vector<float>& want,
                         int64_t vocab) {
  LogitRowErrors e;
  e.rows = static_cast<int64_t>(std::min(got.size(), want.size())) / vocab;
  std::vector<double> rel(e.rows);
  for (int64_t t = 0; t < e.rows; ++t) {
    const float* g = got.data() + t * vocab;
    const float* c = want.data() + t * vocab;
    double err = 0, scale = 0;
    for (int64_t v = 0; v < vocab; ++v) {
      e.nonfinite += !std::isfinite(g[v]);
      err = std::max(err, std::abs(static_cast<double>(g[v]) - c[v]));
      scale = std::max(scale, std::abs(static_cast<double>(c[v])));
    }
    rel[t] = scale > 0 ? err / scale : err;
    e.argmax_match += ArgmaxRow(g, vocab) == ArgmaxRow(c, vocab);
  }
  std::sort(rel.begin(), rel.end());
  if (e.rows > 0) {
    e.median = rel[e.rows / 2];
    e.p90 = rel[e.rows * 9 / 10];
    e.max = rel.back();
  }
  return e;
}

}  // namespace deepinfer
