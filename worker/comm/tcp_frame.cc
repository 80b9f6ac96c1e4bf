#include "worker/comm/tcp_frame.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deepinfer::comm {
namespace {

void PutU16(uint8_t* p, uint16_t v) {
  for (int i = 0; i < 2; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void PutU64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint16_t GetU16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t GetU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t GetU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Appends to a handshake message body.
class Writer {
 public:
  void U8(uint8_t v) { body_.push_back(static_cast<char>(v)); }
  void U32(uint32_t v) {
    uint8_t b[4];
    PutU32(b, v);
    body_.append(reinterpret_cast<char*>(b), 4);
  }
  void U64(uint64_t v) {
    uint8_t b[8];
    PutU64(b, v);
    body_.append(reinterpret_cast<char*>(b), 8);
  }
  void Str(absl::string_view s) {
    U32(static_cast<uint32_t>(s.size()));
    body_.append(s.data(), s.size());
  }
  // The body with its u32 length prefix.
  std::string Framed() const {
    uint8_t b[4];
    PutU32(b, static_cast<uint32_t>(body_.size()));
    return std::string(reinterpret_cast<char*>(b), 4) + body_;
  }

 private:
  std::string body_;
};

// Reads a handshake message body; every read is bounds-checked.
class Reader {
 public:
  explicit Reader(absl::string_view body) : rest_(body) {}
  bool U8(uint8_t* v) {
    if (rest_.size() < 1) return false;
    *v = static_cast<uint8_t>(rest_[0]);
    rest_.remove_prefix(1);
    return true;
  }
  bool U32(uint32_t* v) {
    if (rest_.size() < 4) return false;
    *v = GetU32(reinterpret_cast<const uint8_t*>(rest_.data()));
    rest_.remove_prefix(4);
    return true;
  }
  bool U64(uint64_t* v) {
    if (rest_.size() < 8) return false;
    *v = GetU64(reinterpret_cast<const uint8_t*>(rest_.data()));
    rest_.remove_prefix(8);
    return true;
  }
  bool Str(std::string* s) {
    uint32_t n = 0;
    if (!U32(&n) || rest_.size() < n) return false;
    s->assign(rest_.data(), n);
    rest_.remove_prefix(n);
    return true;
  }
  bool done() const { return rest_.empty(); }

 private:
  absl::string_view rest_;
};

absl::Status Malformed(const char* what) {
  return absl::FailedPreconditionError(
      absl::StrCat("malformed ", what, " (not a deepinfer communicator peer?)"));
}

}  // namespace

const char* FrameOpName(FrameOp op) {
  switch (op) {
    case FrameOp::kAllToAllV:
      return "AllToAllV";
    case FrameOp::kAllToAllSizes:
      return "AllToAllSizes";
    case FrameOp::kAllGather:
      return "AllGather";
    case FrameOp::kAllReduce:
      return "AllReduce";
    case FrameOp::kBarrier:
      return "Barrier";
    case FrameOp::kAbort:
      return "Abort";
  }
  return "unknown-op";
}

void FrameHeader::Encode(uint8_t out[kSize]) const {
  PutU32(out, kFrameMagic);
  PutU16(out + 4, kProtocolVersion);
  out[6] = static_cast<uint8_t>(op);
  out[7] = detail;
  PutU64(out + 8, incarnation);
  PutU64(out + 16, sequence);
  PutU64(out + 24, payload_bytes);
}

absl::StatusOr<FrameHeader> FrameHeader::Decode(const uint8_t in[kSize]) {
  if (GetU32(in) != kFrameMagic) {
    return absl::FailedPreconditionError(
        "bad frame magic: the stream is out of step or the peer is not a communicator");
  }
  if (const uint16_t version = GetU16(in + 4); version != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("protocol version ", version, ", this binary speaks ", kProtocolVersion));
  }
  FrameHeader h;
  if (in[6] < static_cast<uint8_t>(FrameOp::kAllToAllV) ||
      in[6] > static_cast<uint8_t>(FrameOp::kAbort)) {
    return absl::FailedPreconditionError(absl::StrCat("unknown frame op ", in[6]));
  }
  h.op = static_cast<FrameOp>(in[6]);
  h.detail = in[7];
  h.incarnation = GetU64(in + 8);
  h.sequence = GetU64(in + 16);
  h.payload_bytes = GetU64(in + 24);
  return h;
}

std::string Hello::Encode() const {
  Writer w;
  w.U32(kFrameMagic);
  w.U32(kProtocolVersion);
  w.U64(incarnation);
  w.U32(static_cast<uint32_t>(world_size));
  w.U32(static_cast<uint32_t>(rank));
  w.Str(listen_address);
  return w.Framed();
}

absl::StatusOr<Hello> Hello::DecodeBody(absl::string_view body) {
  Reader r(body);
  uint32_t magic = 0, version = 0, world_size = 0, rank = 0;
  Hello h;
  if (!r.U32(&magic) || magic != kFrameMagic || !r.U32(&version)) return Malformed("hello");
  if (version != kProtocolVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("peer speaks protocol version ", version, ", this binary ", kProtocolVersion));
  }
  if (!r.U64(&h.incarnation) || !r.U32(&world_size) || !r.U32(&rank) || !r.Str(&h.listen_address) ||
      !r.done()) {
    return Malformed("hello");
  }
  h.world_size = static_cast<int32_t>(world_size);
  h.rank = static_cast<int32_t>(rank);
  return h;
}

std::string HelloReply::Encode() const {
  Writer w;
  w.U32(kFrameMagic);
  w.U8(ok ? 1 : 0);
  w.Str(error);
  w.U32(static_cast<uint32_t>(listen_addresses.size()));
  for (const std::string& a : listen_addresses) w.Str(a);
  return w.Framed();
}

absl::StatusOr<HelloReply> HelloReply::DecodeBody(absl::string_view body) {
  Reader r(body);
  uint32_t magic = 0, n = 0;
  uint8_t ok = 0;
  HelloReply reply;
  if (!r.U32(&magic) || magic != kFrameMagic || !r.U8(&ok) || !r.Str(&reply.error) || !r.U32(&n) ||
      n > kMaxHandshakeBytes) {
    return Malformed("hello reply");
  }
  reply.ok = ok != 0;
  reply.listen_addresses.resize(n);
  for (std::string& a : reply.listen_addresses) {
    if (!r.Str(&a)) return Malformed("hello reply");
  }
  if (!r.done()) return Malformed("hello reply");
  return reply;
}

}  // namespace deepinfer::comm
