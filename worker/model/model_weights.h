// ModelWeights: the DeepSeek-V3 weights one rank hosts, uploaded to a backend in the layouts the
// forward pass consumes. The matrices the GEMMs read (attention projections, W_uk / W_uv, dense
// and expert MLPs, lm_head) are stored in the backend's weight_dtype() (Backend::UploadWeight:
// fp32 or bf16; FP8 checkpoints are dequantised first); the embedding table, norms, the router
// and its bias stay fp32 (the router's top-k choice is sensitive to rounding). Layouts: gate and
// up projections fused as [gate; up], the key half of kv_b_proj pre-transposed per head for the
// absorbed attention. Which routed experts are loaded is the caller's choice
// (LoadOptions::hosts_expert), so an expert-parallel rank reads only its share of the checkpoint;
// the MTP modules (ModelConfig::num_draft_layers) hold every routed expert on every rank.
#ifndef DEEPINFER_WORKER_MODEL_MODEL_WEIGHTS_H_
#define DEEPINFER_WORKER_MODEL_MODEL_WEIGHTS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/model_config.h"
#include "worker/model/weight_source.h"

namespace deepinfer {

struct LoadOptions {
  // Whether this rank hosts routed expert `expert` of MoE layer `layer`. Unset: all of them.
  std::function<bool(int64_t layer, int64_t expert)> hosts_expert;
  // Whether the checkpoint tensor `name` (a projection or MLP weight) stays FP8 on the device
  // when the source stores it so (WeightSource::ReadFp8): `--dtype auto` on a backend that takes
  // FP8 matrices (CUDA). Unset: every matrix is converted to the backend's weight_dtype().
  // W_uk / W_uv (kv_b_proj) and lm_head are always converted: the absorbed attention reads
  // kv_b per head, and DeepSeek stores lm_head in bf16.
  std::function<bool(const std::string& name)> keep_fp8;
  // Routed experts (those of the decoder layers and of the MTP modules) kept in MXFP4 on the
  // device (e2m1 with a UE8M0 scale per 32 values, kernels/gemm/mxfp4_mma_gemm.h): `--dtype
  // mxfp4` on CUDA, where Backend::RoutedExperts runs them with one rank hosting every expert.
  // Where the checkpoint stores them MXFP4 with UE8M0 byte scales (WeightSource::ReadMxfp4) the
  // bytes and scales are kept as stored; otherwise their values are read as fp32 and quantised
  // on the host (worker/model/mxfp4_quantize.h). An expert's shared and the dense MLPs are not
  // affected.
  bool mxfp4_experts = false;
  // Checkpoint tensors are read and converted on this many threads (a thread per shard first),
  // staged within staging_bytes of host memory (page-locked on CUDA) and uploaded while the
  // threads go on (WeightUploader); 1: one tensor after the other; 0: the machine's hardware
  // threads, at most 8. The device bytes are the same either way, and so is the error of a
  // broken checkpoint (the first failing tensor's, in load order).
  int load_threads = 0;
  int64_t staging_bytes = int64_t{1} << 30;
};

// A matrix weight on the device: elements in ModelWeights::matrix_dtype, or FP8 e4m3 with one
// fp32 scale per 128 x 128 block (fp8_scales set; Backend's WeightView::fp8 describes the grid,
// split_rows where two checkpoint tensors were stacked), or (routed experts only) MXFP4 [rows,
// cols / 2] packed e2m1 with UE8M0 scales [rows, scale_ld = cols / 32] (mx_scales set; read only
// through Backend::RoutedExperts).
struct MatrixBuffer {
  std::unique_ptr<DeviceBuffer> data;
  std::unique_ptr<DeviceBuffer> fp8_scales;
  std::unique_ptr<DeviceBuffer> mx_scales;
  int64_t scale_ld = 0;
  int64_t split_rows = 0;

