// The wire format of TcpCommunicator: the hello that opens each connection during
// rendezvous, and the fixed header in front of every data frame. Fixed little-endian
// layouts, encoded byte by byte, so that both ends agree whatever the compiler's padding.
// docs/communicator.md draws the protocol.
#ifndef DEEPINFER_WORKER_COMM_TCP_FRAME_H_
#define DEEPINFER_WORKER_COMM_TCP_FRAME_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer::comm {

inline constexpr uint32_t kFrameMagic = 0x4d434944;  // "DICM" on the wire
inline constexpr uint16_t kProtocolVersion = 1;

// What a data frame belongs to. kAbort is not a collective: a rank that gives up sends it
// (when its side of the stream is at a frame boundary) with the reason as payload.
enum class FrameOp : uint8_t {
  kAllToAllV = 1,
  kAllToAllSizes = 2,
  kAllGather = 3,
  kAllReduce = 4,
  kBarrier = 5,
  kAbort = 6,
};
const char* FrameOpName(FrameOp op);

struct FrameHeader {
  static constexpr size_t kSize = 32;

  FrameOp op = FrameOp::kBarrier;
  // For kAllReduce: the DataType and ReduceOp (so that ranks disagreeing on them are
  // caught); 0 otherwise.
  uint8_t detail = 0;
  uint64_t incarnation = 0;  // the group's
  uint64_t sequence = 0;     // collectives since the group formed, from 1
  uint64_t payload_bytes = 0;

  void Encode(uint8_t out[kSize]) const;
  // FAILED_PRECONDITION on a wrong magic or version (not one of our peers, or another
  // protocol version).
  static absl::StatusOr<FrameHeader> Decode(const uint8_t in[kSize]);
};

// First message on every connection, from the connecting rank: who it is and which group
// it means to join. The accepting side answers with a HelloReply.
struct Hello {
  uint64_t incarnation = 0;
  int32_t world_size = 0;
  int32_t rank = 0;
  // Where this rank accepts its peers' connections ("host:port"); empty for rank 0.
  std::string listen_address;

  std::string Encode() const;  // u32 length prefix, then the body
  static absl::StatusOr<Hello> DecodeBody(absl::string_view body);
};

// The answer to a Hello: ok, or why the connection is refused. The root's answer to an
// accepted Hello also carries every rank's listen address (the rank layout).
struct HelloReply {
  bool ok = false;
  std::string error;
  std::vector<std::string> listen_addresses;

  std::string Encode() const;  // u32 length prefix, then the body
  static absl::StatusOr<HelloReply> DecodeBody(absl::string_view body);
};

// Upper bound for a length-prefixed handshake message, so that garbage on the port does
// not make us allocate gigabytes.
inline constexpr uint32_t kMaxHandshakeBytes = 1 << 20;

}  // namespace deepinfer::comm

#endif  // DEEPINFER_WORKER_COMM_TCP_FRAME_H_
