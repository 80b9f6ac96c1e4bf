// CudaBackend::RoutedAndSharedExperts with FP8 experts at the swap kernel's token counts: the
// shared MLP (shared_inter = S * inter) runs as S more groups of the routed experts' grouped
// GEMMs (kernels::Fp8WgmmaSwapGroupedGemm over E + S groups), every token routed to each with
// weight 1, instead of its own quantise, gate_up GEMM, SiLU-mul and down GEMM. Part p of the
// shared MLP is gate rows p * inter .., up rows shared_inter + p * inter .. and down columns
// p * inter ..: an MLP of intermediate size inter whose outputs sum to the shared MLP's. The
// weight descriptors of one GEMM are an array (Fp8WgmmaSwapBuildWeightMaps), each encoded with its
// own row stride: the routed experts' first, then the parts'.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/gemm/fp8_block_gemm.h"
#include "kernels/gemm/fp8_mma_gemm.h"
#include "kernels/gemm/fp8_wgmma_decode.h"
#include "kernels/moe/moe_permute.h"
#include "worker/backend/cuda/cuda_backend.h"
#include "worker/backend/cuda/op_timer.h"

namespace deepinfer {
namespace {

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

intptr_t Bits(const void* p) { return reinterpret_cast<intptr_t>(p); }

// Byte offsets of one layer's shared-group storage, each 256-byte aligned.
class StorageLayout {
 public:
  size_t Take(size_t bytes) {
    const size_t at = size_;
    size_ = (size_ + bytes + 255) / 256 * 256;
    return at;
  }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

}  // namespace

const CudaBackend::Fp8SwapGroups* CudaBackend::Fp8SwapSharedGroups(const RoutedExpertsArgs& a) {
  const int64_t H = a.hidden_size, I = a.inter, SI = a.shared_inter;
  const int32_t E = a.num_experts, S = static_cast<int32_t>(SI / I);
  std::vector<intptr_t> from;
  from.reserve(2 * E + 14);
  for (int32_t e = 0; e < E; ++e) from.push_back(Bits(a.gate_up_host[e]));
  for (int32_t e = 0; e < E; ++e) from.push_back(Bits(a.down_host[e]));
  for (const void* p :
       {static_cast<const void*>(a.gate_up_scales), static_cast<const void*>(a.down_scales),
        a.shared_gate_up, a.shared_down, static_cast<const void*>(a.shared_gate_up_fp8.scales),
        static_cast<const void*>(a.shared_down_fp8.scales)}) {
    from.push_back(Bits(p));
  }
  for (int64_t v : {H, I, SI, a.gate_up_scale_ld, a.down_scale_ld, a.shared_gate_up_fp8.scale_ld,
                    a.shared_gate_up_fp8.split_rows, a.shared_down_fp8.scale_ld}) {
    from.push_back(static_cast<intptr_t>(v));
  }
  Fp8SwapShared& built =
      fp8_swap_shared_[std::make_pair(static_cast<const void*>(a.gate_up), a.shared_gate_up)];
  if (built.storage != nullptr && built.built_from == from) return &built.groups;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  Check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone) return nullptr;
  cudaFree(built.storage);
  built = Fp8SwapShared();

