// EpExpertDispatcher: host-planned all-to-all dispatch and combine.
//
// Wire format of the Dispatch exchange from rank s to rank d, n rows in (expert, token) order on
// the sender (the size exchange announces n * 4 * (hidden_size + 1) bytes on both paths):
//   host communicator: one segment [n rows x hidden_size float32][n int32 local slot ids],
//     staged through host memory;
//   device communicator: two all-to-alls of device buffers on the backend's stream, the rows
//     [n x hidden_size float32] then the ids [n int32], so that received rows are contiguous
//     and are grouped with one GatherRows (no host staging of the rows).
// Combine's segment from d back to s is the n output rows in the order s sent them.
// Both paths move the same float bits and apply the same ScatterAddRows, so their results
// are identical.
//
// Why the result is bit-identical to LocalExpertDispatcher: the sender orders its rows by
// (global expert, token) -- the combine order -- picks each row's slot (its expert's only slot,
// or one replica by ChooseReplica), and sends rows grouped by destination, keeping the combine
// order within a destination (sent_row_order remembers where each sent row came from). Each
// destination returns a sender's rows in the order it received them, and Combine puts them back
// into the combine order (exact row copies) before the same ScatterAddRows that
// LocalExpertDispatcher uses, with the same weights. The expert output of a row does not depend
// on which other rows share its grouped GEMM, nor on which replica computed it (replicas hold
// the same weights; the backend computes each output row on its own). Without a placement,
// sent_row_order is the identity and the exchange is the one of plain expert parallelism.
#include "worker/model/ep_expert_dispatcher.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "worker/model/replica_choice.h"

namespace deepinfer {

absl::StatusOr<std::unique_ptr<EpExpertDispatcher>> EpExpertDispatcher::Create(
    comm::Communicator* comm, Backend* backend, int64_t num_experts, int64_t hidden_size,
    std::shared_ptr<const ExpertPlacement> placement) {
  if (comm == nullptr || backend == nullptr) {
    return absl::InvalidArgumentError("EpExpertDispatcher: no communicator or backend");
  }
  if (hidden_size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("EpExpertDispatcher: hidden size ", hidden_size, " must be positive"));
  }
  const int world = comm->world_size();
  if (num_experts <= 0 || num_experts % world != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert parallelism: ", num_experts, " routed experts do not divide over ", world,
        " ranks (each rank must host the same number of experts; use a world size that "
        "divides ",
        num_experts, ")"));
  }
  if (comm->memory_kind() == comm::MemoryKind::kDevice && backend->native_stream() == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("EpExpertDispatcher: a device-memory communicator needs a backend with a "
                     "stream, not '",
                     backend->name(), "'"));
  }
  std::unique_ptr<EpExpertDispatcher> d(
      new EpExpertDispatcher(comm, backend, num_experts, hidden_size));
  if (placement != nullptr) {
    if (absl::Status st = d->SetPlacement(std::move(placement)); !st.ok()) return st;
  }
  return d;
}

EpExpertDispatcher::EpExpertDispatcher(comm::Communicator* comm, Backend* backend,
                                       int64_t num_experts, int64_t hidden_size)
    : comm_(comm),
      backend_(backend),
      num_experts_(num_experts),
      hidden_size_(hidden_size),
      experts_per_rank_(num_experts / comm->world_size()),
      device_exchange_(comm->memory_kind() == comm::MemoryKind::kDevice) {
  const int64_t first = comm_->rank() * experts_per_rank_;
  for (int64_t e = 0; e < experts_per_rank_; ++e) contiguous_experts_.push_back(first + e);
}

std::vector<std::vector<int64_t>> EpExpertDispatcher::ExpertsOfRank(
    const ExpertPlacement& placement, int world_size, int rank) {
  const int per = placement.num_physical() / world_size;
  std::vector<std::vector<int64_t>> out(placement.num_layers());
  for (int l = 0; l < placement.num_layers(); ++l) {
    for (int p = rank * per; p < (rank + 1) * per; ++p) out[l].push_back(placement.phy2log()[l][p]);
  }
  return out;
}

const std::vector<int64_t>& EpExpertDispatcher::local_experts(int64_t moe_layer) const {
  if (placement_ == nullptr || moe_layer < 0 ||
      moe_layer >= static_cast<int64_t>(placed_experts_.size())) {
    return contiguous_experts_;
  }
  return placed_experts_[moe_layer];
}

