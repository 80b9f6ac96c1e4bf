// WeightStorage: names and the one-line description.
#include "worker/model/weight_storage.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace deepinfer {

const char* WeightStorageKindName(WeightStorageKind kind) {
  switch (kind) {
    case WeightStorageKind::kFloat:
      return "float";
    case WeightStorageKind::kFp8Block:
      return "fp8_block";
    case WeightStorageKind::kMxfp4:
      return "mxfp4";
    case WeightStorageKind::kGenerated:
      return "generated";
  }
  return "?";
}

std::string WeightStorage::ToString() const {
  std::string s = absl::StrCat(WeightStorageKindName(kind), " ", DTypeName(dtype), " [",
                               absl::StrJoin(stored_shape, ","), "]");
  if (stored_shape != shape) absl::StrAppend(&s, " -> [", absl::StrJoin(shape, ","), "]");
  if (scaled()) {
    absl::StrAppend(&s, ", scale '", scale_name, "' ", DTypeName(scale_dtype), " [",
                    absl::StrJoin(scale_shape, ","), "] per ", block_rows, "x", block_cols);
  }
  return s;
}

}  // namespace deepinfer