  // The parts' scales in the routed layout: gate_up [2 inter / 128 rows, gate_up_scale_ld]
  // (split at inter), down [hidden / 128 rows, down_scale_ld].
  const int64_t gu_scale_rows = kernels::Fp8ScaleRows(2 * I, I);
  const int64_t dn_scale_rows = kernels::Fp8ScaleRows(H, 0);
  const size_t gu_scale_bytes = gu_scale_rows * a.gate_up_scale_ld * sizeof(float);
  const size_t dn_scale_bytes = dn_scale_rows * a.down_scale_ld * sizeof(float);
  const size_t gu_bytes = 2 * I * H;
  StorageLayout layout;
  const size_t gu_maps_at = layout.Take(kernels::Fp8WgmmaSwapWeightMapsBytes(E + S));
  const size_t dn_maps_at = layout.Take(kernels::Fp8WgmmaSwapWeightMapsBytes(E + S));
  const size_t gu_table_at = layout.Take((E + S) * sizeof(const float*));
  const size_t dn_table_at = layout.Take((E + S) * sizeof(const float*));
  const size_t gu_scales_at = layout.Take(S * gu_scale_bytes);
  const size_t dn_scales_at = layout.Take(S * dn_scale_bytes);
  // One part (S = 1): the shared gate_up is already the part's layout; more: each part's gate
  // and up rows copied next to each other. Down needs no copy: part p is columns p * inter .. of
  // the shared down, a view with row stride shared_inter (its descriptors encoded apart).
  const size_t gu_copy_at = S > 1 ? layout.Take(S * gu_bytes) : 0;
  void* storage = nullptr;
  if (cudaMalloc(&storage, layout.size()) != cudaSuccess) {
    cudaGetLastError();  // not sticky: the separate shared MLP runs instead
    return nullptr;
  }
  char* base = static_cast<char*>(storage);
  const uint8_t* sgu = static_cast<const uint8_t*>(a.shared_gate_up);
  const uint8_t* sdn = static_cast<const uint8_t*>(a.shared_down);
  const float* sgu_scales = a.shared_gate_up_fp8.scales;
  const float* sdn_scales = a.shared_down_fp8.scales;
  const int64_t sgu_ld = a.shared_gate_up_fp8.scale_ld, sdn_ld = a.shared_down_fp8.scale_ld;
  const int64_t sgu_split = a.shared_gate_up_fp8.split_rows;
  const int64_t blocks_i = I / kernels::kFp8BlockSize;
  std::vector<const uint8_t*> gu_weights, dn_weights, dn_part_weights;
  for (int32_t e = 0; e < E; ++e) {
    gu_weights.push_back(static_cast<const uint8_t*>(a.gate_up_host[e]));
    dn_weights.push_back(static_cast<const uint8_t*>(a.down_host[e]));
  }
  std::vector<const float*> gu_part_scales, dn_part_scales;
  cudaError_t err = cudaMemsetAsync(base + gu_scales_at, 0, S * gu_scale_bytes, stream_);
  if (err == cudaSuccess) {
    err = cudaMemsetAsync(base + dn_scales_at, 0, S * dn_scale_bytes, stream_);
  }
  for (int32_t p = 0; p < S && err == cudaSuccess; ++p) {
    const int64_t gate_row = p * I, up_row = SI + p * I;  // of the shared gate_up
    uint8_t* gu = reinterpret_cast<uint8_t*>(base + gu_copy_at + p * gu_bytes);
    if (S > 1) {
      err = cudaMemcpyAsync(gu, sgu + gate_row * H, I * H, cudaMemcpyDeviceToDevice, stream_);
      if (err == cudaSuccess) {
        err =
            cudaMemcpyAsync(gu + I * H, sgu + up_row * H, I * H, cudaMemcpyDeviceToDevice, stream_);
      }
    }
    gu_weights.push_back(S > 1 ? gu : sgu);
    dn_part_weights.push_back(sdn + p * I);
    float* gs = reinterpret_cast<float*>(base + gu_scales_at + p * gu_scale_bytes);
    float* ds = reinterpret_cast<float*>(base + dn_scales_at + p * dn_scale_bytes);
    const size_t gu_cols = kernels::Fp8ScaleCols(H) * sizeof(float);
    const size_t gu_dpitch = a.gate_up_scale_ld * sizeof(float), gu_spitch = sgu_ld * sizeof(float);
    if (err == cudaSuccess) {
      err = cudaMemcpy2DAsync(gs, gu_dpitch,
                              sgu_scales + kernels::Fp8ScaleRow(gate_row, sgu_split) * sgu_ld,
                              gu_spitch, gu_cols, blocks_i, cudaMemcpyDeviceToDevice, stream_);
    }
    if (err == cudaSuccess) {
      err = cudaMemcpy2DAsync(gs + blocks_i * a.gate_up_scale_ld, gu_dpitch,
                              sgu_scales + kernels::Fp8ScaleRow(up_row, sgu_split) * sgu_ld,
                              gu_spitch, gu_cols, blocks_i, cudaMemcpyDeviceToDevice, stream_);
    }
    if (err == cudaSuccess) {
      err = cudaMemcpy2DAsync(ds, a.down_scale_ld * sizeof(float), sdn_scales + p * blocks_i,
                              sdn_ld * sizeof(float), blocks_i * sizeof(float), dn_scale_rows,
                              cudaMemcpyDeviceToDevice, stream_);
    }
    gu_part_scales.push_back(gs);
    dn_part_scales.push_back(ds);
  }
  // The scale tables: the routed experts' (device to device), then the parts'.
  const float** gu_table = reinterpret_cast<const float**>(base + gu_table_at);
  const float** dn_table = reinterpret_cast<const float**>(base + dn_table_at);
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(gu_table, a.gate_up_scales, E * sizeof(const float*),
                          cudaMemcpyDeviceToDevice, stream_);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(dn_table, a.down_scales, E * sizeof(const float*),
                          cudaMemcpyDeviceToDevice, stream_);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(gu_table + E, gu_part_scales.data(), S * sizeof(const float*),
                          cudaMemcpyHostToDevice, stream_);
  }
  if (err == cudaSuccess) {
    err = cudaMemcpyAsync(dn_table + E, dn_part_scales.data(), S * sizeof(const float*),
                          cudaMemcpyHostToDevice, stream_);
  }
  if (err == cudaSuccess) {
    err = kernels::Fp8WgmmaSwapBuildWeightMaps(E + S, gu_weights.data(), 2 * I, H, H,
                                               base + gu_maps_at, stream_);
  }
  if (err == cudaSuccess) {
    err = kernels::Fp8WgmmaSwapBuildWeightMaps(E, dn_weights.data(), H, I, I, base + dn_maps_at,
                                               stream_);
  }
  if (err == cudaSuccess) {
    err = kernels::Fp8WgmmaSwapBuildWeightMaps(
        S, dn_part_weights.data(), H, I, SI,
        base + dn_maps_at + kernels::Fp8WgmmaSwapWeightMapsBytes(E), stream_);
  }
  // The host arrays above are read by the copies: wait for them. A failure leaves the shared
  // groups unbuilt (retried at the next call) and the separate shared MLP to run.
  const cudaError_t synced = cudaStreamSynchronize(stream_);
  if (err == cudaSuccess) err = synced;
  if (err != cudaSuccess) {
    cudaGetLastError();
    cudaFree(storage);
    return nullptr;
  }
  built.built_from = std::move(from);
  built.storage = storage;
  Fp8SwapGroups& g = built.groups;
  g.num_groups = E + S;
  g.shared_parts = S;
  g.gate_up_maps = base + gu_maps_at;
  g.down_maps = base + dn_maps_at;
  g.gate_up_scales = gu_table;
  g.down_scales = dn_table;
  return &g;
}

