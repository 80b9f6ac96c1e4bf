// DeviceSampler: the device half of a step's sampling (see device_sampler.h).
#include "worker/sampling/device_sampler.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

// Logits rows `ids` as one [ids.size(), vocab] block: the rows in place when they are
// consecutive, else a gathered copy owned by *copy.
const float* RowsBlock(Backend* backend, const float* logits, int64_t vocab,
                       const std::vector<int32_t>& ids, std::unique_ptr<DeviceBuffer>* copy) {
  bool consecutive = true;
  for (size_t i = 1; i < ids.size(); ++i) {
    consecutive = consecutive && ids[i] == ids[0] + static_cast<int32_t>(i);
  }
  if (consecutive) return logits + ids[0] * vocab;
  const int64_t n = static_cast<int64_t>(ids.size());
  auto idx = backend->AllocateScratch(n * sizeof(int32_t));
  backend->CopyToDevice(ids.data(), n * sizeof(int32_t), idx->data());
  *copy = backend->AllocateScratch(n * vocab * sizeof(float));
  backend->GatherRows(n, vocab, logits, idx->as<int32_t>(), (*copy)->as<float>());
  return (*copy)->as<float>();
}

}  // namespace

absl::StatusOr<std::vector<SampledToken>> DeviceSampler::Sample(
    Backend* backend, const float* logits, int64_t rows, int64_t vocab,
    const std::vector<RowSampleRequest>& requests) {
  if (requests.empty()) return std::vector<SampledToken>();
  if (vocab <= 0 || vocab > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("DeviceSampler: vocab must be in [1, 2^31), got ", vocab));
  }
  // Which op serves each request: greedy rows by their row, the others by their index among
  // the sampled (resp. top-logprob) requests.
  int64_t greedy_lo = rows, greedy_hi = -1;
  std::vector<int32_t> sample_rows, top_rows, adjusted_rows;
  std::vector<RowSamplingParams> sample_params, adjusted_params;
  std::vector<LogitAdjustment> adjustments;
  int32_t top_n = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const RowSampleRequest& q = requests[i];
    if (absl::Status st = Sampler::Validate(q.params, vocab); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("request ", i, ": ", st.message()));
    }
    if (!Supports(q.params)) {
      return absl::InvalidArgumentError(absl::StrCat("request ", i, ": ", q.params.num_logprobs,
                                                     " top logprobs, the device limit is ",
                                                     kMaxTopLogprobs));
    }
    if (q.row < 0 || q.row >= rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("request ", i, ": logits row ", q.row, " outside [0, ", rows, ")"));
    }
    if (!q.params.adjustments.empty()) {
      for (LogitAdjustment a : q.params.adjustments) {
        a.row = static_cast<int32_t>(adjusted_rows.size());
        adjustments.push_back(a);
      }
      adjusted_rows.push_back(static_cast<int32_t>(q.row));
      adjusted_params.push_back(ToRowSamplingParams(q.params, q.position));
    } else if (q.params.temperature <= 0.0f) {
      greedy_lo = std::min(greedy_lo, q.row);
      greedy_hi = std::max(greedy_hi, q.row);
    } else {
      sample_rows.push_back(static_cast<int32_t>(q.row));
      sample_params.push_back(ToRowSamplingParams(q.params, q.position));
    }
    if (q.params.num_logprobs > 0) {
      top_rows.push_back(static_cast<int32_t>(q.row));
      top_n = std::max(top_n, q.params.num_logprobs);
    }
  }
  const int64_t greedy_n = greedy_hi >= greedy_lo ? greedy_hi - greedy_lo + 1 : 0;
  const int64_t sample_n = static_cast<int64_t>(sample_rows.size());
  const int64_t top_rows_n = static_cast<int64_t>(top_rows.size());
  const int64_t adjusted_n = static_cast<int64_t>(adjusted_rows.size());
  // Every result in one buffer of 4-byte words, copied back once: greedy tokens and logprobs,
  // sampled tokens and logprobs, top ids and top logprobs, adjusted rows' tokens and logprobs.
  const int64_t words = 2 * greedy_n + 2 * sample_n + 2 * top_rows_n * top_n + 2 * adjusted_n;
  auto results = backend->AllocateScratch(words * sizeof(int32_t));
  int32_t* greedy_tok = results->as<int32_t>();
  float* greedy_lp = reinterpret_cast<float*>(greedy_tok + greedy_n);
  int32_t* sample_tok = greedy_tok + 2 * greedy_n;
  float* sample_lp = reinterpret_cast<float*>(sample_tok + sample_n);
  int32_t* top_ids = sample_tok + 2 * sample_n;
  float* top_lp = reinterpret_cast<float*>(top_ids + top_rows_n * top_n);
  int32_t* adjusted_tok = top_ids + 2 * top_rows_n * top_n;
  float* adjusted_lp = reinterpret_cast<float*>(adjusted_tok + adjusted_n);

  if (greedy_n > 0) {
    backend->GreedySampleRows(greedy_n, vocab, logits + greedy_lo * vocab, greedy_tok, greedy_lp);
  }
  std::unique_ptr<DeviceBuffer> sample_copy, params_dev, top_copy;
  if (sample_n > 0) {
    const float* block = RowsBlock(backend, logits, vocab, sample_rows, &sample_copy);
    params_dev = backend->AllocateScratch(sample_n * sizeof(RowSamplingParams));
    backend->CopyToDevice(sample_params.data(), sample_n * sizeof(RowSamplingParams),
                          params_dev->data());
    backend->SampleRows(sample_n, vocab, block, params_dev->as<RowSamplingParams>(), sample_tok,
                        sample_lp);
  }
  if (top_rows_n > 0) {
    const float* block = RowsBlock(backend, logits, vocab, top_rows, &top_copy);
    backend->TopLogprobsRows(top_rows_n, vocab, block, top_n, top_ids, top_lp);
  }
  // Rows with logit adjustments: a copy is adjusted and sampled (SampleRows is greedy where
  // temperature <= 0), the logprob comes from the raw rows.
  std::unique_ptr<DeviceBuffer> adjusted_copy, work, entries_dev, adjusted_params_dev;
  if (adjusted_n > 0) {
    const float* raw = RowsBlock(backend, logits, vocab, adjusted_rows, &adjusted_copy);
    const size_t block_bytes = adjusted_n * vocab * sizeof(float);
    work = backend->AllocateScratch(block_bytes);
    backend->CopyDeviceToDevice(raw, block_bytes, work->data());
    const int64_t entries = static_cast<int64_t>(adjustments.size());
    entries_dev = backend->AllocateScratch(entries * sizeof(LogitAdjustment));
    backend->CopyToDevice(adjustments.data(), entries * sizeof(LogitAdjustment),
                          entries_dev->data());
    backend->AdjustLogits(adjusted_n, vocab, work->as<float>(), entries,
                          entries_dev->as<LogitAdjustment>(), /*count=*/nullptr);
    adjusted_params_dev = backend->AllocateScratch(adjusted_n * sizeof(RowSamplingParams));
    backend->CopyToDevice(adjusted_params.data(), adjusted_n * sizeof(RowSamplingParams),
                          adjusted_params_dev->data());
    backend->SampleRows(adjusted_n, vocab, work->as<float>(),
                        adjusted_params_dev->as<RowSamplingParams>(), adjusted_tok, adjusted_lp);
    backend->TokenLogprobRows(adjusted_n, vocab, raw, adjusted_tok, adjusted_lp);
  }
  std::vector<int32_t> host(words);
  backend->CopyToHost(results->data(), words * sizeof(int32_t), host.data());
  if (absl::Status st = backend->status(); !st.ok()) return st;
  auto word_float = [&](int64_t w) {
    float f;
    std::memcpy(&f, &host[w], sizeof(f));
    return f;
  };

  std::vector<SampledToken> out(requests.size());
  int64_t sample_i = 0, top_i = 0, adjusted_i = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const RowSampleRequest& q = requests[i];
    SampledToken& t = out[i];
    if (!q.params.adjustments.empty()) {
      const int64_t base = 2 * greedy_n + 2 * sample_n + 2 * top_rows_n * top_n;
      t.token = host[base + adjusted_i];
      t.logprob = word_float(base + adjusted_n + adjusted_i);
      ++adjusted_i;
    } else if (q.params.temperature <= 0.0f) {
      const int64_t g = q.row - greedy_lo;
      t.token = host[g];
      t.logprob = word_float(greedy_n + g);
    } else {
      const int64_t base = 2 * greedy_n;
      t.token = host[base + sample_i];
      t.logprob = word_float(base + sample_n + sample_i);
      ++sample_i;
    }
    if (t.token < 0 || t.token >= vocab) {
      return absl::InternalError(
          absl::StrCat("DeviceSampler: request ", i, " got token ", t.token, " from the device"));
    }
    if (q.params.num_logprobs > 0) {
      const int64_t base = 2 * greedy_n + 2 * sample_n + top_i * top_n;
      const int32_t n = static_cast<int32_t>(std::min<int64_t>(q.params.num_logprobs, vocab));
      for (int32_t j = 0; j < n; ++j) {
        t.top_logprobs.emplace_back(host[base + j], word_float(base + top_rows_n * top_n + j));
      }
      ++top_i;
    }
  }
  return out;
}

}  // namespace deepinfer
