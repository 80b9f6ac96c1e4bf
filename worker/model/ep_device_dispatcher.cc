// EpDeviceDispatcher: the device exchange behind the ExpertDispatcher interface.
#include "worker/model/ep_device_dispatcher.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/model/ep_expert_dispatcher.h"

namespace deepinfer {
namespace {

absl::Status CudaStatus(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("EpDeviceDispatcher: ", what, ": ", cudaGetErrorName(e),
                                          ": ", cudaGetErrorString(e)));
}

std::string ErrorWordText(int32_t word) {
  std::string out;
  auto add = [&out](const char* s) { absl::StrAppend(&out, out.empty() ? "" : "; ", s); };
  if (word & kernels::kEpErrorOverflow) {
    add("rows beyond a receiver's capacity were dropped (raise the exchange's capacity)");
  }
  if (word & kernels::kEpErrorTimeout) add("a peer did not signal within the exchange timeout");
  if (word & kernels::kEpErrorBadId) add("a token was routed to an expert id out of range");
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<EpDeviceDispatcher>> EpDeviceDispatcher::Create(
    comm::Communicator* comm, Backend* backend, int64_t num_experts, int64_t hidden_size,
    const EpDeviceOptions& options, std::shared_ptr<const ExpertPlacement> placement) {
  if (comm == nullptr || backend == nullptr || backend->native_stream() == nullptr) {
    return absl::InvalidArgumentError(
        "EpDeviceDispatcher: needs a communicator and a backend with a stream");
  }
  const int world = comm->world_size();
  if (num_experts <= 0 || num_experts % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat("expert parallelism: ", num_experts,
                                                   " routed experts do not divide over ", world,
                                                   " ranks"));
  }
  std::unique_ptr<EpDeviceDispatcher> d(
      new EpDeviceDispatcher(comm, backend, num_experts, hidden_size, options));
  if (placement != nullptr) {
    if (absl::Status st = d->SetPlacement(std::move(placement)); !st.ok()) return st;
  }
  // Slots per rank: the placement's (EPLB redundant slots), else E / W; the window is sized for
  // the larger of the two so that a later placement switch fits.
  kernels::EpExchangeConfig& cfg = d->cfg_;
  cfg.world = world;
  cfg.slots_per_rank = static_cast<int32_t>(num_experts / world);
  if (d->placement_ != nullptr) {
    cfg.slots_per_rank =
        std::max<int32_t>(cfg.slots_per_rank, d->placement_->num_physical() / world);
  }
  cfg.top_k = options.top_k;
  cfg.max_tokens = options.max_tokens;
  cfg.hidden = static_cast<int32_t>(hidden_size);
  const int64_t pairs = int64_t{options.max_tokens} * options.top_k;
  cfg.ll_capacity = options.ll_capacity > 0 ? options.ll_capacity : static_cast<int32_t>(pairs);
  cfg.tp_capacity =
      options.tp_capacity > 0 ? options.tp_capacity : static_cast<int32_t>(pairs * world);
  if (options.mode == kernels::EpMode::kThroughput && options.ll_capacity <= 0) {
    cfg.ll_capacity = 1;  // the low-latency region is not used
  }
  if (options.mode == kernels::EpMode::kLowLatency && options.tp_capacity <= 0) {
    cfg.tp_capacity = 1;
  }
  const char* why = nullptr;
  if (!kernels::EpConfigValid(cfg, &why)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "EpDeviceDispatcher: ", why, " (", world, " ranks, ", cfg.slots_per_rank,
        " slots each, top-", cfg.top_k, ", ", cfg.max_tokens, " tokens, hidden ", cfg.hidden, ")"));
  }
  d->layout_ = kernels::EpLayoutOf(cfg);
  absl::StatusOr<comm::SymmetricWindow> window =
      comm->RegisterSymmetricWindow(static_cast<size_t>(d->layout_.window_bytes));
  if (!window.ok()) return window.status();
  if (static_cast<int>(window->peers.size()) != world) {
    return absl::InternalError("EpDeviceDispatcher: the window does not map every rank");
  }
  d->window_ = std::move(*window);
  d->scratch_ = backend->Allocate(d->layout_.scratch_bytes);
  d->view_.rank = comm->rank();
  for (int r = 0; r < world; ++r) d->view_.window[r] = static_cast<char*>(d->window_.peers[r]);
  d->view_.scratch = static_cast<char*>(d->scratch_->data());
  d->topk_slots_ = backend->Allocate(std::max<int64_t>(1, pairs) * sizeof(int32_t));
  // Without a placement in a window sized for more slots per rank than E / W: expert e sits in
  // slot e % (E / W) of rank e / (E / W).
  const int64_t experts_per_rank = num_experts / world;
  if (cfg.slots_per_rank != experts_per_rank) {
    std::vector<int32_t> table(2 * num_experts + 1);
    for (int64_t e = 0; e <= num_experts; ++e) table[e] = static_cast<int32_t>(e);
    for (int64_t e = 0; e < num_experts; ++e) {
      table[num_experts + 1 + e] =
          static_cast<int32_t>(e / experts_per_rank * cfg.slots_per_rank + e % experts_per_rank);
    }
    d->contiguous_table_ = backend->Allocate(table.size() * sizeof(int32_t));
    backend->CopyToDevice(table.data(), table.size() * sizeof(int32_t),
                          d->contiguous_table_->data());
  }
  d->row_slot_ = backend->Allocate(d->layout_.max_received * sizeof(int32_t));
  d->expert_out_ = backend->Allocate(d->layout_.max_received * hidden_size * sizeof(float));
  // The window was zeroed before it was registered; the scratch is zeroed here. Peers may write
  // into this rank's window as soon as they start, which is after the registration.
  cudaStream_t stream = static_cast<cudaStream_t>(backend->native_stream());
  if (absl::Status st =
          CudaStatus("zeroing the scratch",
                     cudaMemsetAsync(d->scratch_->data(), 0, d->layout_.scratch_bytes, stream));
      !st.ok()) {
    return st;
  }
  backend->Synchronize();
  return d;
}

