// SampleOrCopyLogits: structured-output masks applied, each sequence's token sampled on the
// device or on the host, and the logit rows the host needs copied back.
#include "worker/model/layers/step_sampling.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/sampling/device_sampler.h"

namespace deepinfer {
namespace {

// Structured output: the engine's masks, written on the host while the forward pass runs (the
// model's ops are enqueued before this), uploaded once and applied to the sampled rows in place.
void MaskLogits(Backend* backend, int64_t vocab_size, const std::vector<SequenceStep>& batch,
                float* logits) {
  const int64_t V = vocab_size;
  const int64_t words = (V + 31) / 32;
  std::vector<int32_t> rows;
  std::vector<uint32_t> masks;
  int64_t row = 0;
  for (const SequenceStep& s : batch) {
    const int64_t n = s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
    if (s.fill_allowed_tokens && s.sampling.has_value()) {
      masks.resize(masks.size() + words);
      if (s.fill_allowed_tokens(masks.data() + masks.size() - words)) {
        rows.push_back(static_cast<int32_t>(row + n - 1));
      } else {
        masks.resize(masks.size() - words);
      }
    }
    row += n;
  }
  if (rows.empty()) return;
  const int64_t k = static_cast<int64_t>(rows.size());
  auto rows_dev = backend->AllocateScratch(k * sizeof(int32_t));
  auto masks_dev = backend->AllocateScratch(k * words * sizeof(uint32_t));
  backend->CopyToDevice(rows.data(), k * sizeof(int32_t), rows_dev->data());
  backend->CopyToDevice(masks.data(), k * words * sizeof(uint32_t), masks_dev->data());
  backend->MaskLogitsRows(k, V, logits, rows_dev->as<int32_t>(), masks_dev->as<uint32_t>());
  // Failures show in the backend's status, checked after the copies below.
}

}  // namespace

absl::StatusOr<StepOutput> SampleOrCopyLogits(Backend* backend, int64_t vocab_size,
                                              const std::vector<SequenceStep>& batch, float* logits,
                                              int64_t rows) {
  const int64_t V = vocab_size;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceStep& s = batch[i];
    if (s.row_sampling.empty()) continue;
    if (!s.all_logits || s.row_sampling.size() != s.tokens.size() || s.sampling.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step: sequence ", i, " has row_sampling for ", s.row_sampling.size(), " rows but ",
          s.tokens.size(), " tokens (it needs all_logits, one entry per token and no `sampling`)"));
    }
  }
  // Masks first: the logit adjustments and the sampling below see disallowed tokens at -inf.
  MaskLogits(backend, vocab_size, batch, logits);
  // Sequences that want no logits are sampled on the device (DeviceSampler), and so are the
  // rows of a verified sequence's (row_sampling); the rows of those that want logits, or more
  // top logprobs than the device gives, are copied to the host.
  auto on_device = [](const SequenceStep& s) {
    return !s.return_logits && s.sampling.has_value() && DeviceSampler::Supports(*s.sampling);
  };
  auto rows_on_device = [](const SequenceStep& s) {
    return !s.row_sampling.empty() &&
           std::all_of(s.row_sampling.begin(), s.row_sampling.end(),
                       [](const SamplingParams& p) { return DeviceSampler::Supports(p); });
  };
  auto needs_host = [&](const SequenceStep& s) {
    return s.return_logits || (s.sampling.has_value() && !on_device(s)) ||
           (!s.row_sampling.empty() && !rows_on_device(s));
  };
  std::vector<RowSampleRequest> requests;
  std::vector<std::pair<int64_t, int64_t>> runs;  // (first logits row, rows) to copy
  int64_t wanted = 0;
  {
    int64_t row = 0;
    for (const SequenceStep& s : batch) {
      const int64_t n = s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
      if (on_device(s)) {
        RowSampleRequest q;
        q.row = row + n - 1;
        q.params = *s.sampling;
        q.position = s.position_offset + static_cast<int64_t>(s.tokens.size());
        requests.push_back(q);
      } else if (rows_on_device(s)) {
        for (int64_t j = 0; j < n; ++j) {
          RowSampleRequest q;
          q.row = row + j;
          q.params = s.row_sampling[j];
          q.position = s.position_offset + j + 1;
          requests.push_back(std::move(q));
        }
      }
      if (needs_host(s)) {
        // One copy per run of consecutive sequences that need their rows.
        if (!runs.empty() && runs.back().first + runs.back().second == row) {
          runs.back().second += n;
        } else {
          runs.emplace_back(row, n);
        }
        wanted += n;
      }
      row += n;
    }
  }
  auto sampled = DeviceSampler::Sample(backend, logits, rows, V, requests);
  if (!sampled.ok()) return sampled.status();
  std::vector<float> host(wanted * V);  // the copied rows, in batch order
  int64_t at = 0;
  for (const auto& [first, n] : runs) {
    backend->CopyToHost(logits + first * V, n * V * sizeof(float), host.data() + at * V);
    at += n;
  }
  // A GPU backend reports failed ops asynchronously; the copies above have waited for all of them.
  if (absl::Status st = backend->status(); !st.ok()) return st;
  StepOutput out;
  out.row_sampled.resize(batch.size());
  int64_t host_row = 0;
  size_t device_i = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const SequenceStep& s = batch[i];
    const int64_t n = s.all_logits ? static_cast<int64_t>(s.tokens.size()) : 1;
    SampledToken sampled_token;
    const float* host_rows = nullptr;
    if (needs_host(s)) {
      host_rows = host.data() + host_row * V;
      host_row += n;
    }
    if (s.return_logits) {
      out.logits.emplace_back(host_rows, host_rows + n * V);
    } else {
      out.logits.emplace_back();  // sampled on the device, or an intermediate prefill chunk
    }
    if (on_device(s)) {
      sampled_token = std::move((*sampled)[device_i++]);
    } else if (s.sampling.has_value()) {
      auto tok = Sampler::Sample(host_rows + (n - 1) * V, static_cast<int32_t>(V), *s.sampling,
                                 s.position_offset + static_cast<int64_t>(s.tokens.size()));
      if (!tok.ok()) return tok.status();
      sampled_token = std::move(*tok);
    }
    if (rows_on_device(s)) {
      for (int64_t j = 0; j < n; ++j)
        out.row_sampled[i].push_back(std::move((*sampled)[device_i++]));
    } else if (!s.row_sampling.empty()) {
      for (int64_t j = 0; j < n; ++j) {
        auto tok = Sampler::Sample(host_rows + j * V, static_cast<int32_t>(V), s.row_sampling[j],
                                   s.position_offset + j + 1);
        if (!tok.ok()) return tok.status();
        out.row_sampled[i].push_back(std::move(*tok));
      }
    }
    out.sampled.push_back(std::move(sampled_token));
  }
  return out;
}

absl::Status GreedyPicks(Backend* backend, int64_t vocab_size, const float* logits, int64_t rows,
                         std::vector<int32_t>* token, std::vector<float>* probability) {
  token->assign(rows, -1);
  probability->assign(rows, 0.0f);
  if (rows == 0) return backend->status();
  auto token_dev = backend->AllocateScratch(rows * sizeof(int32_t));
  auto logprob_dev = backend->AllocateScratch(rows * sizeof(float));
  backend->GreedySampleRows(rows, vocab_size, logits, token_dev->as<int32_t>(),
                            logprob_dev->as<float>());
  std::vector<float> logprob(rows);
  backend->CopyToHost(token_dev->data(), rows * sizeof(int32_t), token->data());
  backend->CopyToHost(logprob_dev->data(), rows * sizeof(float), logprob.data());
  if (absl::Status st = backend->status(); !st.ok()) return st;
  for (int64_t r = 0; r < rows; ++r) {
    (*probability)[r] = static_cast<float>(std::exp(static_cast<double>(logprob[r])));
  }
  return absl::OkStatus();
}

}  // namespace deepinfer
