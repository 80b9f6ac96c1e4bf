// moe_decode_fused_fp8_bench: kernels::MoeDecodeFusedFp8 (the FP8 fused decode MoE block, one
// gate_up and one down launch) per kernel pair (MoeDecodeFusedFp8Variant: per_row, row_reuse,
// stationary, pipelined; "default" is the one the backend takes), at Moonlight's shape (64
// experts, top-6, hidden 2048, moe_intermediate 1408, 2 shared experts) and DeepSeek-V3's (256,
// top-8, 7168, 2048, 1 shared) with e4m3 weights and 128 x 128 block scales, at 1 and 2 tokens.
// row_reuse and stationary launch the same gate_up; at 1 token they differ in the down kernel only
// (kRowReuse's 4-features-a-pass down against the stationary down), at 2 tokens they are the
// same pair. pipelined and stationary launch the same down; at Moonlight 1 token they differ in
// the gate_up kernel only (kPipelined's register-ring gate_up against kRowReuse's), elsewhere
// (V3's hidden 7168, 2 tokens) pipelined is the stationary pair.
//
// A CUDA graph holds kLayers launch pairs, each layer with its own shared weights and routing
// (distinct experts across layers and tokens, from a pool of kPoolExperts experts), so a replay
// streams every layer's weights from HBM (far beyond the 50 MB L2). Time: per launch pair, the
// median over kReplays timed replays (bench::GraphMicrosPerLaunch). "MB": the weights and scales
// one launch pair reads (its distinct experts and the shared MLP); TB/s is that over the time. "rel
// diff": largest |out - per_row out| over the first layer's output, relative to its largest
// |per_row out| (per_row itself: 0).
//
//   moe_decode_fused_fp8_bench [SHAPE [TOKENS]]   (SHAPE moonlight or v3, TOKENS 1 or 2: that
//        case only; exit status 1 on an error), e.g. kRowReuse's gate_up and down under Nsight
//        Compute: `ncu --kernel-name-base demangled -k regex:ReuseBody -c 2
//        moe_decode_fused_fp8_bench moonlight 1` (kPerRow's: `-k 'regex:::(GateUp|Down)Body<'`;
//        the stationary down: `-k regex:DownStationary -c 1`; kPipelined's gate_up:
//        `-k regex:GateUpPipelinedBody -c 1`, beside kRowReuse's: `-k regex:GateUpReuseBody -c 1`)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/moe/moe_decode_fused.h"
#include "kernels/moe/moe_decode_fused_fp8.h"
#include "kernels/testing/bench_timer.h"
#include "kernels/testing/bench_util.h"