EpDeviceDispatcher::EpDeviceDispatcher(comm::Communicator* comm, Backend* backend,
                                       int64_t num_experts, int64_t hidden_size,
                                       const EpDeviceOptions& options)
    : comm_(comm),
      backend_(backend),
      num_experts_(num_experts),
      hidden_size_(hidden_size),
      options_(options) {
  const int64_t per = num_experts / comm->world_size();
  for (int64_t e = 0; e < per; ++e) contiguous_experts_.push_back(comm->rank() * per + e);
}

const std::vector<int64_t>& EpDeviceDispatcher::local_experts(int64_t moe_layer) const {
  if (placement_ == nullptr || moe_layer < 0 ||
      moe_layer >= static_cast<int64_t>(placed_experts_.size())) {
    return contiguous_experts_;
  }
  return placed_experts_[moe_layer];
}

absl::Status EpDeviceDispatcher::SetPlacement(std::shared_ptr<const ExpertPlacement> placement) {
  if (placement == nullptr) {
    placement_ = nullptr;
    placed_experts_.clear();
    replica_tables_.clear();
    return absl::OkStatus();
  }
  const int world = comm_->world_size();
  if (placement->num_logical() != num_experts_) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert placement has ", placement->num_logical(),
                     " logical experts but the model has ", num_experts_));
  }
  if (absl::Status st = placement->CheckGpuCount(world); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert placement does not fit this group: ", st.message()));
  }
  if (cfg_.slots_per_rank > 0 && placement->num_physical() / world > cfg_.slots_per_rank) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert placement has ", placement->num_physical() / world,
                     " slots per rank; the device exchange was sized for ", cfg_.slots_per_rank));
  }
  std::vector<std::unique_ptr<DeviceBuffer>> tables;
  for (int l = 0; l < placement->num_layers(); ++l) {
    std::vector<int32_t> table(num_experts_ + 1, 0);
    std::vector<int32_t> replicas;
    for (int64_t e = 0; e < num_experts_; ++e) {
      table[e] = static_cast<int32_t>(replicas.size());
      for (int p : placement->log2phy()[l][e]) {
        if (p >= 0) replicas.push_back(p);
      }
    }
    table[num_experts_] = static_cast<int32_t>(replicas.size());
    table.insert(table.end(), replicas.begin(), replicas.end());
    tables.push_back(backend_->Allocate(table.size() * sizeof(int32_t)));
    backend_->CopyToDevice(table.data(), table.size() * sizeof(int32_t), tables.back()->data());
  }
  placed_experts_ = EpExpertDispatcher::ExpertsOfRank(*placement, world, comm_->rank());
  placement_ = std::move(placement);
  replica_tables_ = std::move(tables);
  return absl::OkStatus();
}

