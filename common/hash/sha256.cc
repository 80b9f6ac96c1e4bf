#include "common/hash/sha256.h"

#include <openssl/evp.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace deepinfer {

struct Sha256::Context {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : context_(std::make_unique<Context>()) {
  context_->ctx = EVP_MD_CTX_new();
  // Failing to set up SHA-256 means libcrypto itself is broken.
  if (context_->ctx == nullptr || EVP_DigestInit_ex(context_->ctx, EVP_sha256(), nullptr) != 1) {
    std::abort();
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(context_->ctx); }

void Sha256::Update(absl::string_view data) {
  EVP_DigestUpdate(context_->ctx, data.data(), data.size());
}

std::string Sha256::Finish() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int size = 0;
  EVP_DigestFinal_ex(context_->ctx, digest, &size);
  return std::string(reinterpret_cast<const char*>(digest), size);
}

std::string Sha256::Hex(absl::string_view data) {
  Sha256 h;
  h.Update(data);
  return absl::BytesToHexString(h.Finish());
}

absl::StatusOr<std::string> Sha256::OfFile(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot read '", path, "': ", std::strerror(errno)));
  }
  Sha256 h;
  std::vector<char> block(size_t{4} << 20);
  size_t n;
  while ((n = std::fread(block.data(), 1, block.size(), f)) > 0) h.Update({block.data(), n});
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return absl::DataLossError(absl::StrCat("error reading '", path, "'"));
  return h.Finish();
}

}  // namespace deepinfer