absl::Status EpExpertDispatcher::SetPlacement(std::shared_ptr<const ExpertPlacement> placement) {
  if (placement == nullptr) {
    placement_ = nullptr;
    placed_experts_.clear();
    return absl::OkStatus();
  }
  if (placement->num_logical() != num_experts_) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert placement has ", placement->num_logical(),
                     " logical experts but the model has ", num_experts_));
  }
  if (absl::Status st = placement->CheckGpuCount(comm_->world_size()); !st.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("expert placement does not fit this group: ", st.message()));
  }
  placed_experts_ = ExpertsOfRank(*placement, comm_->world_size(), comm_->rank());
  placement_ = std::move(placement);
  return absl::OkStatus();
}

absl::Status EpExpertDispatcher::Fail(absl::Status error) {
  comm_->Abort(error);
  return error;
}

absl::Status EpExpertDispatcher::Dispatch(int64_t moe_layer, int64_t num_tokens, int64_t top_k,
                                          const float* hidden, const int32_t* topk_ids,
                                          const float* topk_weights, DispatchedTokens* out) {
  absl::StatusOr<Exchange> exchange =
      BeginDispatch(moe_layer, num_tokens, top_k, hidden, topk_ids, topk_weights, out);
  if (!exchange.ok()) return exchange.status();
  if (*exchange) {
    if (absl::Status st = (*exchange)(); !st.ok()) return st;
  }
  return FinishDispatch(out);
}

