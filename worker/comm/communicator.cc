#include "worker/comm/communicator.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace deepinfer::comm {

size_t DataTypeSize(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return sizeof(float);
    case DataType::kInt64:
      return sizeof(int64_t);
  }
  LOG(FATAL) << "bad DataType " << static_cast<int>(type);
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kMax:
      return "max";
  }
  return "?";
}

const char* DataTypeName(DataType type) {
  switch (type) {
    case DataType::kFloat32:
      return "float32";
    case DataType::kInt64:
      return "int64";
  }
  return "?";
}

namespace {

template <typename T>
void ReduceTyped(T* dst, const T* src, size_t count, ReduceOp op) {
  // memcpy-free typed access is fine: both buffers come from callers as arrays of T or
  // from our own aligned staging buffers.
  if (op == ReduceOp::kSum) {
    for (size_t i = 0; i < count; ++i) dst[i] += src[i];
  } else {
    for (size_t i = 0; i < count; ++i) dst[i] = std::max(dst[i], src[i]);
  }
}

bool SumOverflows(const std::vector<size_t>& sizes, size_t* total) {
  *total = 0;
  for (size_t s : sizes) {
    if (s > std::numeric_limits<size_t>::max() - *total) return true;
    *total += s;
  }
  return false;
}

}  // namespace

void ReduceInto(void* dst, const void* src, size_t count, DataType type, ReduceOp op) {
  switch (type) {
    case DataType::kFloat32:
      ReduceTyped(static_cast<float*>(dst), static_cast<const float*>(src), count, op);
      return;
    case DataType::kInt64:
      ReduceTyped(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), count, op);
      return;
  }
  LOG(FATAL) << "bad DataType " << static_cast<int>(type);
}

absl::Status Communicator::RejectCall(const char* what, absl::Status error) {
  absl::Status status =
      absl::InvalidArgumentError(absl::StrCat(what, " on rank ", rank(), ": ", error.message()));
  Abort(status);
  return status;
}

absl::Status Communicator::CheckStream(const char* what, StreamHandle stream) {
  if (memory_kind() == MemoryKind::kHost && stream != nullptr) {
    return RejectCall(what, absl::InvalidArgumentError("a host communicator takes no stream"));
  }
  return absl::OkStatus();
}

absl::Status Communicator::AllToAllV(const void* send, const std::vector<size_t>& send_bytes,
                                     void* recv, const std::vector<size_t>& recv_bytes,
                                     StreamHandle stream) {
  const size_t n = static_cast<size_t>(world_size());
  if (send_bytes.size() != n || recv_bytes.size() != n) {
    return RejectCall("AllToAllV", absl::InvalidArgumentError(absl::StrCat(
                                       "size vectors have ", send_bytes.size(), " and ",
                                       recv_bytes.size(), " entries, world size is ", n)));
  }
  size_t send_total = 0;
  size_t recv_total = 0;
  if (SumOverflows(send_bytes, &send_total) || SumOverflows(recv_bytes, &recv_total)) {
    return RejectCall("AllToAllV", absl::InvalidArgumentError("sizes overflow"));
  }
  if ((send_total > 0 && send == nullptr) || (recv_total > 0 && recv == nullptr)) {
    return RejectCall("AllToAllV", absl::InvalidArgumentError("null buffer with non-zero size"));
  }
  if (absl::Status s = CheckStream("AllToAllV", stream); !s.ok()) return s;
  return DoAllToAllV(send, send_bytes, recv, recv_bytes, stream);
}

absl::StatusOr<std::vector<size_t>> Communicator::AllToAllSizes(
    const std::vector<size_t>& send_bytes) {
  if (send_bytes.size() != static_cast<size_t>(world_size())) {
    return RejectCall("AllToAllSizes", absl::InvalidArgumentError(
                                           absl::StrCat("size vector has ", send_bytes.size(),
                                                        " entries, world size is ", world_size())));
  }
  return DoAllToAllSizes(send_bytes);
}

absl::Status Communicator::AllGather(const void* send, size_t bytes_per_rank, void* recv,
                                     StreamHandle stream) {
  if (bytes_per_rank > std::numeric_limits<size_t>::max() / static_cast<size_t>(world_size())) {
    return RejectCall("AllGather", absl::InvalidArgumentError("size overflows"));
  }
  if (bytes_per_rank > 0 && (send == nullptr || recv == nullptr)) {
    return RejectCall("AllGather", absl::InvalidArgumentError("null buffer with non-zero size"));
  }
  if (absl::Status s = CheckStream("AllGather", stream); !s.ok()) return s;
  return DoAllGather(send, bytes_per_rank, recv, stream);
}

absl::Status Communicator::AllReduce(const void* send, void* recv, size_t count, DataType type,
                                     ReduceOp op, StreamHandle stream) {
  if (count > std::numeric_limits<size_t>::max() / DataTypeSize(type) / world_size()) {
    return RejectCall("AllReduce", absl::InvalidArgumentError("count overflows"));
  }
  if (count > 0 && (send == nullptr || recv == nullptr)) {
    return RejectCall("AllReduce", absl::InvalidArgumentError("null buffer with non-zero count"));
  }
  if (absl::Status s = CheckStream("AllReduce", stream); !s.ok()) return s;
  return DoAllReduce(send, recv, count, type, op, stream);
}

absl::Status Communicator::Barrier(StreamHandle stream) {
  if (absl::Status s = CheckStream("Barrier", stream); !s.ok()) return s;
  return DoBarrier(stream);
}

}  // namespace deepinfer::comm
