// `deepinfer-admin memory-plan`: the per-GPU memory plan of a full-size model from its config.
#include "tools/admin/memory_plan_command.h"

#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "worker/kv_cache/kv_block_pool.h"
#include "worker/model/decode_graph_runner.h"
#include "worker/model/model_config.h"
#include "worker/model/model_registry.h"

namespace deepinfer {
namespace {

constexpr char kPrefix[] = "deepinfer-admin memory-plan: ";

double GiB(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0); }

DeviceMemoryInfo Device(int64_t total, int64_t free) {
  DeviceMemoryInfo d;
  d.total_bytes = static_cast<size_t>(total);
  d.free_bytes = static_cast<size_t>(std::max<int64_t>(free, 0));
  return d;
}

// "dummy:CONFIG[@seed]" -> CONFIG; a directory -> DIR/config.json; else the path itself.
std::string ConfigPath(const std::string& model) {
  if (absl::StartsWith(model, "dummy:")) {
    std::string path = model.substr(6);
    const size_t at = path.rfind('@');
    if (at != std::string::npos) path.resize(at);
    return path;
  }
  if (!absl::EndsWith(model, ".json")) return model + "/config.json";
  return model;
}

}  // namespace

absl::StatusOr<GpuMemoryReport> PlanGpuMemory(const std::string& config_json,
                                              const std::string& source,
                                              const MemoryPlanCommandConfig& config) {
  absl::StatusOr<WeightPrecision> precision = ParseWeightPrecision(config.precision);
  if (!precision.ok()) return precision.status();
  absl::StatusOr<Fp8ScaleFormat> scale_format = ParseFp8ScaleFormat(config.fp8_scale);
  if (!scale_format.ok()) return scale_format.status();
  absl::StatusOr<WeightDType> kv_dtype =
      ResolveKvCacheDType(config.kv_cache_dtype, WeightDType::kBFloat16);
  if (!kv_dtype.ok()) return kv_dtype.status();
  if (config.num_gpus < 1 || config.gpu_memory_mib < 1 || config.block_size < 1 ||
      config.max_batch_tokens < 1 || config.max_running < 1 || config.cuda_graph_max_batch < 0) {
    return absl::InvalidArgumentError(
        "--num-gpus, --gpu-memory-mib, --block-size, --max-batch-tokens and --max-running must "
        "be positive, --cuda-graph-max-batch non-negative");
  }
  absl::StatusOr<WeightInventory> inventory =
      InventoryFromConfigJson(config_json, source, config.mtp);
  if (!inventory.ok()) return inventory.status();
  absl::StatusOr<WeightInventory> without_mtp =
      InventoryFromConfigJson(config_json, source, /*include_mtp=*/false);
  if (!without_mtp.ok()) return without_mtp.status();

  GpuMemoryReport r;
  r.architecture = inventory->architecture;
  r.parameters = inventory->parameters();
  r.mtp_parameters = r.parameters - without_mtp->parameters();
  r.num_gpus = config.num_gpus;
  r.experts_per_gpu = (inventory->routed_experts + config.num_gpus - 1) / config.num_gpus;
  r.total_bytes = config.gpu_memory_mib << 20;
  r.utilization = config.gpu_memory_utilization;
  r.weights = PerGpuWeightBytes(*inventory, config.num_gpus, *precision, *scale_format);

  // The cache and the activation reserve as the model states them (its registry entry): bytes
  // per token of the paged entries and, for V4, the per-sequence state of max_running slots.
  absl::StatusOr<ModelConfig> model_config = ModelConfig::FromJson(config_json, source);
  if (!model_config.ok()) return model_config.status();
  absl::StatusOr<const Architecture*> arch = FindArchitecture(*model_config);
  if (!arch.ok()) return arch.status();
  const int64_t floats_per_token = (*arch)->activation_floats_per_token(*model_config);
  absl::StatusOr<KvCacheSpec> typed_spec =
      (*arch)->cache_spec(*model_config, *kv_dtype).WithDType(*kv_dtype);
  if (!typed_spec.ok()) return typed_spec.status();
  const KvCacheSpec spec = *std::move(typed_spec);
  r.kv_bytes_per_token = spec.BytesPerToken();
  r.cache_state_bytes = spec.StateBytesPerSequence() * config.max_running;
  r.activation_reserve_bytes =
      ActivationReserveBytes(floats_per_token, static_cast<int32_t>(config.max_batch_tokens));
  // The CUDA backend keeps the checkpoint's FP8 matrices with --dtype auto and mxfp4, the routed
  // experts MXFP4 with --dtype mxfp4 (KeepsCheckpointFp8, KeepsExpertsMxfp4).
  const bool mxfp4 = *precision == WeightPrecision::kMxfp4Experts;
  r.dequant_scratch = DequantScratchOf(*model_config, **arch,
                                       /*keep_fp8=*/*precision != WeightPrecision::kBf16, mxfp4);
  if (mxfp4 && config.num_gpus > 1) {
    r.engine_refuses = absl::StrFormat(
        "the engine refuses --dtype mxfp4 on more than one GPU today: it runs MXFP4 routed "
        "experts on one rank hosting every expert, so this plan for %d GPUs is arithmetic only",
        config.num_gpus);
  }
  if (config.cuda_graph_max_batch > 0) {
    r.graph_bytes =
        DecodeGraphReserveBytes(floats_per_token, DecodeGraphBuckets(config.cuda_graph_max_batch));
  }

  MemoryPlanOptions options;
  options.utilization = config.gpu_memory_utilization;
  options.block_size = static_cast<int32_t>(config.block_size);
  options.max_batch_tokens = static_cast<int32_t>(config.max_batch_tokens);
  const int64_t weight_bytes = r.weights.total();
  const int64_t reserve =
      r.activation_reserve_bytes + r.dequant_scratch.total() + r.graph_bytes + r.cache_state_bytes;
  // The rank builder's two checks (CheckWeightsFit before loading, PlanKvCache after), with
  // the terms of this report in the message.
  const int64_t budget = static_cast<int64_t>(r.utilization * static_cast<double>(r.total_bytes));
  const std::string terms = absl::StrFormat(
      "weights %.2f GiB + scales %.2f GiB + activation reserve %.2f GiB + dequant scratch %.2f "
      "GiB + decode graphs %.2f GiB + cache state %.2f GiB",
      GiB(r.weights.weights), GiB(r.weights.scales), GiB(r.activation_reserve_bytes),
      GiB(r.dequant_scratch.total()), GiB(r.graph_bytes), GiB(r.cache_state_bytes));
  absl::Status fit =
      CheckWeightsFit(Device(r.total_bytes, r.total_bytes), weight_bytes, reserve, options);
  if (fit.code() == absl::StatusCode::kInvalidArgument) return fit;
  if (!fit.ok()) {
    r.error = absl::StrFormat(
        "%s = %.2f GiB, more than the %.2f GiB --gpu-memory-utilization "
        "%.2f leaves of each GPU",
        terms, GiB(weight_bytes + reserve), GiB(budget), r.utilization);
    return r;
  }
  absl::StatusOr<KvCachePlan> kv =
      PlanKvCache(Device(r.total_bytes, r.total_bytes - weight_bytes), weight_bytes, reserve,
                  r.kv_bytes_per_token, options);
  if (kv.status().code() == absl::StatusCode::kInvalidArgument) return kv.status();
  if (!kv.ok()) {
    r.error = absl::StrFormat(
        "%s leave %.2f GiB of %.2f GiB, less than two KV cache blocks of %d tokens", terms,
        GiB(budget - weight_bytes - reserve), GiB(budget), config.block_size);
    return r;
  }
  r.kv = *kv;
  return r;
}