absl::StatusOr<ExpertDispatcher::Exchange> EpExpertDispatcher::BeginDispatch(
    int64_t moe_layer, int64_t num_tokens, int64_t top_k, const float* hidden,
    const int32_t* topk_ids, const float* topk_weights, DispatchedTokens* out) {
  const int world = comm_->world_size();
  const int64_t H = hidden_size_;
  const int64_t n = num_tokens * top_k;
  if (placement_ != nullptr && (moe_layer < 0 || moe_layer >= placement_->num_layers())) {
    return Fail(absl::FailedPreconditionError(absl::StrCat("EpExpertDispatcher: MoE layer ",
                                                           moe_layer, " is not in the placement (",
                                                           placement_->num_layers(), " layers)")));
  }
  const int64_t per = SlotsPerRank();
  std::vector<int32_t> ids(n);
  std::vector<float> weights(n);
  backend_->CopyToHost(topk_ids, n * sizeof(int32_t), ids.data());
  backend_->CopyToHost(topk_weights, n * sizeof(float), weights.data());

  // Counting sort of the (token, choice) pairs by expert, stable in token order: the row order
  // LocalExpertDispatcher uses, which Combine reproduces.
  std::vector<int64_t> expert_start(num_experts_ + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t e = ids[i];
    if (e < 0 || e >= num_experts_) {
      return Fail(absl::FailedPreconditionError(
          absl::StrCat("EpExpertDispatcher: token ", i / std::max<int64_t>(1, top_k),
                       " routed to expert ", e, ", outside the model's ", num_experts_)));
    }
    ++expert_start[e + 1];
  }
  for (int64_t e = 0; e < num_experts_; ++e) expert_start[e + 1] += expert_start[e];
  std::vector<int64_t> next(expert_start.begin(), expert_start.end() - 1);
  std::vector<int32_t> row_token(n);
  std::vector<int64_t> row_slot(n);
  std::vector<float> row_weight(n);
  for (int64_t t = 0; t < num_tokens; ++t) {
    for (int64_t k = 0; k < top_k; ++k) {
      const int32_t e = ids[t * top_k + k];
      const int64_t row = next[e]++;
      row_token[row] = static_cast<int32_t>(t);
      row_weight[row] = weights[t * top_k + k];
      if (placement_ == nullptr) {
        row_slot[row] = e;
      } else {
        const std::vector<int>& replicas = placement_->log2phy()[moe_layer][e];
        row_slot[row] =
            replicas[ChooseReplica(t, comm_->rank(), e, static_cast<int64_t>(replicas.size()))];
      }
    }
  }
  // Rows grouped by destination rank (slot / per), combine order kept within each: sent row j
  // is combine row sent_row_order[j], with local slot id local_ids[j] on its destination.
  out->sent_row_order.resize(n);
  out->sent_rows_per_rank.assign(world, 0);
  {
    std::vector<int64_t> dest_next(world + 1, 0);
    for (int64_t r = 0; r < n; ++r) ++dest_next[row_slot[r] / per + 1];
    for (int d = 0; d < world; ++d) {
      out->sent_rows_per_rank[d] = dest_next[d + 1];
      dest_next[d + 1] += dest_next[d];
    }
    for (int64_t r = 0; r < n; ++r) out->sent_row_order[dest_next[row_slot[r] / per]++] = r;
  }
  std::vector<int32_t> sent_token(n), local_ids(n);
  for (int64_t j = 0; j < n; ++j) {
    const int64_t r = out->sent_row_order[j];
    sent_token[j] = row_token[r];
    local_ids[j] = static_cast<int32_t>(row_slot[r] % per);
  }
  out->row_token = backend_->Allocate(n * sizeof(int32_t));
  out->row_weight = backend_->Allocate(n * sizeof(float));
  backend_->CopyToDevice(row_token.data(), n * sizeof(int32_t), out->row_token->data());
  backend_->CopyToDevice(row_weight.data(), n * sizeof(float), out->row_weight->data());
  auto sent_token_dev = backend_->Allocate(n * sizeof(int32_t));
  backend_->CopyToDevice(sent_token.data(), n * sizeof(int32_t), sent_token_dev->data());
  auto send_rows = backend_->Allocate(n * H * sizeof(float));
  backend_->GatherRows(n, H, hidden, sent_token_dev->as<int32_t>(), send_rows->as<float>());

  // The size exchange counts each row with its int32 local slot id, on both paths.
  StagedExchange& x = out->staged;
  x.send_bytes.assign(world, 0);
  for (int d = 0; d < world; ++d) x.send_bytes[d] = out->sent_rows_per_rank[d] * RowBytes();
  if (device_exchange_) {
    if (absl::Status st = DispatchOnDevice(send_rows.get(), local_ids, out); !st.ok()) return st;
    return Exchange();
  }
  // Segment to d: [rows x H float32][rows int32 local slot ids], staged in host memory.
  x.send.resize(n * (H + 1));
  int64_t first = 0;
  for (int d = 0; d < world; ++d) {
    const int64_t rows = out->sent_rows_per_rank[d];
    float* seg = x.send.data() + first * (H + 1);
    backend_->CopyToHost(send_rows->as<float>() + first * H, rows * H * sizeof(float), seg);
    std::memcpy(seg + rows * H, local_ids.data() + first, rows * sizeof(int32_t));
    first += rows;
  }
  if (absl::Status st = backend_->status(); !st.ok()) return Fail(st);
  // Communicator calls and host memory only (it may run on another thread).
  return Exchange([this, &x]() -> absl::Status {
    absl::StatusOr<std::vector<size_t>> recv_bytes = comm_->AllToAllSizes(x.send_bytes);
    if (!recv_bytes.ok()) return Fail(recv_bytes.status());
    if (absl::Status st = CheckWholeRows(*recv_bytes); !st.ok()) return Fail(st);
    x.recv_bytes = std::move(*recv_bytes);
    size_t total = 0;
    for (size_t b : x.recv_bytes) total += b;
    x.recv.resize(total / sizeof(float));
    if (absl::Status st =
            comm_->AllToAllV(x.send.data(), x.send_bytes, x.recv.data(), x.recv_bytes);
        !st.ok()) {
      return Fail(st);
    }
    return absl::OkStatus();
  });
}

absl::Status EpExpertDispatcher::CheckWholeRows(const std::vector<size_t>& recv_bytes) const {
  for (size_t s = 0; s < recv_bytes.size(); ++s) {
    if (recv_bytes[s] % RowBytes() != 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("EpExpertDispatcher: rank ", s, " sends ", recv_bytes[s],
                       " bytes, not whole rows of hidden size ", hidden_size_, " (", RowBytes(),
                       " bytes each): the ranks run different models"));
    }
  }
  return absl::OkStatus();
}