absl::Status EpDeviceDispatcher::Fail(absl::Status error) {
  comm_->Abort(error);
  return error;
}

absl::Status EpDeviceDispatcher::CheckErrors() {
  int32_t word = 0;
  backend_->CopyToHost(kernels::EpErrorWord(cfg_, view_), sizeof(word), &word);
  if (absl::Status st = backend_->status(); !st.ok()) return Fail(st);
  if (word == 0) return absl::OkStatus();
  const std::string text = ErrorWordText(word);
  if (word & kernels::kEpErrorTimeout) {
    return Fail(absl::DeadlineExceededError(
        absl::StrCat("device expert exchange on rank ", comm_->rank(), ": ", text)));
  }
  return Fail(absl::FailedPreconditionError(
      absl::StrCat("device expert exchange on rank ", comm_->rank(), ": ", text)));
}

std::string EpDeviceDispatcher::Describe() const {
  const double mib = static_cast<double>(layout_.window_bytes + layout_.scratch_bytes) / 1048576.0;
  return absl::StrCat("device exchange (",
                      options_.mode == kernels::EpMode::kLowLatency ? "low latency" : "throughput",
                      ", NVLink windows, ", cfg_.world, " ranks, up to ", cfg_.max_tokens,
                      " tokens per rank, ", static_cast<int64_t>(mib), " MiB)");
}

absl::Status EpDeviceDispatcher::DispatchOnDevice(int64_t moe_layer, int64_t num_tokens,
                                                  const float* hidden, const int32_t* topk_ids) {
  if (num_tokens < 0 || num_tokens > cfg_.max_tokens) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("device expert exchange: ", num_tokens,
                                                        " tokens, more than the ", cfg_.max_tokens,
                                                        " it was sized for")));
  }
  if (placement_ != nullptr && (moe_layer < 0 || moe_layer >= placement_->num_layers())) {
    return Fail(absl::FailedPreconditionError(absl::StrCat("EpDeviceDispatcher: MoE layer ",
                                                           moe_layer, " is not in the placement (",
                                                           placement_->num_layers(), " layers)")));
  }
  cudaStream_t stream = static_cast<cudaStream_t>(backend_->native_stream());
  const int32_t T = static_cast<int32_t>(num_tokens);
  const int32_t* slots = nullptr;
  if (placement_ != nullptr || contiguous_table_ != nullptr) {
    const int32_t* table = placement_ != nullptr ? replica_tables_[moe_layer]->as<int32_t>()
                                                 : contiguous_table_->as<int32_t>();
    if (absl::Status st = CudaStatus(
            "EpChooseSlots",
            kernels::EpChooseSlots(T, cfg_.top_k, static_cast<int32_t>(num_experts_), comm_->rank(),
                                   topk_ids, table, table + num_experts_ + 1,
                                   topk_slots_->as<int32_t>(), stream));
        !st.ok()) {
      return Fail(st);
    }
    slots = topk_slots_->as<int32_t>();
  }
  cudaError_t e =
      kernels::EpDispatchSend(cfg_, options_.mode, view_, T, hidden, topk_ids, slots, stream);
  if (e == cudaSuccess) e = kernels::EpDispatchRows(cfg_, options_.mode, view_, T, hidden, stream);
  if (e == cudaSuccess) e = kernels::EpDispatchRecv(cfg_, options_.mode, view_, stream);
  if (e != cudaSuccess) return Fail(CudaStatus("dispatch", e));
  return absl::OkStatus();
}

absl::Status EpDeviceDispatcher::CombineOnDevice(const float* expert_out, float* out,
                                                 bool zero_out) {
  cudaStream_t stream = static_cast<cudaStream_t>(backend_->native_stream());
  const int32_t T = static_cast<int32_t>(tokens_);
  cudaError_t e = cudaSuccess;
  if (zero_out && T > 0) e = cudaMemsetAsync(out, 0, int64_t{T} * hidden_size_ * 4, stream);
  if (e == cudaSuccess) e = kernels::EpCombineSend(cfg_, view_, expert_out, stream);
  if (e == cudaSuccess) {
    e = kernels::EpCombineRecv(cfg_, view_, T, topk_ids_, topk_weights_, out, stream);
  }
  tokens_ = -1;
  if (e != cudaSuccess) return Fail(CudaStatus("combine", e));
  return absl::OkStatus();
}

