// The decode router in one launch: the router logits of a few normed hidden rows (fp32 GEMV
// against the fp32 router weight), the noaux_tc routing of NoauxTcRouteF32 on them, and the EPLB
// expert counts of AccumulateExpertCounts. The GPU counterpart of Backend::RouteTokens.
#ifndef DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_FUSED_H_
#define DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_FUSED_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace deepinfer {
namespace kernels {

// Tokens of one call at most (decode batches; larger ones are a GEMM's job).
constexpr int32_t kMaxFusedRouterTokens = 256;
// Experts at most (DeepSeek-V3: 256; more go to the GEMM + NoauxTcRouteF32 path).
constexpr int32_t kMaxFusedRouterExperts = 256;
// Entries of RouteTokensParams::tile_counters.
constexpr int32_t kFusedRouterTileCounters = kMaxFusedRouterTokens;

struct RouteTokensParams {
  int32_t num_tokens = 0;
  int32_t hidden_size = 0;               // a multiple of 4
  const float* hidden = nullptr;         // [tokens, hidden_size], 16-byte aligned
  const float* router_weight = nullptr;  // [experts, hidden_size], 16-byte aligned
  // Written: the logits [tokens, experts] (the blocks of a token tile hand them over here).
  float* router_logits = nullptr;
  // kFusedRouterTileCounters zeros, left zero by every call: which block of a token tile comes
  // last (and routes the tile). One array per stream: calls must not overlap.
  uint32_t* tile_counters = nullptr;
  // The router, as NoauxTcRouteParams.
  int32_t num_experts = 0;
  const float* correction_bias = nullptr;  // [experts] or null
  int32_t num_groups = 1;
  int32_t topk_groups = 1;
  int32_t top_k = 1;
  bool normalize = true;
  float scaling_factor = 1.0f;
  int32_t* topk_ids = nullptr;    // [tokens, top_k], ascending expert id within a token
  float* topk_weights = nullptr;  // [tokens, top_k]
  // Optional (null: no counting): counts[id] += 1 for pair i = token * top_k + position with
  // i < *count_limit (count_limit null: every pair), as AccumulateExpertCounts.
  int64_t* expert_counts = nullptr;
  const int32_t* count_limit = nullptr;
  // Block tile (tokens x experts): 0 = by size (RouteTokensTile). For benchmarks.
  int32_t tile_tokens = 0;   // 1, 2, 4 or 8
  int32_t tile_experts = 0;  // 1 or 2; with 8 tile tokens also 4 or 8
};

// Whether RouteTokensF32 takes these arguments (tokens and experts within the limits above, the
// router limits of NoauxTcRouteShapeSupported, hidden_size and alignment, the pointers set).
bool RouteTokensSupported(const RouteTokensParams& p);

// The block tile RouteTokensF32 uses for `tokens` tokens when the params leave it to the kernel:
// the fastest in noaux_tc_router_bench (H200, hidden 2048, 64 experts, every tile in a CUDA
// graph): 1 or 2 tokens x 1 expert up to 2 tokens, 4 x 1 up to 8 tokens (8: 6.1 us a call
// against 6.7 for 8 x 1), 4 x 2 up to 64 (64: 8.2 us against 10.1 for 8 x 4), 8 x 2 above (128:
// 10.5 us against 11.6 for 8 x 8; 256: 15.4 against 22.3).
void RouteTokensTile(int32_t tokens, int32_t* tile_tokens, int32_t* tile_experts);

// The logits are fp32 sums in an order of the kernel's own (not cuBLAS's); the routing of them
// is NoauxTcRouteF32's, bit for bit. cudaErrorInvalidValue where RouteTokensSupported does not
// hold (num_tokens 0: nothing to do, cudaSuccess).
cudaError_t RouteTokensF32(const RouteTokensParams& p, cudaStream_t stream);

}  // namespace kernels
}  // namespace deepinfer

#endif  // DEEPINFER_KERNELS_MOE_NOAUX_TC_ROUTER_FUSED_H_
