// moe_block_decode_bench: the MoE block of one decode layer at 1 and 2 tokens (routed experts
// + shared experts, what MoeBlock (worker/model/moe/moe_block.h) issues after the routing), old
// vs new, recorded into a CUDA graph (Backend::Capture) and replayed:
//
//   old  CudaBackend::RoutedExperts (permute, GroupedGemmBf16 gate_up, SiluMulF32, down,
//        combine) + the shared MLP as the model runs it with fused ops and bf16 weights (Gemm on
//        the bf16 normed rows, SiluMulBf16, Gemm accumulating into out)
//   new  CudaBackend::RoutedAndSharedExperts (kernels::MoeDecodeFusedF32, two launches), twice
//        (the spread between two runs of the same case)
//   rout each layer as the model issues it: CudaBackend::RouteTokens (AddRmsNorm of the layer's
//        residual row into its hidden rows, then the fused router on them, writing the layer's
//        own routing) and RoutedAndSharedExperts, twice. The time includes the norm and the
//        router; "diff" is against the first "rout" (0: a replay changes no bit); "layer MB" is
//        the fixed routing's (exact at 1 token: top_k distinct experts either way).
// The fused paths run where CudaBackend::DecodeMoeFusedFor takes the size (not V3 at 2 tokens);
// elsewhere only "old".
//
// Shapes: Moonlight (64 experts, top-6, hidden 2048, moe_intermediate 1408, 2 shared experts)
// and DeepSeek-V3 (256, top-8, 7168, 2048, 1 shared), bf16 weights. The graph holds kLayers
// layers, each with its own shared weights and routing (distinct experts across layers), so a
// replay streams every layer's weights from HBM (their sum is far beyond the 50 MB L2).
//
// Time: kReplays replays back to back between two stream synchronisations, wall clock per
// layer, median of 7 (after 3 warm-up replays). The weights one layer must read (its busy
// experts and the shared MLP) over that time gives GB/s and the fraction of 4.3 TB/s. "diff":
// largest |new - old| over the last layer's output, relative to its largest |old|.
//
//   moe_block_decode_bench [SHAPE TOKENS [PATH...]]   (one line per case; exit status 1 on an
//        error; SHAPE moonlight or v3, TOKENS 1 or 2: that case only; PATH...: those paths only,
//        without the references ("rel diff" 0), e.g. one routed layer under Nsight Compute:
//        `ncu --kernel-name-base demangled -k 'regex:RouteTokens|GateUp|DownStationary' -c 3
//        moe_block_decode_bench moonlight 1 rout`)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
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
constexpr int kLayers = 4;

void Fail(const char* what) {
  std::fprintf(stderr, "moe_block_decode_bench: %s\n", what);
  std::exit(1);
}

struct Shape {
  const char* name;
  int32_t experts;
  int32_t top_k;
  int64_t hidden;
  int64_t inter;
  int64_t shared;  // n_shared_experts
  int32_t groups, topk_groups;
  float scaling;  // routed_scaling_factor
};

// One layer's inputs on the device.
struct Layer {
  std::unique_ptr<DeviceBuffer> hidden, hidden_bf16, ids, weights, shared_gate_up, shared_down, out;
  // The routed cases: the residual row normed into `hidden`, the norm and router weights, the
  // router's bias and outputs.
  std::unique_ptr<DeviceBuffer> residual, norm_weight, router, bias, routed_ids, routed_weights;
  int64_t busy_experts = 0;
};

