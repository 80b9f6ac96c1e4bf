#include "tokenizer/incremental_decoder.h"

#include "absl/strings/match.h"
#include "absl/types/span.h"

namespace deepinfer::tokenizer {
namespace {

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";

}  // namespace

std::string IncrementalDecoder::Add(uint32_t id) {
  ids_.push_back(id);
  const absl::Span<const uint32_t> all(ids_);
  const std::string emitted = tokenizer_->DecodeSkippingUnknown(
      all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_tokens_);
  const std::string window =
      tokenizer_->DecodeSkippingUnknown(all.subspan(prefix_offset_), skip_special_tokens_);
  // Hold back while the newest bytes may be the start of a character, and in the (decoder
  // dependent) case that the window's text does not extend what was emitted.
  if (window.size() <= emitted.size() || absl::EndsWith(window, kReplacementChar) ||
      !absl::StartsWith(window, emitted)) {
    return std::string();
  }
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return window.substr(emitted.size());
}

std::string IncrementalDecoder::Finish() {
  const absl::Span<const uint32_t> all(ids_);
  const std::string emitted = tokenizer_->DecodeSkippingUnknown(
      all.subspan(prefix_offset_, read_offset_ - prefix_offset_), skip_special_tokens_);
  std::string window =
      tokenizer_->DecodeSkippingUnknown(all.subspan(prefix_offset_), skip_special_tokens_);
  prefix_offset_ = read_offset_ = ids_.size();
  if (!absl::StartsWith(window, emitted)) return window;  // decoder-specific; cannot split
  return window.substr(emitted.size());
}

}  // namespace deepinfer::tokenizer