absl::Status EpDeviceDispatcher::Dispatch(int64_t moe_layer, int64_t num_tokens, int64_t top_k,
                                          const float* hidden, const int32_t* topk_ids,
                                          const float* topk_weights, DispatchedTokens* out) {
  if (top_k != cfg_.top_k) {
    return Fail(absl::InvalidArgumentError(absl::StrCat("device expert exchange: top-", top_k,
                                                        " routing, sized for top-", cfg_.top_k)));
  }
  if (absl::Status st = DispatchOnDevice(moe_layer, num_tokens, hidden, topk_ids); !st.ok()) {
    return st;
  }
  tokens_ = num_tokens;
  topk_ids_ = topk_ids;
  topk_weights_ = topk_weights;
  // The grouped GEMM takes host offsets: one small copy (it synchronises the stream, which also
  // makes the error word of this and earlier exchanges readable).
  const int32_t per = cfg_.slots_per_rank;
  std::vector<int32_t> offsets(per + 1);
  backend_->CopyToHost(kernels::EpSlotOffsets(cfg_, view_), offsets.size() * sizeof(int32_t),
                       offsets.data());
  if (absl::Status st = CheckErrors(); !st.ok()) return st;
  const int64_t local = static_cast<int64_t>(local_experts(moe_layer).size());
  out->num_rows = offsets[per];
  out->group_offsets.assign(local + 1, offsets[per]);
  for (int64_t l = 0; l <= std::min<int64_t>(local, per); ++l) out->group_offsets[l] = offsets[l];
  out->hidden = backend_->Allocate(std::max<int64_t>(1, out->num_rows) * hidden_size_ * 4);
  if (out->num_rows > 0) {
    backend_->CopyDeviceToDevice(kernels::EpReceivedRows(cfg_, options_.mode, view_),
                                 out->num_rows * hidden_size_ * 4, out->hidden->data());
  }
  out->sent_rows_per_rank.clear();
  out->received_rows_per_rank.clear();
  out->received_row_slot.clear();
  out->sent_row_order.clear();
  return absl::OkStatus();
}

absl::Status EpDeviceDispatcher::Combine(const DispatchedTokens& dispatched,
                                         const float* expert_out, float* out) {
  if (tokens_ < 0) {
    return Fail(
        absl::FailedPreconditionError("EpDeviceDispatcher::Combine without a Dispatch before it"));
  }
  // expert_out holds the received rows only; the exchange reads any row below its count.
  return CombineOnDevice(expert_out, out, /*zero_out=*/false);
}

absl::Status EpDeviceDispatcher::RoutedExpertsOnDevice(int64_t moe_layer, int64_t num_tokens,
                                                       const float* hidden, const int32_t* topk_ids,
                                                       const float* topk_weights, float* out,
                                                       const DeviceExperts& experts) {
  if (absl::Status st = DispatchOnDevice(moe_layer, num_tokens, hidden, topk_ids); !st.ok()) {
    return st;
  }
  tokens_ = num_tokens;
  topk_ids_ = topk_ids;
  topk_weights_ = topk_weights;
  cudaStream_t stream = static_cast<cudaStream_t>(backend_->native_stream());
  if (absl::Status st = CudaStatus(
          "EpRowSlots", kernels::EpRowSlots(cfg_, view_, row_slot_->as<int32_t>(), stream));
      !st.ok()) {
    return Fail(st);
  }
  if (!experts(layout_.max_received, kernels::EpReceivedRows(cfg_, options_.mode, view_),
               row_slot_->as<int32_t>(), expert_out_->as<float>())) {
    // The exchange has started on every rank: finish it with zero outputs so the peers are not
    // left waiting, and say so.
    cudaMemsetAsync(expert_out_->data(), 0, layout_.max_received * hidden_size_ * 4, stream);
    (void)CombineOnDevice(expert_out_->as<float>(), out, /*zero_out=*/true);
    return Fail(absl::FailedPreconditionError(
        "the backend cannot run the received rows' experts on the device"));
  }
  return CombineOnDevice(expert_out_->as<float>(), out, /*zero_out=*/true);
}

}  // namespace deepinfer
