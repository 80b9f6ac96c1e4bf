#include "common/hash/sha256.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace deepinfer {
namespace {

// FIPS 180-2's examples (the same digests as coreutils' sha256sum).
TEST(Sha256Test, KnownDigests) {
  EXPECT_EQ(Sha256::Hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(Sha256::Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256::Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256Test, PiecesAndFilesGiveTheWholeDigest) {
  const std::string text(1000003, 'a');
  Sha256 h;
  for (size_t i = 0; i < text.size(); i += 4099) h.Update(absl::string_view(text).substr(i, 4099));
  const std::string digest = h.Finish();
  EXPECT_EQ(absl::BytesToHexString(digest), Sha256::Hex(text));
  const std::string path = absl::StrCat(std::getenv("TEST_TMPDIR"), "/a.txt");
  std::ofstream(path, std::ios::binary) << text;
  auto of_file = Sha256::OfFile(path);
  ASSERT_TRUE(of_file.ok()) << of_file.status();
  EXPECT_EQ(*of_file, digest);
  EXPECT_EQ(Sha256::OfFile(path + ".none").status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace deepinfer