int Main(int argc, char** argv) {
  const char* only_shape = argc > 1 ? argv[1] : nullptr;
  const int only_tokens = argc > 2 ? std::atoi(argv[2]) : 0;
  const std::set<std::string> only_paths(argv + std::min(argc, 3), argv + argc);
  auto backend = CudaBackend::Create(0, WeightDType::kBFloat16);
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 1;
  }
  CudaBackend& b = **backend;
  const Shape shapes[] = {{"moonlight", 64, 6, 2048, 1408, 2, 1, 1, 2.446f},
                          {"v3", 256, 8, 7168, 2048, 1, 8, 4, 2.5f}};
  std::printf("%-9s %6s %5s %10s | %-4s %9s %8s %9s %10s\n", "shape", "tokens", "busy", "layer MB",
              "path", "us/layer", "GB/s", "of 4.3TB", "rel diff");
  for (const Shape& s : shapes) {
    if (only_shape != nullptr && std::strcmp(only_shape, s.name) != 0) continue;
    const int64_t H = s.hidden, I = s.inter, SI = s.shared * s.inter;
    const size_t gate_up_bytes = 2 * I * H * 2, down_bytes = H * I * 2;
    const size_t per_expert = gate_up_bytes + down_bytes;
    // Only the experts the layers use get memory (top_k * 2 tokens * kLayers at most).
    const int32_t pool = std::min<int32_t>(s.experts, 2 * s.top_k * kLayers);
    auto weights = b.Allocate(per_expert * pool);
    // Any finite bf16 values: every byte 0x3c (bf16 0x3c3c, about 0.0115).
    if (cudaMemset(weights->data(), 0x3c, per_expert * pool) != cudaSuccess) Fail("cudaMemset");
    std::vector<const void*> gate_up_host(s.experts), down_host(s.experts);
    for (int32_t e = 0; e < s.experts; ++e) {
      const char* base = static_cast<const char*>(weights->data()) + (e % pool) * per_expert;
      gate_up_host[e] = base;
      down_host[e] = base + gate_up_bytes;
    }
    auto upload = [&](const void* p, size_t n) {
      auto buf = b.Allocate(n);
      b.CopyToDevice(p, n, buf->data());
      return buf;
    };
    auto gate_up_table = upload(gate_up_host.data(), s.experts * sizeof(void*));
    auto down_table = upload(down_host.data(), s.experts * sizeof(void*));
    std::vector<int32_t> slot_host(s.experts);
    std::iota(slot_host.begin(), slot_host.end(), 0);
    auto slots = upload(slot_host.data(), s.experts * sizeof(int32_t));
    for (int32_t tokens : {1, 2}) {
      if (only_tokens != 0 && tokens != only_tokens) continue;
      std::mt19937 gen(static_cast<uint32_t>(tokens));
      std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
      std::vector<Layer> layers(kLayers);
      for (int l = 0; l < kLayers; ++l) {
        Layer& L = layers[l];
        std::vector<float> hidden(tokens * H), w(tokens * s.top_k);
        for (float& v : hidden) v = uni(gen);
        for (float& v : w) v = 0.5f * uni(gen);
        std::vector<uint16_t> hidden16(hidden.size());
        for (size_t i = 0; i < hidden.size(); ++i) {
          uint32_t u;
          std::memcpy(&u, &hidden[i], 4);
          hidden16[i] = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
        }
        // Layer l's experts come from pool entries [l * 2K, (l + 1) * 2K): no two layers share
        // weights; the tokens of a layer pick top_k of those 2K at random.
        std::vector<int32_t> mine(2 * s.top_k), ids;
        std::iota(mine.begin(), mine.end(), (l * 2 * s.top_k) % pool);
        std::set<int32_t> busy;
        for (int32_t t = 0; t < tokens; ++t) {
          std::shuffle(mine.begin(), mine.end(), gen);
          std::vector<int32_t> row(mine.begin(), mine.begin() + s.top_k);
          std::sort(row.begin(), row.end());
          ids.insert(ids.end(), row.begin(), row.end());
          busy.insert(row.begin(), row.end());
        }
        L.busy_experts = static_cast<int64_t>(busy.size());
        L.hidden = upload(hidden.data(), hidden.size() * sizeof(float));
        L.hidden_bf16 = upload(hidden16.data(), hidden16.size() * sizeof(uint16_t));
        L.weights = upload(w.data(), w.size() * sizeof(float));
        L.ids = upload(ids.data(), ids.size() * sizeof(int32_t));
        L.shared_gate_up = b.Allocate(2 * SI * H * 2);
        L.shared_down = b.Allocate(H * SI * 2);
        if (cudaMemset(L.shared_gate_up->data(), 0x3b, 2 * SI * H * 2) != cudaSuccess ||
            cudaMemset(L.shared_down->data(), 0x3b, H * SI * 2) != cudaSuccess) {
          Fail("cudaMemset(shared)");
        }
        L.out = b.Allocate(tokens * H * sizeof(float));
        std::vector<float> residual(tokens * H), norm_weight(H), router(s.experts * H);
        for (float& v : residual) v = uni(gen);
        for (float& v : norm_weight) v = 1.0f + 0.1f * uni(gen);
        for (float& v : router) v = 0.05f * uni(gen);
        const std::vector<float> bias(s.experts, 0.0f);
        L.residual = upload(residual.data(), residual.size() * sizeof(float));
        L.norm_weight = upload(norm_weight.data(), norm_weight.size() * sizeof(float));
        L.router = upload(router.data(), router.size() * sizeof(float));
        L.bias = upload(bias.data(), bias.size() * sizeof(float));
        L.routed_ids = b.Allocate(tokens * s.top_k * sizeof(int32_t));
        L.routed_weights = b.Allocate(tokens * s.top_k * sizeof(float));
      }
      auto args_for = [&](Layer& L) {
        RoutedExpertsArgs a;
        a.num_tokens = tokens;
        a.top_k = s.top_k;
        a.num_experts = s.experts;
        a.hidden_size = H;
        a.inter = I;
        a.hidden = L.hidden->as<float>();
        a.topk_ids = L.ids->as<int32_t>();
        a.topk_weights = L.weights->as<float>();
        a.slot_of_expert = slots->as<int32_t>();
        a.gate_up = static_cast<const void* const*>(gate_up_table->data());
        a.down = static_cast<const void* const*>(down_table->data());
        a.gate_up_host = gate_up_host.data();
        a.down_host = down_host.data();
        a.dtype = WeightDType::kBFloat16;
        a.out = L.out->as<float>();
        a.shared_inter = SI;
        a.shared_gate_up = L.shared_gate_up->data();
        a.shared_down = L.shared_down->data();
        return a;
      };
      // The model's shared MLP with fused ops and bf16 weights (SwiGluMlp,
      // worker/model/layers/swiglu_mlp.h).
      auto old_layer = [&](Layer& L) {
        const RoutedExpertsArgs a = args_for(L);
        if (!b.RoutedExperts(a)) Fail("RoutedExperts declined");
        auto gu = b.AllocateScratch(tokens * 2 * SI * sizeof(float));
        b.Gemm(tokens, 2 * SI, H, ActivationView::Bf16(L.hidden_bf16->as<uint16_t>()), H,
               WeightView(L.shared_gate_up->data(), WeightDType::kBFloat16), H, gu->as<float>(),
               2 * SI, false);
        auto act = b.AllocateScratch(tokens * SI * sizeof(uint16_t));
        b.SiluMulBf16(tokens, SI, gu->as<float>(), act->as<uint16_t>());
        b.Gemm(tokens, H, SI, ActivationView::Bf16(act->as<uint16_t>()), SI,
               WeightView(L.shared_down->data(), WeightDType::kBFloat16), SI, a.out, H, true);
      };
      auto new_layer = [&](Layer& L) {
        if (!b.RoutedAndSharedExperts(args_for(L))) Fail("RoutedAndSharedExperts declined");
      };
      // The model's MoE layer: RouteTokens (the norm into L.hidden, then the router), then the
      // block on that routing.
      auto routed_layer = [&](Layer& L) {
        RouteTokensArgs ra;
        ra.hidden_size = H;
        ra.hidden = L.hidden->as<float>();
        ra.norm.x = L.residual->as<float>();
        ra.norm.weight = L.norm_weight->as<float>();
        ra.norm.eps = 1e-6f;
        ra.norm.out = L.hidden->as<float>();
        ra.router_weight = L.router->as<float>();
        ra.route.num_tokens = tokens;
        ra.route.num_experts = s.experts;
        ra.route.correction_bias = L.bias->as<float>();
        ra.route.num_groups = s.groups;
        ra.route.topk_groups = s.topk_groups;
        ra.route.top_k = s.top_k;
        ra.route.normalize = true;
        ra.route.scaling_factor = s.scaling;
        ra.route.topk_ids = L.routed_ids->as<int32_t>();
        ra.route.topk_weights = L.routed_weights->as<float>();
        b.RouteTokens(ra);
        RoutedExpertsArgs a = args_for(L);
        a.topk_ids = L.routed_ids->as<int32_t>();
        a.topk_weights = L.routed_weights->as<float>();
        if (!b.RoutedAndSharedExperts(a)) Fail("RoutedAndSharedExperts declined (routed)");
      };
      struct Path {
        const char* name;
        bool fused, routed;
      };
      const Path paths[] = {{"old", false, false},
                            {"new", true, false},
                            {"new", true, false},
                            {"rout", true, true},
                            {"rout", true, true}};
      const bool fused_taken = CudaBackend::DecodeMoeFusedFor(tokens, H);
      int64_t layer_bytes = 0;
      for (const Layer& L : layers) layer_bytes += L.busy_experts * per_expert + 3 * SI * H * 2;
      layer_bytes /= kLayers;
      std::vector<float> old_out, routed_out;
      for (int path = 0; path < static_cast<int>(std::size(paths)); ++path) {
        const Path& pa = paths[path];
        if (!only_paths.empty() && only_paths.count(pa.name) == 0) continue;
        if (pa.fused && !fused_taken) continue;
        auto ops = b.Capture([&] {
          for (Layer& L : layers) {
            if (path == 0) {
              old_layer(L);
            } else if (pa.routed) {
              routed_layer(L);
            } else {
              new_layer(L);
            }
          }
          return absl::OkStatus();
        });
        if (!ops.ok()) {
          std::fprintf(stderr, "%s\n", ops.status().ToString().c_str());
          Fail("capture");
        }
        const absl::StatusOr<double> replay_us =
            MedianReplayMicros(b, **ops, s.experts > 64 ? 10 : 40);
        if (!replay_us.ok()) Fail("replay");
        if (!b.status().ok()) {
          std::fprintf(stderr, "%s\n", b.status().ToString().c_str());
          Fail("backend error");
        }
        std::vector<float> out(tokens * H);
        b.CopyToHost(layers.back().out->data(), out.size() * sizeof(float), out.data());
        double diff = 0;
        if (!only_paths.empty()) {
          // Filtered: no reference ran.
        } else if (path == 0) {
          old_out = out;
        } else if (pa.routed && routed_out.empty()) {
          routed_out = out;
        } else {
          const std::vector<float>& ref = pa.routed ? routed_out : old_out;
          double scale = 0;
          for (size_t i = 0; i < out.size(); ++i) {
            diff = std::max(diff, std::abs(static_cast<double>(out[i]) - ref[i]));
            scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
          }
          diff /= std::max(scale, 1e-30);
        }
        const double t = *replay_us / kLayers;  // per layer
        const double gbs = layer_bytes / (t * 1e-6) / 1e9;
        std::printf("%-9s %6d %5lld %10.1f | %-4s %9.1f %8.0f %9.3f %10.3g\n", s.name, tokens,
                    static_cast<long long>(layers.back().busy_experts), layer_bytes / 1e6, pa.name,
                    t, gbs, gbs * 1e9 / kRooflineBytesPerSecond, diff);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace deepinfer

int main(int argc, char** argv) { return deepinfer::Main(argc, argv); }
