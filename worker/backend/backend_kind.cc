#include "worker/backend/backend_kind.h"

#include "absl/strings/str_cat.h"

namespace deepinfer {

absl::Status CheckBackendBuilt(absl::string_view kind) {
  if (kind == "ascend") {
    return absl::UnimplementedError(absl::StrCat(
        "backend '", kind,
        "' is not built into this binary: the Ascend NPU backend is a design only, never built "
        "or tested (it needs the CANN toolkit and an NPU); see ascend/README.md"));
  }
  return absl::OkStatus();
}

}  // namespace deepinfer