bool CudaBackend::RoutedAndSharedExpertsFp8Swap(const RoutedExpertsArgs& a) {
  const int64_t T = a.num_tokens, K = a.top_k, H = a.hidden_size, I = a.inter;
  const int64_t SI = a.shared_inter;
  const int32_t E = a.num_experts;
  if (T < 1 || K < 1 || E < 1 || H <= 0 || I <= 0 || SI <= 0 || SI % I != 0 ||
      a.swiglu_limit > 0.0f ||  // V4's clamp: its experts are never kept FP8
      a.gate_up_host == nullptr || a.down_host == nullptr || a.gate_up_scales == nullptr ||
      a.down_scales == nullptr || a.gate_up_scale_ld < kernels::Fp8ScaleCols(H) ||
      a.down_scale_ld < kernels::Fp8ScaleCols(I) || a.shared_gate_up == nullptr ||
      a.shared_down == nullptr || !Aligned16(a.shared_gate_up) || !Aligned16(a.shared_down) ||
      a.shared_gate_up_fp8.scales == nullptr || a.shared_down_fp8.scales == nullptr ||
      a.shared_gate_up_fp8.scale_ld < kernels::Fp8ScaleCols(H) ||
      a.shared_down_fp8.scale_ld < kernels::Fp8ScaleCols(SI) ||
      (a.shared_gate_up_fp8.split_rows != 0 && a.shared_gate_up_fp8.split_rows != SI) ||
      a.shared_down_fp8.split_rows != 0) {
    return false;
  }
  const int64_t S = SI / I;
  if (K + S > 32 || E + S > kernels::kMaxMoeSlots) return false;
  // Where RoutedExperts takes the swap kernel: its device path (up to kMaxFusedMoeTokens tokens,
  // any count while captured) on the tensor-core kernels.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  Check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
  if ((T > kMaxFusedMoeTokens && capture == cudaStreamCaptureStatusNone) || H % 16 != 0 ||
      I % 16 != 0 || !kernels::Fp8MmaGemmAvailable()) {
    return false;
  }
  const int64_t rows = T * (K + S);
  if (!FitsInt(rows * std::max(H, 2 * I)) || !Fp8SwapTakes(a, static_cast<int32_t>(E + S))) {
    return false;
  }
  const Fp8SwapGroups* g = Fp8SwapSharedGroups(a);
  if (g == nullptr) return false;
  OpTimer timer(this, "RoutedAndSharedExpertsFp8Swap");
  RunFp8SwapGroups(a, rows, *g, "RoutedAndSharedExpertsFp8Swap/wgmma-swap");
  return true;
}

}  // namespace deepinfer
