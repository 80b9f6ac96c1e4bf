// Times SinkAttentionF32 on V4-Flash's decode shape (64 heads x 512, fp32 rows) at 1, 64 and 128
// requests of context 1024, each request over rows of its own (no two requests share a row, as
// in a batch of separate sequences), read where the model's cache keeps them: 127 window rows in
// the request's ring slot and its own key among the step's, the entries in a paged stream of
// blocks of 16 positions (scattered blocks: a block table per request):
//   csa      window 128 + the indexer's 256 entries (all of a 1024 context's at ratio 4; 4
//            entries a block);
//   csa_max  window 128 + 512 selected entries (the top-k's limit, contexts from 2048);
//   hca      window 128 + the 8 entries of a 1024 context at ratio 128 (each spread over 8
//            blocks of 64 floats);
//   window   window 128 only (the sliding-window layers).
// 4096 requests time a prefill-sized call; the `prefill` rows (4096 tokens) time the shape of a
// prefill of one sequence: token t at position t over its window of this step's keys
// (min(t + 1, 128) rows, shared with its neighbours' windows) and the entries above from one
// block table (every token the same ones). Per case and kernel (tensor-core exact, tensor-core
// bf16, CUDA cores; the automatic split count), then the bf16 call of a bf16 model's prefill
// (a bf16 query, a bf16 output with its rope slice rotated back, one split):
//   tensor_core_bf16_io           kTensorCoreBf16;
//   tensor_core_bf16_io_a4        the same with an output only 4-byte aligned (the kernel's
//                                 4-byte store path instead of 16-byte stores);
//   tensor_core_bf16_prefill_io   kTensorCoreBf16Prefill reading every row in fp32;
//   tensor_core_bf16_prefill_io_kv  with a bf16 copy of this step's keys (the decode-shaped rows
//                                 read no window row from it, the prefill rows every one);
//   tensor_core_bf16_prefill_io_kv_entries  with it and the compact copy of the entries' blocks
//                                 read without its tables (seq_stride: the backend's prefill
//                                 call), after a line timing that copy
//                                 (SinkAttentionEntriesToBf16);
//   tensor_core_bf16_prefill_io_per_token  the _kv_entries call with a block per token
//                                 (prefill_blocks = tokens) instead of one per SM taking tokens
//                                 in turn;
// (their bytes counted as the fp32 variants'): the mean per call of 10 calls captured in one
// CUDA graph and replayed 5 times (as the decode step runs it), the eager median of 20, and the
// bytes each call must read and write (the rows, Q, the output; the prefill's shared rows once)
// per second in the graph, against the H200's 4.8 TB/s, and the products' TFLOP/s (4 FLOP per
// row, head and dim: scores and values). `splits`: also every forced split count
// of 1, 2, 4, 8 and 16; `prefill`: the prefill rows alone.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/testing/bench_timer.h"
#include "kernels/testing/bench_util.h"
#include "kernels/v4/sink_attention.h"

