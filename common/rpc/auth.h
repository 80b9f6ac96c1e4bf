// Shared-token authentication for every deepinfer RPC.
//
// A cluster token (a secret in a file, --auth-token-file) is sent by clients as
// "authorization: Bearer <token>" metadata; servers configured with a token refuse
// any call that lacks it with UNAUTHENTICATED. With no token configured, everything
// is accepted: daemons then listen on 127.0.0.1 by default.
#ifndef DEEPINFER_COMMON_RPC_AUTH_H_
#define DEEPINFER_COMMON_RPC_AUTH_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace deepinfer {

// Reads a token file: surrounding whitespace is dropped; an empty or unreadable
// file is an error naming the path.
absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path);

// Server side: checks the token of each incoming call.
class TokenAuthenticator {
 public:
  // An empty token disables the check.
  explicit TokenAuthenticator(std::string token) : token_(std::move(token)) {}

  // OK, or UNAUTHENTICATED saying whether the token was missing or wrong.
  grpc::Status Check(const grpc::ServerContextBase& context) const;

  bool enabled() const { return !token_.empty(); }

 private:
  std::string token_;
};

// Client side: adds the token (if any) to an outgoing call.
void AttachAuthToken(absl::string_view token, grpc::ClientContext* context);

// Converts between gRPC and Abseil status; the codes share their numbering.
absl::Status ToAbslStatus(const grpc::Status& status);
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_RPC_AUTH_H_