namespace deepinfer {
namespace {

using kernels::MoeDecodeFusedFp8Params;
using kernels::MoeDecodeFusedFp8Variant;

constexpr int kLayers = 8;
constexpr int kPoolExperts = 64;
constexpr int kReplays = 20;

struct Shape {
  const char* name;
  int32_t experts, top_k, hidden, inter, shared_parts;
};

// An [n, k] e4m3 matrix with its scale grid (stacked at split_rows) on the device.
struct DeviceFp8 {
  uint8_t* data = nullptr;
  float* scales = nullptr;
  int32_t scale_ld = 0;
  int64_t bytes = 0;  // data and scales
};

// n x k random e4m3 bytes (no NaN) and scales in [2^-9, 2^-8), one copy on the host per shape
// and kind; the device copies share the values, not the memory.
struct HostFp8 {
  std::vector<uint8_t> data;
  std::vector<float> scales;
  int32_t scale_ld = 0;
};

HostFp8 MakeHost(int64_t n, int64_t k, int64_t split_rows, uint64_t seed) {
  HostFp8 w;
  const std::vector<float> u = bench::Uniform(n * k, seed);
  w.data.resize(n * k);
  for (size_t i = 0; i < u.size(); ++i) {
    const uint32_t r = static_cast<uint32_t>((u[i] + 1.0f) * 8388608.0f);
    uint8_t b = static_cast<uint8_t>(r & 0xFF);
    if ((b & 0x7F) == 0x7F) b &= 0xFE;  // not NaN
    if ((b & 0x78) == 0x78) b &= 0xBF;  // |value| <= 2^7: keep the sums moderate
    w.data[i] = b;
  }
  w.scale_ld = static_cast<int32_t>(kernels::Fp8ScaleLd(k));
  const std::vector<float> s =
      bench::Uniform(kernels::Fp8ScaleRows(n, split_rows) * w.scale_ld, seed + 1);
  for (float v : s) w.scales.push_back((1.5f + 0.5f * v) * 0x1p-9f);
  return w;
}

DeviceFp8 Upload(const HostFp8& w) {
  DeviceFp8 d;
  d.data = bench::Upload(w.data);
  d.scales = bench::Upload(w.scales);
  d.scale_ld = w.scale_ld;
  d.bytes = static_cast<int64_t>(w.data.size() + w.scales.size() * sizeof(float));
  return d;
}

const char* VariantName(MoeDecodeFusedFp8Variant v) {
  switch (v) {
    case MoeDecodeFusedFp8Variant::kDefault:
      return "default";
    case MoeDecodeFusedFp8Variant::kPerRow:
      return "per_row";
    case MoeDecodeFusedFp8Variant::kRowReuse:
      return "row_reuse";
    case MoeDecodeFusedFp8Variant::kStationary:
      return "stationary";
    case MoeDecodeFusedFp8Variant::kPipelined:
      return "pipelined";
  }
  return "?";
}

void RunShape(const Shape& s, int tokens) {
  const int64_t H = s.hidden, I = s.inter, SI = int64_t{s.shared_parts} * I;
  // The pool's experts share one host matrix pair (each its own device copy).
  const HostFp8 gate_up_host = MakeHost(2 * I, H, I, 11);
  const HostFp8 down_host = MakeHost(H, I, 0, 12);
  std::vector<DeviceFp8> gate_up, down;
  for (int e = 0; e < kPoolExperts; ++e) {
    gate_up.push_back(Upload(gate_up_host));
    down.push_back(Upload(down_host));
  }
  const HostFp8 shared_gate_up_host = MakeHost(2 * SI, H, SI, 13);
  const HostFp8 shared_down_host = MakeHost(H, SI, 0, 14);
  std::vector<DeviceFp8> shared_gate_up, shared_down;
  for (int l = 0; l < kLayers; ++l) {
    shared_gate_up.push_back(Upload(shared_gate_up_host));
    shared_down.push_back(Upload(shared_down_host));
  }
  // The expert table (slot e: pool expert e % kPoolExperts), identity slots.
  std::vector<const uint8_t*> gu_table(s.experts), dn_table(s.experts);
  std::vector<const float*> gu_scales(s.experts), dn_scales(s.experts);
  std::vector<int32_t> slot_of(s.experts);
  for (int e = 0; e < s.experts; ++e) {
    gu_table[e] = gate_up[e % kPoolExperts].data;
    gu_scales[e] = gate_up[e % kPoolExperts].scales;
    dn_table[e] = down[e % kPoolExperts].data;
    dn_scales[e] = down[e % kPoolExperts].scales;
    slot_of[e] = e;
  }
  const uint8_t* const* d_gu = bench::Upload(gu_table);
  const float* const* d_gus = bench::Upload(gu_scales);
  const uint8_t* const* d_dn = bench::Upload(dn_table);
  const float* const* d_dns = bench::Upload(dn_scales);
  const int32_t* d_slot = bench::Upload(slot_of);
  const float* d_hidden = bench::Upload(bench::Uniform(tokens * H, 15));
  std::vector<float> topk_w = bench::Uniform(tokens * s.top_k, 16);
  for (float& w : topk_w) w = 0.3f + 0.25f * w;
  const float* d_topk_w = bench::Upload(topk_w);
  float* d_act = bench::DeviceAlloc<float>(
      kernels::MoeDecodeFusedActFloats(tokens, s.top_k, s.shared_parts, I) * sizeof(float));
  float* d_out = bench::DeviceAlloc<float>(tokens * H * sizeof(float));

  // Layer l's token t takes pool experts (l * tokens + t) * top_k + k (mod the pool): distinct
  // within a token, across tokens and, while the pool lasts, across layers.
  std::vector<MoeDecodeFusedFp8Params> layers(kLayers);
  int64_t pair_bytes = 0;
  for (int l = 0; l < kLayers; ++l) {
    std::vector<int32_t> ids;
    for (int t = 0; t < tokens; ++t) {
      std::vector<int32_t> row;
      for (int k = 0; k < s.top_k; ++k)
        row.push_back(((l * tokens + t) * s.top_k + k) % kPoolExperts);
      std::sort(row.begin(), row.end());
      ids.insert(ids.end(), row.begin(), row.end());
    }
    std::vector<int32_t> distinct = ids;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    if (l == 0) {
      pair_bytes = static_cast<int64_t>(distinct.size()) * (gate_up[0].bytes + down[0].bytes) +
                   shared_gate_up[0].bytes + shared_down[0].bytes;
    }
    MoeDecodeFusedFp8Params& p = layers[l];
    p.num_tokens = tokens;
    p.top_k = s.top_k;
    p.num_experts = s.experts;
    p.hidden_size = s.hidden;
    p.inter = s.inter;
    p.hidden = d_hidden;
    p.topk_ids = bench::Upload(ids);
    p.topk_weights = d_topk_w;
    p.slot_of_expert = d_slot;
    p.gate_up = d_gu;
    p.gate_up_scales = d_gus;
    p.gate_up_scale_ld = gate_up[0].scale_ld;
    p.down = d_dn;
    p.down_scales = d_dns;
    p.down_scale_ld = down[0].scale_ld;
    p.shared_parts = s.shared_parts;
    p.shared_gate_up = shared_gate_up[l].data;
    p.shared_gate_up_scales = shared_gate_up[l].scales;
    p.shared_gate_up_scale_ld = shared_gate_up[l].scale_ld;
    p.shared_gate_up_split_rows = static_cast<int32_t>(SI);
    p.shared_down = shared_down[l].data;
    p.shared_down_scales = shared_down[l].scales;
    p.shared_down_scale_ld = shared_down[l].scale_ld;
    p.act = d_act;
    p.out = d_out;
  }

  cudaStream_t stream;
  BENCH_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  // Layer 0's output of a variant, downloaded.
  auto layer0 = [&](MoeDecodeFusedFp8Variant v) {
    MoeDecodeFusedFp8Params p = layers[0];
    p.variant = v;
    BENCH_CUDA(cudaMemsetAsync(d_out, 0xFF, tokens * H * sizeof(float), stream));
    BENCH_CUDA(kernels::MoeDecodeFusedFp8(p, stream));
    std::vector<float> out(tokens * H);
    BENCH_CUDA(cudaMemcpyAsync(out.data(), d_out, out.size() * sizeof(float),
                               cudaMemcpyDeviceToHost, stream));
    BENCH_CUDA(cudaStreamSynchronize(stream));
    return out;
  };
  const std::vector<float> ref = layer0(MoeDecodeFusedFp8Variant::kPerRow);
  double ref_max = 0;
  for (float v : ref) ref_max = std::max(ref_max, std::abs(static_cast<double>(v)));

  for (const MoeDecodeFusedFp8Variant v :
       {MoeDecodeFusedFp8Variant::kPerRow, MoeDecodeFusedFp8Variant::kRowReuse,
        MoeDecodeFusedFp8Variant::kStationary, MoeDecodeFusedFp8Variant::kPipelined,
        MoeDecodeFusedFp8Variant::kDefault}) {
    const std::vector<float> out = layer0(v);
    double diff = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(out[i]) - ref[i]));
    }
    const double us = bench::GraphMicrosPerLaunch(
        kLayers,
        [&](int l, cudaStream_t st) {
          MoeDecodeFusedFp8Params p = layers[l];
          p.variant = v;
          BENCH_CUDA(kernels::MoeDecodeFusedFp8(p, st));
        },
        kReplays);
    std::printf("%-9s tokens %d  %-10s  %8.2f us  %7.1f MB  %5.2f TB/s  rel diff %.3g\n", s.name,
                tokens, VariantName(v), us, pair_bytes / 1e6, pair_bytes / us / 1e6,
                ref_max > 0 ? diff / ref_max : diff);
  }
  BENCH_CUDA(cudaStreamDestroy(stream));
  // The pools are freed before the next shape (a benchmark otherwise never frees).
  for (auto* list : {&gate_up, &down, &shared_gate_up, &shared_down}) {
    for (DeviceFp8& w : *list) {
      BENCH_CUDA(cudaFree(w.data));
      BENCH_CUDA(cudaFree(w.scales));
    }
  }
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) {
  using deepinfer::Shape;
  const Shape shapes[] = {{"moonlight", 64, 6, 2048, 1408, 2}, {"v3", 256, 8, 7168, 2048, 1}};
  const std::string only_shape = argc > 1 ? argv[1] : "";
  const int only_tokens = argc > 2 ? std::atoi(argv[2]) : 0;
  bool any = false;
  for (const Shape& s : shapes) {
    if (!only_shape.empty() && only_shape != s.name) continue;
    for (int tokens = 1; tokens <= 2; ++tokens) {
      if (only_tokens != 0 && only_tokens != tokens) continue;
      deepinfer::RunShape(s, tokens);
      any = true;
    }
  }
  if (!any) {
    std::fprintf(stderr, "usage: moe_decode_fused_fp8_bench [moonlight|v3 [1|2]]\n");
    return 1;
  }
  return 0;
}