absl::Status EpExpertDispatcher::DispatchOnDevice(DeviceBuffer* send_rows,
                                                  const std::vector<int32_t>& local_ids,
                                                  DispatchedTokens* out) {
  const int world = comm_->world_size();
  const int64_t H = hidden_size_;
  const int64_t n = static_cast<int64_t>(local_ids.size());
  absl::StatusOr<std::vector<size_t>> recv_bytes = comm_->AllToAllSizes(out->staged.send_bytes);
  if (!recv_bytes.ok()) return Fail(recv_bytes.status());
  if (absl::Status st = CheckWholeRows(*recv_bytes); !st.ok()) return Fail(st);
  out->received_rows_per_rank.assign(world, 0);
  int64_t received = 0;
  for (int s = 0; s < world; ++s) {
    out->received_rows_per_rank[s] = static_cast<int64_t>((*recv_bytes)[s] / RowBytes());
    received += out->received_rows_per_rank[s];
  }
  // Rows and their ids travel as two all-to-alls of device buffers, enqueued on the backend's
  // stream after GatherRows: no host staging of the rows.
  auto send_ids = backend_->Allocate(n * sizeof(int32_t));
  backend_->CopyToDevice(local_ids.data(), n * sizeof(int32_t), send_ids->data());
  auto recv_rows = backend_->Allocate(received * H * sizeof(float));
  auto recv_ids = backend_->Allocate(received * sizeof(int32_t));
  std::vector<size_t> rows_out(world), rows_in(world), ids_out(world), ids_in(world);
  for (int r = 0; r < world; ++r) {
    rows_out[r] = out->sent_rows_per_rank[r] * H * sizeof(float);
    rows_in[r] = out->received_rows_per_rank[r] * H * sizeof(float);
    ids_out[r] = out->sent_rows_per_rank[r] * sizeof(int32_t);
    ids_in[r] = out->received_rows_per_rank[r] * sizeof(int32_t);
  }
  if (absl::Status st = comm_->AllToAllV(send_rows->data(), rows_out, recv_rows->data(), rows_in,
                                         backend_->native_stream());
      !st.ok()) {
    return Fail(st);
  }
  if (absl::Status st = comm_->AllToAllV(send_ids->data(), ids_out, recv_ids->data(), ids_in,
                                         backend_->native_stream());
      !st.ok()) {
    return Fail(st);
  }
  // Synchronises the stream: the plan below needs the ids on the host.
  std::vector<int32_t> arrival_expert(received);
  backend_->CopyToHost(recv_ids->data(), received * sizeof(int32_t), arrival_expert.data());
  if (absl::Status st = backend_->status(); !st.ok()) return Fail(st);
  if (absl::Status st = GroupArrivals(arrival_expert, out); !st.ok()) return st;
  // hidden[slot] = recv_rows[arrival index of slot]: an exact row copy on the device.
  std::vector<int32_t> arrival_of_slot(received);
  for (int64_t j = 0; j < received; ++j) {
    arrival_of_slot[out->received_row_slot[j]] = static_cast<int32_t>(j);
  }
  if (received > 0) {
    auto idx = backend_->Allocate(received * sizeof(int32_t));
    backend_->CopyToDevice(arrival_of_slot.data(), received * sizeof(int32_t), idx->data());
    backend_->GatherRows(received, H, recv_rows->as<float>(), idx->as<int32_t>(),
                         out->hidden->as<float>());
  }
  return absl::OkStatus();
}

absl::Status EpExpertDispatcher::GroupArrivals(const std::vector<int32_t>& arrival_expert,
                                               DispatchedTokens* out) {
  const int world = comm_->world_size();
  const int64_t per = SlotsPerRank();
  const int64_t received = static_cast<int64_t>(arrival_expert.size());
  {
    int64_t j = 0;
    for (int s = 0; s < world; ++s) {
      for (int64_t r = 0; r < out->received_rows_per_rank[s]; ++r, ++j) {
        const int32_t local = arrival_expert[j];
        if (local < 0 || local >= per) {
          return Fail(absl::FailedPreconditionError(absl::StrCat(
              "EpExpertDispatcher: rank ", s, " sent a row for local slot ", local, " but rank ",
              comm_->rank(), " hosts ", per, " (the ranks use different placements)")));
        }
      }
    }
  }
  // Group by local slot (ascending), then source rank, then the source's order: a stable
  // counting sort of the rows in arrival order.
  out->group_offsets.assign(per + 1, 0);
  for (int32_t local : arrival_expert) ++out->group_offsets[local + 1];
  for (int64_t e = 0; e < per; ++e) out->group_offsets[e + 1] += out->group_offsets[e];
  std::vector<int64_t> slot_next(out->group_offsets.begin(), out->group_offsets.end() - 1);
  out->received_row_slot.resize(received);
  for (int64_t j = 0; j < received; ++j) {
    out->received_row_slot[j] = slot_next[arrival_expert[j]]++;
  }
  out->num_rows = received;
  out->hidden = backend_->Allocate(received * hidden_size_ * sizeof(float));
  return absl::OkStatus();
}

