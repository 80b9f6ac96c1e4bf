// moe_decode_bench: one decode MoE layer the way the decode graphs run it:
// CudaBackend::RoutedExperts (permute, planned cuBLAS expert GEMMs, SiLU-mul over the real rows,
// combine) recorded into a CUDA graph (Backend::Capture) and replayed, at the Moonlight shape (64
// experts, top-6, hidden 2048, moe_intermediate 1408) and the DeepSeek-V3 shape (256 experts,
// top-8, hidden 7168, moe_intermediate 2048), bf16 weights, 1 / 8 / 64 / 128 / 256 tokens,
// uniform random distinct top-k routing (one routing per case), twice per case (the spread
// between two runs of the same case), in the default mode ("default": the planned cuBLAS chunks
// from 3 tokens) and in the batch-invariant mode ("bi", CudaTuning::batch_invariant: the grouped
// Bf16MmaGroupedGemm at every size).
//
// Time: 20 replays (V3: 4) back to back between two stream synchronisations, wall clock per
// replay, median of 7 (after 3 warm-up replays). The weights of the busy experts (what the layer
// must read, none of it in L2 at these sizes) over that time gives GB/s and the fraction of 4.3
// TB/s (docs/performance.md's roofline). "diff": largest |second - first| over the layer's
// output (0: a replay changes no bit).
//
//   moe_decode_bench [SHAPE]   (one line per case; exit status 1 on an error; SHAPE: moonlight
//                               or v3, default both)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/replay_timing.h"

