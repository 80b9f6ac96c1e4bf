// CheckBackendBuilt: "ascend" is refused with one line that points to its design; other names
// are left to MakeBackend.
#include "worker/backend/backend_kind.h"

#include "gtest/gtest.h"

namespace deepinfer {
namespace {

TEST(BackendKindTest, AscendIsRefusedWithOneLinePointingToItsDesign) {
  const absl::Status s = CheckBackendBuilt("ascend");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented);
  const std::string message(s.message());
  EXPECT_EQ(message.rfind("backend 'ascend' is not built into this binary: ", 0), 0u) << message;
  EXPECT_NE(message.find("see ascend/README.md"), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << message;
}

TEST(BackendKindTest, OtherNamesAreLeftToTheFactory) {
  for (const char* kind : {"cpu", "cuda", "tpu", ""}) {
    EXPECT_TRUE(CheckBackendBuilt(kind).ok()) << kind;
  }
}

}  // namespace
}  // namespace deepinfer
