#include "common/rpc/auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

constexpr absl::string_view kAuthHeader = "authorization";
constexpr absl::string_view kBearer = "Bearer ";

// Compares in time independent of where the first difference is, so the token
// cannot be guessed byte by byte from response times.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = a.size() < b.size() ? a.size() : b.size();
  for (size_t i = 0; i < n; ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

}  // namespace

absl::StatusOr<std::string> ReadAuthTokenFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read auth token file '", path, "'"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string token(absl::StripAsciiWhitespace(buffer.str()));
  if (token.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("auth token file '", path, "' is empty"));
  }
  if (token.find_first_of("\r\n") != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth token file '", path, "' must hold one line (the token)"));
  }
  return token;
}

grpc::Status TokenAuthenticator::Check(const grpc::ServerContextBase& context) const {
  if (token_.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  auto it = metadata.find(grpc::string_ref(kAuthHeader.data(), kAuthHeader.size()));
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this server requires an auth token");
  }
  absl::string_view value(it->second.data(), it->second.size());
  if (value.substr(0, kBearer.size()) != kBearer ||
      !ConstantTimeEquals(value.substr(kBearer.size()), token_)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong auth token");
  }
  return grpc::Status::OK;
}

void AttachAuthToken(absl::string_view token, grpc::ClientContext* context) {
  if (token.empty()) return;
  context->AddMetadata(std::string(kAuthHeader), absl::StrCat(kBearer, token));
}

absl::Status ToAbslStatus(const grpc::Status& status) {
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

}  // namespace deepinfer
