// MemoryPlan arithmetic.
#include "worker/engine/memory_plan.h"

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace deepinfer {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int64_t kFixedReserveBytes = int64_t{256} << 20;

// GiB with two decimals; small amounts (test models) in MiB so they do not read as zero, whole
// models of hundreds of billions of parameters in TiB.
std::string GiB(int64_t bytes) {
  if (bytes != 0 && std::abs(bytes) < (int64_t{1} << 30)) {
    return absl::StrFormat("%.1f MiB", bytes / (1024.0 * 1024.0));
  }
  if (std::abs(bytes) >= (int64_t{1} << 40))
    return absl::StrFormat("%.2f TiB", bytes / kGiB / 1024);
  return absl::StrFormat("%.2f GiB", bytes / kGiB);
}

absl::Status CheckUtilization(double utilization) {
  if (!(utilization > 0.0 && utilization <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--gpu-memory-utilization must be in (0, 1], not ", utilization));
  }
  return absl::OkStatus();
}

// utilization * total - in use: what this rank may still take.
int64_t Available(const DeviceMemoryInfo& info, double utilization) {
  const int64_t in_use = static_cast<int64_t>(info.total_bytes - info.free_bytes);
  return static_cast<int64_t>(utilization * static_cast<double>(info.total_bytes)) - in_use;
}

}  // namespace

int64_t ActivationReserveBytes(int64_t floats_per_token, int32_t max_batch_tokens) {
  return 2 * floats_per_token * static_cast<int64_t>(sizeof(float)) * max_batch_tokens +
         kFixedReserveBytes;
}

int64_t DecodeGraphReserveBytes(int64_t floats_per_token, const std::vector<int64_t>& buckets) {
  int64_t bytes = 0;
  for (int64_t b : buckets) {
    bytes +=
        (ActivationReserveBytes(floats_per_token, static_cast<int32_t>(b)) - kFixedReserveBytes) /
        2;
  }
  return bytes;
}

absl::Status CheckWeightsFit(const DeviceMemoryInfo& before_load, int64_t weight_bytes,
                             int64_t reserve_bytes, const MemoryPlanOptions& options) {
  if (absl::Status st = CheckUtilization(options.utilization); !st.ok()) return st;
  const int64_t available = Available(before_load, options.utilization);
  if (weight_bytes + reserve_bytes <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "the weights do not fit on the GPU: they need ", GiB(weight_bytes), " plus an activation ",
      "reserve of ", GiB(reserve_bytes), " (--max-batch-tokens ", options.max_batch_tokens,
      "), but --gpu-memory-utilization ", options.utilization, " of ", GiB(before_load.total_bytes),
      " with ", GiB(before_load.total_bytes - before_load.free_bytes), " already in use leaves ",
      GiB(std::max<int64_t>(available, 0)),
      "; use more GPUs (expert parallelism), bf16 weights (--dtype bfloat16), or a smaller model"));
}

int64_t KvCachePlan::tokens() const { return static_cast<int64_t>(num_blocks) * block_size; }

std::string KvCachePlan::ToString(double utilization) const {
  return absl::StrFormat(
      "weights %s, KV cache %d blocks x %d = %d tokens (%s), activation reserve %s, in use after "
      "loading %s of %s, utilization %.2f",
      GiB(weight_bytes), num_blocks, block_size, tokens(), GiB(kv_bytes()), GiB(reserve_bytes),
      GiB(in_use_bytes), GiB(total_bytes), utilization);
}

absl::StatusOr<KvCachePlan> PlanKvCache(const DeviceMemoryInfo& after_load, int64_t weight_bytes,
                                        int64_t reserve_bytes, int64_t kv_bytes_per_token,
                                        const MemoryPlanOptions& options) {
  if (absl::Status st = CheckUtilization(options.utilization); !st.ok()) return st;
  if (options.block_size <= 0 || kv_bytes_per_token <= 0) {
    return absl::InvalidArgumentError("PlanKvCache: block size and KV bytes must be positive");
  }
  KvCachePlan plan;
  plan.total_bytes = static_cast<int64_t>(after_load.total_bytes);
  plan.in_use_bytes = static_cast<int64_t>(after_load.total_bytes - after_load.free_bytes);
  plan.weight_bytes = weight_bytes;
  plan.reserve_bytes = reserve_bytes;
  plan.kv_bytes_per_token = kv_bytes_per_token;
  plan.block_size = options.block_size;
  const int64_t kv_budget = Available(after_load, options.utilization) - reserve_bytes;
  const int64_t block_bytes = kv_bytes_per_token * options.block_size;
  const int64_t blocks = std::max<int64_t>(kv_budget, 0) / block_bytes;
  if (blocks < 2) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "no room for the KV cache: --gpu-memory-utilization ", options.utilization, " of ",
        GiB(plan.total_bytes), " minus ", GiB(plan.in_use_bytes), " in use after loading ",
        GiB(weight_bytes), " of weights, minus the activation reserve of ", GiB(reserve_bytes),
        " (--max-batch-tokens ", options.max_batch_tokens, ") leaves ",
        GiB(std::max<int64_t>(kv_budget, 0)), ", less than two KV blocks of ", GiB(block_bytes),
        "; raise --gpu-memory-utilization, lower --max-batch-tokens, or use more GPUs"));
  }
  plan.num_blocks =
      static_cast<int32_t>(std::min<int64_t>(blocks, std::numeric_limits<int32_t>::max()));
  return plan;
}

HostMemoryPlan PlanHostMemory(int num_ranks, WeightDType weight_dtype, int64_t weight_bytes,
                              WeightDType kv_cache_dtype, int64_t kv_bytes_per_token,
                              int64_t kv_cache_tokens) {
  HostMemoryPlan plan;
  plan.num_ranks = num_ranks;
  plan.weight_dtype = weight_dtype;
  plan.weight_bytes = weight_bytes;
  plan.kv_cache_dtype = kv_cache_dtype;
  plan.kv_cache_tokens = kv_cache_tokens;
  plan.kv_cache_bytes = num_ranks * kv_cache_tokens * kv_bytes_per_token;
  return plan;
}

std::string HostMemoryPlan::ToString() const {
  return absl::StrCat(num_ranks, num_ranks == 1 ? " rank" : " ranks", ": weights ",
                      GiB(weight_bytes), " (", WeightDTypeName(weight_dtype), ") + KV cache ",
                      kv_cache_tokens, " tokens per rank ", GiB(kv_cache_bytes), " (",
                      WeightDTypeName(kv_cache_dtype), ") = ", GiB(needed_bytes()), " of ",
                      GiB(available_bytes), " available");
}

absl::Status CheckHostMemoryFits(const HostMemoryPlan& plan) {
  if (plan.needed_bytes() <= plan.available_bytes) return absl::OkStatus();
  std::string advice;
  if (plan.weight_dtype != WeightDType::kBFloat16) {
    absl::StrAppend(&advice, "bf16 weights (--dtype bfloat16) halve the weights; ");
  }
  absl::StrAppend(&advice,
                  "more workers split the routed experts between them; --kv-cache-tokens sizes "
                  "the KV cache; or use a smaller model");
  return absl::ResourceExhaustedError(
      absl::StrCat("the model does not fit in this machine's memory: ", plan.ToString(), ", ",
                   GiB(plan.needed_bytes() - plan.available_bytes), " short; ", advice));
}

}  // namespace deepinfer