std::string FormatGpuMemoryReport(const GpuMemoryReport& r, const MemoryPlanCommandConfig& c) {
  std::string out = absl::StrFormat("%s: %.2f B parameters", r.architecture, r.parameters / 1e9);
  if (r.mtp_parameters > 0) {
    absl::StrAppendFormat(&out, " (%.2f B in MTP layers)", r.mtp_parameters / 1e9);
  }
  std::string precision = c.precision;
  if (c.precision != "bf16") {
    absl::StrAppend(&precision, " (F8_E4M3 projections, ",
                    c.fp8_scale == "ue8m0" ? "UE8M0" : "float32", " scales per 128x128 block",
                    c.precision == "mxfp4" ? "; routed experts MXFP4, E8M0 scale per 32" : "", ")");
  }
  absl::StrAppendFormat(
      &out,
      "\n%d GPU%s x %.2f GiB (%d MiB), --gpu-memory-utilization %.2f: %.2f GiB per GPU\n"
      "weights %s; routed experts per MoE layer per GPU: %d; KV cache %s\n\n",
      r.num_gpus, r.num_gpus == 1 ? "" : "s", GiB(r.total_bytes), c.gpu_memory_mib, r.utilization,
      GiB(static_cast<int64_t>(r.utilization * r.total_bytes)), precision, r.experts_per_gpu,
      c.kv_cache_dtype);
  auto row = [&](const char* what, int64_t bytes, const std::string& note) {
    absl::StrAppendFormat(&out, "  %-22s %9.2f GiB%s%s\n", what, GiB(bytes),
                          note.empty() ? "" : "  ", note);
  };
  absl::StrAppend(&out, "per GPU\n");
  row("weights", r.weights.weights,
      absl::StrFormat("(%.2f B parameters on this GPU)", r.weights.parameters / 1e9));
  row("scales", r.weights.scales, "");
  row("activation reserve", r.activation_reserve_bytes,
      absl::StrFormat("(--max-batch-tokens %d)", c.max_batch_tokens));
  if (r.dequant_scratch.total() > 0) {
    std::string parts;
    if (r.dequant_scratch.fp8_bytes > 0) {
      absl::StrAppendFormat(&parts, "largest FP8 matrix as bf16 %.2f GiB",
                            GiB(r.dequant_scratch.fp8_bytes));
    }
    if (r.dequant_scratch.mxfp4_bytes > 0) {
      absl::StrAppendFormat(&parts, "%sa group of MXFP4 experts as bf16 %.2f GiB",
                            parts.empty() ? "" : ", ", GiB(r.dequant_scratch.mxfp4_bytes));
    }
    if (r.dequant_scratch.shared_expert_copy_bytes > 0) {
      absl::StrAppendFormat(&parts, "%sFP8 shared experts' parts %.2f GiB",
                            parts.empty() ? "" : ", ",
                            GiB(r.dequant_scratch.shared_expert_copy_bytes));
    }
    row("dequant scratch", r.dequant_scratch.total(), absl::StrCat("(", parts, ")"));
  }
  row("decode graph memory", r.graph_bytes,
      c.cuda_graph_max_batch > 0
          ? absl::StrFormat("(buckets up to batch %d)", c.cuda_graph_max_batch)
          : std::string("(no decode graphs)"));
  if (r.cache_state_bytes > 0) {
    row("cache state", r.cache_state_bytes,
        absl::StrFormat("(sliding windows and open compressor windows of %d sequences)",
                        c.max_running));
  }
  const std::string refuses =
      r.engine_refuses.empty() ? "" : absl::StrCat("\nnote: ", r.engine_refuses, "\n");
  if (!r.fits()) {
    absl::StrAppend(&out, "\ndoes not fit: ", r.error, "\n", refuses);
    return out;
  }
  const int64_t used = r.weights.total() + r.activation_reserve_bytes + r.dequant_scratch.total() +
                       r.graph_bytes + r.cache_state_bytes + r.kv.kv_bytes();
  row("KV cache", r.kv.kv_bytes(),
      absl::StrFormat("(%d blocks x %d = %d tokens, %d bytes per token)", r.kv.num_blocks,
                      r.kv.block_size, r.kv_tokens(), r.kv_bytes_per_token));
  row("total", used,
      absl::StrFormat("of %.2f GiB", GiB(static_cast<int64_t>(r.utilization * r.total_bytes))));
  absl::StrAppendFormat(&out, "\nfits: KV cache %d tokens per GPU, %d over %d GPU%s\n",
                        r.kv_tokens(), r.kv_tokens() * r.num_gpus, r.num_gpus,
                        r.num_gpus == 1 ? "" : "s");
  absl::StrAppend(&out, refuses);
  return out;
}

int RunMemoryPlanCommand(const MemoryPlanCommandConfig& config, std::ostream& out,
                         std::ostream& err) {
  const std::string path = ConfigPath(config.model);
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    err << kPrefix << "cannot read " << path << "\n";
    return 1;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<GpuMemoryReport> report = PlanGpuMemory(ss.str(), path, config);
  if (!report.ok()) {
    err << kPrefix << report.status().message() << "\n";
    return absl::StrContains(report.status().message(), path) ? 1 : 2;
  }
  out << FormatGpuMemoryReport(*report, config);
  return report->fits() ? 0 : 3;
}

}  // namespace deepinfer