absl::Status EpExpertDispatcher::FinishDispatch(DispatchedTokens* out) {
  if (device_exchange_) return absl::OkStatus();  // BeginDispatch did all of it
  const int world = comm_->world_size();
  const int64_t H = hidden_size_;
  StagedExchange& x = out->staged;
  if (static_cast<int>(x.recv_bytes.size()) != world) {
    return Fail(absl::InternalError("EpExpertDispatcher::FinishDispatch before its exchange ran"));
  }
  out->received_rows_per_rank.assign(world, 0);
  int64_t received = 0;
  for (int s = 0; s < world; ++s) {
    out->received_rows_per_rank[s] = static_cast<int64_t>(x.recv_bytes[s] / RowBytes());
    received += out->received_rows_per_rank[s];
  }
  // arrival_expert[j]: the local expert of the j-th received row (sources in rank order).
  std::vector<int32_t> arrival_expert(received);
  {
    int64_t j = 0;
    const float* seg = x.recv.data();
    for (int s = 0; s < world; ++s) {
      const int64_t rows = out->received_rows_per_rank[s];
      for (int64_t r = 0; r < rows; ++r, ++j) {
        std::memcpy(&arrival_expert[j], seg + rows * H + r, sizeof(int32_t));
      }
      seg += rows * (H + 1);
    }
  }
  if (absl::Status st = GroupArrivals(arrival_expert, out); !st.ok()) return st;
  std::vector<float> grouped(received * H);
  {
    int64_t j = 0;
    const float* seg = x.recv.data();
    for (int s = 0; s < world; ++s) {
      const int64_t rows = out->received_rows_per_rank[s];
      for (int64_t r = 0; r < rows; ++r, ++j) {
        std::memcpy(grouped.data() + out->received_row_slot[j] * H, seg + r * H, H * sizeof(float));
      }
      seg += rows * (H + 1);
    }
  }
  backend_->CopyToDevice(grouped.data(), grouped.size() * sizeof(float), out->hidden->data());
  x = StagedExchange();
  return absl::OkStatus();
}

absl::Status EpExpertDispatcher::Combine(const DispatchedTokens& d, const float* expert_out,
                                         float* out) {
  StagedExchange x;
  absl::StatusOr<Exchange> exchange = BeginCombineInto(d, expert_out, out, &x);
  if (!exchange.ok()) return exchange.status();
  if (*exchange) {
    if (absl::Status st = (*exchange)(); !st.ok()) return st;
  }
  return FinishCombineFrom(d, &x, out);
}

absl::StatusOr<ExpertDispatcher::Exchange> EpExpertDispatcher::BeginCombine(
    DispatchedTokens* dispatched, const float* expert_out, float* out) {
  return BeginCombineInto(*dispatched, expert_out, out, &dispatched->staged);
}

absl::Status EpExpertDispatcher::FinishCombine(DispatchedTokens* dispatched, float* out) {
  return FinishCombineFrom(*dispatched, &dispatched->staged, out);
}