namespace deepinfer {
namespace {

constexpr double kRooflineBytesPerSecond = 4.3e12;

void Fail(const char* what) {
  std::fprintf(stderr, "moe_decode_bench: %s\n", what);
  std::exit(1);
}

struct Shape {
  const char* name;
  int32_t experts;
  int32_t top_k;
  int64_t hidden;
  int64_t inter;
};

// One layer's inputs on the device, for `tokens` tokens.
struct Layer {
  std::unique_ptr<DeviceBuffer> hidden, ids, weights, slots, gate_up_table, down_table, out;
  std::vector<const void*> gate_up_host, down_host;
  int64_t busy_experts = 0;
};

Layer MakeLayer(CudaBackend& b, const Shape& s, int32_t tokens, const char* expert_weights,
                uint32_t seed) {
  Layer l;
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  std::vector<float> hidden(tokens * s.hidden), w(tokens * s.top_k);
  for (float& v : hidden) v = uni(gen);
  for (float& v : w) v = 0.5f * uni(gen);
  std::vector<int32_t> ids;
  std::set<int32_t> busy;
  std::vector<int32_t> all(s.experts);
  std::iota(all.begin(), all.end(), 0);
  for (int32_t t = 0; t < tokens; ++t) {
    std::shuffle(all.begin(), all.end(), gen);
    std::sort(all.begin(), all.begin() + s.top_k);
    ids.insert(ids.end(), all.begin(), all.begin() + s.top_k);
    busy.insert(all.begin(), all.begin() + s.top_k);
  }
  l.busy_experts = static_cast<int64_t>(busy.size());
  std::vector<int32_t> slots(s.experts);
  std::iota(slots.begin(), slots.end(), 0);
  const size_t gate_up_bytes = 2 * s.inter * s.hidden * 2, down_bytes = s.hidden * s.inter * 2;
  for (int32_t e = 0; e < s.experts; ++e) {
    const char* base = expert_weights + e * (gate_up_bytes + down_bytes);
    l.gate_up_host.push_back(base);
    l.down_host.push_back(base + gate_up_bytes);
  }
  auto upload = [&](const void* p, size_t n) {
    auto buf = b.Allocate(n);
    b.CopyToDevice(p, n, buf->data());
    return buf;
  };
  l.hidden = upload(hidden.data(), hidden.size() * sizeof(float));
  l.weights = upload(w.data(), w.size() * sizeof(float));
  l.ids = upload(ids.data(), ids.size() * sizeof(int32_t));
  l.slots = upload(slots.data(), slots.size() * sizeof(int32_t));
  l.gate_up_table = upload(l.gate_up_host.data(), s.experts * sizeof(void*));
  l.down_table = upload(l.down_host.data(), s.experts * sizeof(void*));
  l.out = b.Allocate(tokens * s.hidden * sizeof(float));
  return l;
}

RoutedExpertsArgs ArgsFor(const Shape& s, int32_t tokens, Layer& l) {
  RoutedExpertsArgs a;
  a.num_tokens = tokens;
  a.top_k = s.top_k;
  a.num_experts = s.experts;
  a.hidden_size = s.hidden;
  a.inter = s.inter;
  a.hidden = l.hidden->as<float>();
  a.topk_ids = l.ids->as<int32_t>();
  a.topk_weights = l.weights->as<float>();
  a.slot_of_expert = l.slots->as<int32_t>();
  a.gate_up = static_cast<const void* const*>(l.gate_up_table->data());
  a.down = static_cast<const void* const*>(l.down_table->data());
  a.gate_up_host = l.gate_up_host.data();
  a.down_host = l.down_host.data();
  a.dtype = WeightDType::kBFloat16;
  a.out = l.out->as<float>();
  return a;
}

// Median µs per replay of the recorded layer; *out gets the layer's output.
double TimeLayer(CudaBackend& b, const RoutedExpertsArgs& a, int64_t out_n,
                 std::vector<float>* out) {
  auto ops = b.Capture([&] {
    b.RoutedExperts(a);
    return absl::OkStatus();
  });
  if (!ops.ok()) {
    std::fprintf(stderr, "%s\n", ops.status().ToString().c_str());
    Fail("capture");
  }
  // About 6 ms of GPU time per timed batch of replays.
  const absl::StatusOr<double> us = MedianReplayMicros(b, **ops, a.num_experts > 64 ? 4 : 20);
  if (!us.ok()) Fail("replay");
  if (!b.status().ok()) {
    std::fprintf(stderr, "%s\n", b.status().ToString().c_str());
    Fail("backend error");
  }
  out->assign(out_n, 0.0f);
  b.CopyToHost(a.out, out_n * sizeof(float), out->data());
  return *us;
}

int Main(int argc, char** argv) {
  const std::string only_shape = argc > 1 ? argv[1] : "";
  auto backend = CudaBackend::Create(0, WeightDType::kBFloat16);
  CudaTuning invariant_tuning;
  invariant_tuning.batch_invariant = true;
  auto invariant = CudaBackend::Create(0, WeightDType::kBFloat16, invariant_tuning);
  for (const auto* created : {&backend, &invariant}) {
    if (!created->ok()) {
      std::fprintf(stderr, "%s\n", created->status().ToString().c_str());
      return 1;
    }
  }
  CudaBackend& b = **backend;
  const struct {
    const char* name;
    CudaBackend* backend;
  } modes[] = {{"default", &b}, {"bi", invariant->get()}};
  const Shape shapes[] = {{"moonlight", 64, 6, 2048, 1408}, {"v3", 256, 8, 7168, 2048}};
  std::printf("%-9s %6s %5s %12s %-7s | %-5s %9s %8s %9s %10s\n", "shape", "tokens", "busy",
              "weights MB", "mode", "run", "us", "GB/s", "of 4.3TB", "diff");
  for (const Shape& s : shapes) {
    if (!only_shape.empty() && only_shape != s.name) continue;
    const size_t per_expert = 3 * s.inter * s.hidden * 2;
    auto weights = b.Allocate(per_expert * s.experts);
    // Any finite bf16 values: every byte 0x3c (bf16 0x3c3c, about 0.0115).
    if (cudaMemset(weights->data(), 0x3c, per_expert * s.experts) != cudaSuccess) {
      Fail("cudaMemset(weights)");
    }
    for (int32_t tokens : {1, 8, 64, 128, 256}) {
      for (const auto& mode : modes) {
        CudaBackend& mb = *mode.backend;
        Layer l = MakeLayer(mb, s, tokens, static_cast<const char*>(weights->data()),
                            static_cast<uint32_t>(tokens));
        const RoutedExpertsArgs a = ArgsFor(s, tokens, l);
        const double bytes = static_cast<double>(l.busy_experts) * per_expert;
        std::vector<float> old_out;
        for (int run = 1; run <= 2; ++run) {
          std::vector<float> out;
          const double us = TimeLayer(mb, a, tokens * s.hidden, &out);
          double diff = 0;
          if (old_out.empty()) {
            old_out = out;
          } else {
            for (size_t i = 0; i < out.size(); ++i) {
              diff = std::max(diff, std::abs(static_cast<double>(out[i]) - old_out[i]));
            }
          }
          const double gbs = bytes / (us * 1e-6) / 1e9;
          std::printf("%-9s %6d %5lld %12.1f %-7s | %-5d %9.1f %8.0f %9.3f %10.3g\n", s.name,
                      tokens, static_cast<long long>(l.busy_experts), bytes / 1e6, mode.name, run,
                      us, gbs, gbs * 1e9 / kRooflineBytesPerSecond, diff);
          std::fflush(stdout);
        }
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) { return deepinfer::Main(argc, argv); }