namespace deepinfer {
namespace {

using bench::GraphMeanMs;
using bench::MedianMs;
using bench::Uniform;
using bench::Upload;
using kernels::SinkAttentionKernel;

constexpr int64_t kHeads = 64, kDim = 512, kWindow = 128, kRopeDim = 64;
constexpr double kPeakGBs = 4800.0;  // H200 HBM3e

const char* KernelName(SinkAttentionKernel k) {
  switch (k) {
    case SinkAttentionKernel::kCudaCore:
      return "cuda_core";
    case SinkAttentionKernel::kTensorCoreExact:
      return "tensor_core_exact";
    case SinkAttentionKernel::kTensorCoreBf16:
      return "tensor_core_bf16";
    case SinkAttentionKernel::kTensorCoreBf16Prefill:
      return "tensor_core_bf16_prefill";
    case SinkAttentionKernel::kAuto:
      break;
  }
  return "auto";
}

struct Layer {
  const char* name;
  int64_t entries;       // compressed entries of each request
  int64_t chosen;        // of which each query attends to this many
  bool selected;         // through a selection list (CSA) or a range (HCA)
  int64_t block_floats;  // floats of the stream per block of 16 positions (0: no entries)
};

void Run(int64_t batch, const Layer& layer, bool prefill, bool sweep_splits, cudaStream_t stream) {
  // Request b at position kContext - 1: its window is 127 ring rows and its own key. With
  // `prefill` token b of one sequence at position b.
  constexpr int64_t kContext = 1024;
  std::vector<int32_t> positions(batch, kContext - 1), window_len(batch, kWindow),
      step_start(batch, kContext - 1), slot(batch), token_seq(batch),
      extra_len(batch, static_cast<int32_t>(layer.chosen));
  if (prefill) {
    for (int64_t b = 0; b < batch; ++b) {
      positions[b] = static_cast<int32_t>(b);
      window_len[b] = static_cast<int32_t>(std::min<int64_t>(b + 1, kWindow));
      step_start[b] = 0;
    }
  }
  const int64_t requests = prefill ? 1 : batch;  // block-table rows
  std::vector<int32_t> selected, tables;
  // The requests' stream blocks, shuffled over the pool.
  const int64_t per_request =
      layer.block_floats > 0 ? (layer.entries * kDim + layer.block_floats - 1) / layer.block_floats
                             : 0;
  std::vector<int32_t> blocks(std::max<int64_t>(1, requests * per_request));
  std::iota(blocks.begin(), blocks.end(), 0);
  for (size_t i = blocks.size(); i > 1; --i) std::swap(blocks[i - 1], blocks[(i * 7919) % i]);
  for (int64_t b = 0; b < batch; ++b) {
    slot[b] = static_cast<int32_t>(b);
    token_seq[b] = static_cast<int32_t>(b % requests);
    if (b < requests) {
      for (int64_t i = 0; i < per_request; ++i) tables.push_back(blocks[b * per_request + i]);
    }
    if (layer.selected) {
      // Spread evenly over the entries (all of them when chosen == entries), ascending.
      for (int64_t i = 0; i < layer.chosen; ++i) {
        selected.push_back(static_cast<int32_t>(i * layer.entries / layer.chosen));
      }
    }
  }
  // Every device buffer of the run, freed at its end.
  std::vector<void*> owned;
  auto own = [&owned](auto* ptr) {
    owned.push_back(const_cast<void*>(static_cast<const void*>(ptr)));
    return ptr;
  };
  auto bf16_bits = [](const std::vector<float>& v) {
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) {
      uint32_t u;
      std::memcpy(&u, &v[i], sizeof(u));
      bits[i] = static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
    }
    return bits;
  };
  // The row buffers and the bf16 copy of this step's keys (kTensorCoreBf16Prefill's kv_bf16);
  // the prefill reads no ring row.
  const std::vector<float> kv = Uniform(batch * kDim, 2);
  const std::vector<float> ring =
      prefill ? std::vector<float>() : Uniform(batch * kWindow * kDim, 4);
  const std::vector<float> stream_rows =
      layer.block_floats > 0 ? Uniform(static_cast<int64_t>(blocks.size()) * layer.block_floats, 5)
                             : std::vector<float>();
  const uint16_t* kv_bf16 = own(Upload(bf16_bits(kv)));
  kernels::SinkAttentionParams p;
  p.tokens = batch;
  p.heads = kHeads;
  p.dim = kDim;
  p.q = own(Upload(Uniform(batch * kHeads * kDim, 1)));
  p.kv = own(Upload(kv));
  p.positions = own(Upload(positions));
  p.window_len = own(Upload(window_len));
  p.step_start = own(Upload(step_start));
  if (!prefill) {
    p.ring = own(Upload(ring));
    p.ring_rows = kWindow;
    p.ring_stride = kWindow * kDim;
    p.ring_slot = own(Upload(slot));
  }
  if (layer.block_floats > 0) {
    p.entries.data = own(Upload(stream_rows));
    p.entries.block_floats = layer.block_floats;
    p.entries.block_tables = own(Upload(tables));
    p.entries.table_stride = per_request;
    p.entries.token_seq = own(Upload(token_seq));
    if (layer.selected) {
      p.selected = own(Upload(selected));
      p.selected_stride = layer.chosen;
    } else {
      p.extra_len = own(Upload(extra_len));
    }
  }
  // The bf16 forms (the prefill path): the query rounded, a bf16 output with its rope slice
  // rotated back at the negated positions.
  std::vector<int32_t> neg_positions(positions);
  for (int32_t& x : neg_positions) x = -x;
  std::vector<float> inv_freq(kRopeDim / 2);
  for (int64_t j = 0; j < kRopeDim / 2; ++j) {
    inv_freq[j] = static_cast<float>(std::pow(160000.0, -2.0 * j / kRopeDim));
  }
  const uint16_t* q_bf16 = own(Upload(bf16_bits(Uniform(batch * kHeads * kDim, 1))));
  // 8 elements more: the 4-byte aligned variant's output starts 2 elements in.
  uint16_t* out_bf16 =
      own(bench::DeviceAlloc<uint16_t>((batch * kHeads * kDim + 8) * sizeof(uint16_t)));
  const int32_t* out_rope_positions = own(Upload(neg_positions));
  const float* out_rope_inv_freq = own(Upload(inv_freq));
  p.sinks = own(Upload(Uniform(kHeads, 3)));
  p.scale = 1.0f / std::sqrt(static_cast<float>(kDim));
  p.out = own(bench::DeviceAlloc<float>(batch * kHeads * kDim * sizeof(float)));
  // Workspace for the most splits any run below uses (16: the automatic count's limit too).
  constexpr int64_t kMostSplits = 16;
  p.workspace_bytes =
      static_cast<size_t>(batch) * kHeads * kMostSplits * (kDim + 2) * sizeof(float);
  p.workspace = own(bench::DeviceAlloc<char>(p.workspace_bytes));

