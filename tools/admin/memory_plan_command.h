// `deepinfer-admin memory-plan`: what one GPU of a group would hold for a full-size model,
// without loading anything: weights and block scales counted from the config's parameter
// shapes (worker/engine/weight_inventory.h) in a chosen precision, the activation reserve,
// dequantisation scratch and decode-graph memory as the rank builder sizes them (memory_plan.h,
// dequant_scratch.h), and the KV cache that --gpu-memory-utilization leaves (PlanKvCache). The
// flags live in tools/admin/main.cc; this is the logic behind them.
#ifndef DEEPINFER_TOOLS_ADMIN_MEMORY_PLAN_COMMAND_H_
#define DEEPINFER_TOOLS_ADMIN_MEMORY_PLAN_COMMAND_H_

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/status/statusor.h"
#include "worker/engine/dequant_scratch.h"
#include "worker/engine/memory_plan.h"
#include "worker/engine/weight_inventory.h"

namespace deepinfer {

struct MemoryPlanCommandConfig {
  std::string model;  // "dummy:CONFIG.json[@seed]" or a checkpoint directory / config.json
  int64_t num_gpus = 1;
  int64_t gpu_memory_mib = 143771;  // an H200 as nvidia-smi reports it
  double gpu_memory_utilization = 0.9;
  std::string precision = "fp8";  // bf16, fp8, mxfp4
  std::string fp8_scale = "f32";  // f32, ue8m0
  std::string kv_cache_dtype = "bfloat16";
  int64_t block_size = 16;
  int64_t max_batch_tokens = 2048;
  int64_t max_running = 256;           // sequences whose fixed cache state is held (V4)
  int64_t cuda_graph_max_batch = 256;  // 0: no decode graphs
  bool mtp = true;                     // count the MTP layers' weights
};

// Every term of one GPU's plan.
struct GpuMemoryReport {
  std::string architecture;
  int64_t parameters = 0;      // the whole model (with MTP when counted)
  int64_t mtp_parameters = 0;  // of which in MTP layers
  int64_t num_gpus = 0;
  int64_t experts_per_gpu = 0;  // routed experts per MoE layer on the fullest GPU
  int64_t total_bytes = 0;
  double utilization = 0;
  WeightBytes weights;  // this GPU's
  int64_t activation_reserve_bytes = 0;
  // FP8 matrices / MXFP4 experts widened to bf16 (DequantScratchOf with the precision's options,
  // as the CUDA backend's --dtype of the same name sets them).
  DequantScratch dequant_scratch;
  int64_t graph_bytes = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t cache_state_bytes = 0;  // fixed per-sequence cache state x max_running
  KvCachePlan kv;                 // num_blocks 0 when nothing fits
  std::string error;              // why it does not fit; empty when it does
  // Why the engine refuses this configuration today whatever the arithmetic says; empty when
  // it runs it.
  std::string engine_refuses;

  bool fits() const { return error.empty(); }
  int64_t kv_tokens() const { return kv.tokens(); }
};

// The report for config.json text (`source` names it in errors). INVALID_ARGUMENT for a bad
// config or flag; a model that does not fit is a report with `error` set.
absl::StatusOr<GpuMemoryReport> PlanGpuMemory(const std::string& config_json,
                                              const std::string& source,
                                              const MemoryPlanCommandConfig& config);

// The report as the command prints it.
std::string FormatGpuMemoryReport(const GpuMemoryReport& report,
                                  const MemoryPlanCommandConfig& config);

// Returns the exit code: 0 when the model fits (the report says when the engine refuses the
// configuration anyway: GpuMemoryReport::engine_refuses), 1 when a file cannot be read or the
// config is bad, 2 for a bad flag value, 3 when it does not fit (the report says which term).
int RunMemoryPlanCommand(const MemoryPlanCommandConfig& config, std::ostream& out,
                         std::ostream& err);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_ADMIN_MEMORY_PLAN_COMMAND_H_
