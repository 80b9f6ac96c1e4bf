// PrefillAttention names.
#include "worker/model/attention/prefill_attention.h"

#include "absl/strings/str_cat.h"

namespace deepinfer {

absl::StatusOr<PrefillAttention> ParsePrefillAttention(const std::string& name) {
  if (name == "auto") return PrefillAttention::kAuto;
  if (name == "absorbed") return PrefillAttention::kAbsorbed;
  if (name == "mha") return PrefillAttention::kMha;
  return absl::InvalidArgumentError(
      absl::StrCat("prefill attention must be auto, absorbed or mha, got \"", name, "\""));
}

const char* PrefillAttentionName(PrefillAttention form) {
  switch (form) {
    case PrefillAttention::kAuto:
      return "auto";
    case PrefillAttention::kAbsorbed:
      return "absorbed";
    case PrefillAttention::kMha:
      return "mha";
  }
  return "?";
}

}  // namespace deepinfer