absl::StatusOr<ExpertDispatcher::Exchange> EpExpertDispatcher::BeginCombineInto(
    const DispatchedTokens& d, const float* expert_out, float* out, StagedExchange* x) {
  const int world = comm_->world_size();
  const int64_t H = hidden_size_;
  if (static_cast<int>(d.sent_rows_per_rank.size()) != world ||
      static_cast<int>(d.received_rows_per_rank.size()) != world ||
      static_cast<int64_t>(d.received_row_slot.size()) != d.num_rows || d.row_token == nullptr ||
      d.row_weight == nullptr ||
      d.row_token->size_bytes() != d.sent_row_order.size() * sizeof(int32_t)) {
    return Fail(absl::InvalidArgumentError(
        "EpExpertDispatcher::Combine: the DispatchedTokens do not come from this dispatcher"));
  }
  x->send_bytes.assign(world, 0);
  x->recv_bytes.assign(world, 0);
  int64_t back = 0;
  for (int r = 0; r < world; ++r) {
    x->send_bytes[r] = d.received_rows_per_rank[r] * H * sizeof(float);
    x->recv_bytes[r] = d.sent_rows_per_rank[r] * H * sizeof(float);
    back += d.sent_rows_per_rank[r];
  }
  if (d.row_token->size_bytes() != back * sizeof(int32_t)) {
    return Fail(absl::InvalidArgumentError(
        "EpExpertDispatcher::Combine: the DispatchedTokens do not come from this dispatcher"));
  }
  // Outputs go back in arrival order, i.e. each source's rows in the order it sent them.
  if (device_exchange_) {
    auto rows = backend_->Allocate(back * H * sizeof(float));
    auto send = backend_->Allocate(d.num_rows * H * sizeof(float));
    if (d.num_rows > 0) {
      std::vector<int32_t> slot(d.received_row_slot.begin(), d.received_row_slot.end());
      auto idx = backend_->Allocate(d.num_rows * sizeof(int32_t));
      backend_->CopyToDevice(slot.data(), slot.size() * sizeof(int32_t), idx->data());
      backend_->GatherRows(d.num_rows, H, expert_out, idx->as<int32_t>(), send->as<float>());
    }
    if (absl::Status st = comm_->AllToAllV(send->data(), x->send_bytes, rows->data(), x->recv_bytes,
                                           backend_->native_stream());
        !st.ok()) {
      return Fail(st);
    }
    AddCombinedRows(d, std::move(rows), out);
    return Exchange();
  }
  std::vector<float> grouped(d.num_rows * H);
  backend_->CopyToHost(expert_out, grouped.size() * sizeof(float), grouped.data());
  if (absl::Status st = backend_->status(); !st.ok()) return Fail(st);
  x->send.resize(d.num_rows * H);
  for (int64_t j = 0; j < d.num_rows; ++j) {
    std::memcpy(x->send.data() + j * H, grouped.data() + d.received_row_slot[j] * H,
                H * sizeof(float));
  }
  x->recv.resize(back * H);
  // Communicator calls and host memory only (it may run on another thread).
  return Exchange([this, x]() -> absl::Status {
    if (absl::Status st =
            comm_->AllToAllV(x->send.data(), x->send_bytes, x->recv.data(), x->recv_bytes);
        !st.ok()) {
      return Fail(st);
    }
    return absl::OkStatus();
  });
}

absl::Status EpExpertDispatcher::FinishCombineFrom(const DispatchedTokens& d, StagedExchange* x,
                                                   float* out) {
  if (device_exchange_) return absl::OkStatus();  // BeginCombine did all of it
  const int64_t back = static_cast<int64_t>(d.sent_row_order.size());
  auto rows = backend_->Allocate(back * hidden_size_ * sizeof(float));
  backend_->CopyToDevice(x->recv.data(), x->recv.size() * sizeof(float), rows->data());
  *x = StagedExchange();
  AddCombinedRows(d, std::move(rows), out);
  return absl::OkStatus();
}

void EpExpertDispatcher::AddCombinedRows(const DispatchedTokens& d,
                                         std::unique_ptr<DeviceBuffer> rows, float* out) {
  const int64_t H = hidden_size_;
  const int64_t back = static_cast<int64_t>(d.sent_row_order.size());
  // Back into (expert, token) order, as LocalExpertDispatcher combines them (exact row copies;
  // nothing to do when every row went out in that order, as without a placement).
  bool identity = true;
  for (int64_t j = 0; j < back && identity; ++j) identity = d.sent_row_order[j] == j;
  if (!identity) {
    std::vector<int32_t> sent_index(back);
    for (int64_t j = 0; j < back; ++j) sent_index[d.sent_row_order[j]] = static_cast<int32_t>(j);
    auto idx = backend_->Allocate(back * sizeof(int32_t));
    backend_->CopyToDevice(sent_index.data(), back * sizeof(int32_t), idx->data());
    auto ordered = backend_->Allocate(back * H * sizeof(float));
    backend_->GatherRows(back, H, rows->as<float>(), idx->as<int32_t>(), ordered->as<float>());
    rows = std::move(ordered);
  }
  backend_->ScatterAddRows(back, H, rows->as<float>(), d.row_token->as<int32_t>(),
                           d.row_weight->as<float>(), out);
}

}  // namespace deepinfer