  // Rows per token (the prefill's first tokens have shorter windows); the bytes read: every
  // token's own rows, or the prefill's shared ones once (this step's keys and the entries).
  const int64_t attended = kWindow + layer.chosen;
  const double row_bytes = prefill
                               ? static_cast<double>(batch + layer.chosen) * kDim * sizeof(float)
                               : static_cast<double>(batch) * attended * kDim * sizeof(float);
  const double bytes = row_bytes + static_cast<double>(batch) *
                                       (2.0 * kHeads * kDim * sizeof(float) +
                                        (layer.selected ? layer.chosen * sizeof(int32_t) : 0));
  // The products: scores and values, 2 FLOP per multiply-add, over every token's rows.
  double flops = 0.0;
  for (int64_t t = 0; t < batch; ++t) {
    flops += 4.0 * static_cast<double>(window_len[t] + layer.chosen) * kHeads * kDim;
  }
  char name[64];
  std::snprintf(name, sizeof(name), "%s%s b%lld rows%lld", layer.name, prefill ? "_prefill" : "",
                static_cast<long long>(batch), static_cast<long long>(attended));
  // The compact copy of the entries (every block-table row's blocks).
  const int64_t table_rows = requests;
  uint16_t* compact = nullptr;
  int32_t* compact_tables = nullptr;
  if (layer.block_floats > 0) {
    compact = own(bench::DeviceAlloc<uint16_t>(
        kernels::SinkAttentionEntriesBf16Values(p.entries, table_rows) * sizeof(uint16_t)));
    compact_tables =
        own(bench::DeviceAlloc<int32_t>(table_rows * p.entries.table_stride * sizeof(int32_t)));
    const double ms = GraphMeanMs(
        [&](cudaStream_t s) {
          return kernels::SinkAttentionEntriesToBf16(p.entries, table_rows, compact, compact_tables,
                                                     s);
        },
        stream);
    std::printf("%-26s %-36s graph %8.2f us\n", name, "entries_to_bf16", ms * 1e3);
  }
  // The kernels, then the bf16 kernel with the bf16 query and output (one split; 16-byte, then
  // 4-byte aligned output), then kTensorCoreBf16Prefill (no copies, kv's, kv's and the compact
  // entries with their seq_stride, the same a block per token).
  for (int variant = 0; variant < 9; ++variant) {
    const bool bf16_io = variant >= 3, aligned4 = variant == 4;
    const bool prefill_kernel = variant >= 5;
    const SinkAttentionKernel k =
        prefill_kernel ? SinkAttentionKernel::kTensorCoreBf16Prefill
        : bf16_io      ? SinkAttentionKernel::kTensorCoreBf16
                       : std::array<SinkAttentionKernel, 3>{SinkAttentionKernel::kTensorCoreExact,
                                                            SinkAttentionKernel::kTensorCoreBf16,
                                                            SinkAttentionKernel::kCudaCore}[variant];
    const char* kname = variant == 5   ? "tensor_core_bf16_prefill_io"
                        : variant == 6 ? "tensor_core_bf16_prefill_io_kv"
                        : variant == 7 ? "tensor_core_bf16_prefill_io_kv_entries"
                        : variant == 8 ? "tensor_core_bf16_prefill_io_per_token"
                        : aligned4     ? "tensor_core_bf16_io_a4"
                        : bf16_io      ? "tensor_core_bf16_io"
                                       : KernelName(k);
    kernels::SinkAttentionParams kp = p;
    kp.kernel = k;
    if (variant >= 6) kp.kv_bf16 = kv_bf16;
    if (variant >= 7) {
      if (compact != nullptr) {
        kp.entries_bf16 = {compact, compact_tables, p.entries.table_stride,
                           p.entries.table_stride * p.entries.block_floats};
      } else if (variant != 8) {
        continue;  // no entries: the same call as without them
      }
    }
    if (variant == 8) kp.prefill_blocks = static_cast<int32_t>(batch);
    if (bf16_io) {
      kp.q = nullptr;
      kp.q_bf16 = q_bf16;
      kp.out = nullptr;
      kp.out_bf16 = out_bf16 + (aligned4 ? 2 : 0);
      kp.out_rope_dim = kRopeDim;
      kp.out_rope_positions = out_rope_positions;
      kp.out_rope_inv_freq = out_rope_inv_freq;
      kp.out_rope_factor = 1.0f;
    }
    if (!kernels::SinkAttentionKernelRuns(kp, k)) {
      std::printf("%-26s %-36s does not run on this device\n", name, kname);
      continue;
    }
    std::vector<int32_t> split_counts = {0};
    if (sweep_splits && !bf16_io) split_counts.insert(split_counts.end(), {1, 2, 4, 8, 16});
    for (int32_t splits : split_counts) {
      kp.num_splits = splits;
      int32_t used = 0;
      BENCH_CUDA(kernels::SinkAttentionSplits(kp, &used));
      const double graph_ms =
          GraphMeanMs([&](cudaStream_t s) { return kernels::SinkAttentionF32(kp, s); }, stream);
      const double eager_ms = MedianMs([&] { return kernels::SinkAttentionF32(kp, nullptr); });
      const double gbs = bytes / (graph_ms * 1e-3) / 1e9;
      std::printf(
          "%-26s %-36s splits %2d%s graph %8.2f us  eager %8.2f us  %7.1f GB/s  %5.1f%% of "
          "%.1f TB/s  %6.1f TFLOP/s\n",
          name, kname, used, splits == 0 ? " (auto)" : "       ", graph_ms * 1e3, eager_ms * 1e3,
          gbs, 100.0 * gbs / kPeakGBs, kPeakGBs / 1000.0, flops / (graph_ms * 1e-3) / 1e12);
    }
  }
  BENCH_CUDA(cudaDeviceSynchronize());
  for (void* ptr : owned) BENCH_CUDA(cudaFree(ptr));
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) {
  // `splits`: the split sweep too; `prefill`: only the prefill rows.
  const bool sweep = argc > 1 && std::strcmp(argv[1], "splits") == 0;
  const bool prefill_only = argc > 1 && std::strcmp(argv[1], "prefill") == 0;
  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Blocks of 16 positions: CSA (ratio 4) 4 entries = 2048 floats a block, HCA (ratio 128)
  // 64 floats a block.
  const deepinfer::Layer layers[] = {
      {"csa", 256, 256, true, 2048},
      {"csa_max", 1024, 512, true, 2048},
      {"hca", 8, 8, false, 64},
      {"window", 0, 0, false, 0},
  };
  for (const deepinfer::Layer& layer : layers) {
    if (prefill_only) break;
    for (int64_t batch : {1, 64, 128, 4096}) deepinfer::Run(batch, layer, false, sweep, stream);
  }
  for (const deepinfer::Layer& layer : layers) deepinfer::Run(4096, layer, true, sweep, stream);
  return 0;
}