  MatrixBuffer() = default;
  // A matrix in matrix_dtype.
  MatrixBuffer(std::unique_ptr<DeviceBuffer> d) : data(std::move(d)) {}  // NOLINT
  DeviceBuffer* operator->() const { return data.get(); }
  bool fp8() const { return fp8_scales != nullptr; }
  bool mxfp4() const { return mx_scales != nullptr; }
  // Device bytes of the elements and the scales.
  size_t size_bytes() const {
    return (data ? data->size_bytes() : 0) + (fp8_scales ? fp8_scales->size_bytes() : 0) +
           (mx_scales ? mx_scales->size_bytes() : 0);
  }
};

// SwiGLU MLP: y = down(silu(gate x) * up x). gate_up is [2 * inter, hidden] (gate rows first).
// Buffers marked "matrix" hold ModelWeights::matrix_dtype elements (MatrixBuffer: or FP8); the
// others fp32.
struct MlpWeights {
  int64_t inter = 0;
  MatrixBuffer gate_up;  // matrix
  MatrixBuffer down;     // matrix [hidden, inter]
};

struct LayerWeights {
  std::unique_ptr<DeviceBuffer> input_norm, post_attention_norm;
  // MLA. With q_lora: q_a [q_lora, hidden], q_a_norm, q_b [heads*qk_head, q_lora]; else q
  // [heads*qk_head, hidden]; kv_a [kv_lora + rope, hidden] either way. Where the query's first
  // projection (q_a, else q) and kv_a stack (WeightLoader::Stacks) they are one matrix qkv_a
  // [q_lora (else heads*qk_head) + kv_lora + rope, hidden], the query part's rows first, so that
  // one GEMM makes each token's [qa (else q) | kv] row, and q_a / q and kv_a are empty. q_a, q_b,
  // q, kv_a, qkv_a are matrices.
  MatrixBuffer q_a, q_b, q;
  std::unique_ptr<DeviceBuffer> q_a_norm;
  MatrixBuffer kv_a;
  MatrixBuffer qkv_a;
  std::unique_ptr<DeviceBuffer> kv_a_norm;  // [kv_lora]
  std::unique_ptr<DeviceBuffer> kv_b;  // matrix [heads * (nope + v), kv_lora] as in the checkpoint
  std::unique_ptr<DeviceBuffer> w_uk_t;  // matrix [heads, kv_lora, nope]: key half, transposed
  MatrixBuffer o_proj;                   // matrix [hidden, heads * v]
  bool moe = false;
  MlpWeights dense;                           // dense layers
  std::unique_ptr<DeviceBuffer> router;       // [experts, hidden]
  std::unique_ptr<DeviceBuffer> router_bias;  // [experts] e_score_correction_bias
  MlpWeights shared;                          // n_shared_experts fused (inter = n * moe_inter)
  std::map<int64_t, MlpWeights> experts;      // hosted routed experts by global id
};

// One multi-token-prediction module's own tensors (model.layers.{num_hidden_layers + i}.*); its
// decoder layer is ModelWeights::layers[num_hidden_layers + i]. The token embedding and the
// output head are the main model's (DeepSeek-V3 shares them; the checkpoint's copies under the
// module, embed_tokens and shared_head.head, are not read).
struct MtpWeights {
  std::unique_ptr<DeviceBuffer> enorm, hnorm;  // [hidden] each
  std::unique_ptr<DeviceBuffer> eh_proj;    // matrix [hidden, 2 * hidden] on [enorm(e); hnorm(h)]
  std::unique_ptr<DeviceBuffer> head_norm;  // shared_head.norm [hidden]
};

class ModelWeights {
 public:
  // Matrices in backend->weight_dtype().
  static absl::StatusOr<std::unique_ptr<ModelWeights>> Load(const ModelConfig& config,
                                                            WeightSource* source, Backend* backend,
                                                            const LoadOptions& options);
  // The bytes Load will allocate for this config, matrix dtype and expert selection, computed
  // from the shapes alone (so memory can be planned before anything is read or allocated).
  // Matrices options.keep_fp8 names count one byte an element plus their block scales; with
  // options.mxfp4_experts, routed experts half a byte an element plus a byte per 32.
  static int64_t DeviceBytes(const ModelConfig& config, WeightDType matrix_dtype,
                             const LoadOptions& options);

  // The scratch a backend that keeps FP8 matrices needs to dequantise one for a prefill GEMM
  // (CUDA: the largest projection or MLP matrix as bf16; the FP8 GEMMs dequantise one matrix at a
  // time); 0 when options.keep_fp8 is unset. An upper bound: every such matrix is counted whether
  // or not the checkpoint stores it FP8.
  static int64_t Fp8DequantScratchBytes(const ModelConfig& config, const LoadOptions& options);

  // Routed experts only, for a live EPLB placement change: per MoE layer (0 = the first MoE
  // layer), the experts listed in `experts[moe_layer]`. The source's errors as they are.
  static absl::StatusOr<std::vector<std::map<int64_t, MlpWeights>>> LoadRoutedExperts(
      const ModelConfig& config, WeightSource* source, Backend* backend,
      const std::vector<std::vector<int64_t>>& experts);

  // The same in two halves: ReadRoutedExperts reads and converts on the host (no backend, so
  // any thread may run it while the rank keeps stepping); UploadRoutedExperts copies the result
  // to the backend (on the thread that owns the backend).
  struct HostMlp {
    int64_t inter = 0;
    std::vector<float> gate_up;  // [2 * inter, hidden]
    std::vector<float> down;     // [hidden, inter]
  };
  using HostExperts = std::vector<std::map<int64_t, HostMlp>>;
  static absl::StatusOr<HostExperts> ReadRoutedExperts(
      const ModelConfig& config, WeightSource* source,
      const std::vector<std::vector<int64_t>>& experts);
  static std::vector<std::map<int64_t, MlpWeights>> UploadRoutedExperts(const HostExperts& host,
                                                                        Backend* backend);

  // A matrix buffer as a GEMM operand.
  WeightView Matrix(const std::unique_ptr<DeviceBuffer>& buf) const {
    return WeightView(buf->data(), matrix_dtype);
  }
  WeightView Matrix(const MatrixBuffer& m) const {
    if (!m.fp8()) return WeightView(m.data->data(), matrix_dtype);
    return WeightView(m.data->data(),
                      Fp8BlockScales{m.fp8_scales->as<float>(), m.scale_ld, m.split_rows});
  }

  WeightDType matrix_dtype = WeightDType::kFloat32;
  int64_t device_bytes = 0;             // what Load allocated (buffer sizes)
  std::unique_ptr<DeviceBuffer> embed;  // [vocab, hidden]
  std::unique_ptr<DeviceBuffer> final_norm;
  std::unique_ptr<DeviceBuffer> lm_head;  // matrix [vocab, hidden]
  // The decoder layers, then config.num_draft_layers MTP modules' decoder layers.
  std::vector<LayerWeights> layers;
  std::vector<MtpWeights> mtp;  // config.num_draft_layers
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_MODEL_WEIGHTS_H_
