#include "worker/tokenizer/incremental_decoder.h"

#include "absl/strings/match.h"
#include "absl/types/span.h"

namespace deepinfer::tokenizer {
namespace {

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";

}  // namespace

absl::StatusOr<std::string> IncrementalDecoder::Add(uint32_t id) {
  ids_.push_back(id);
  const absl::Span<const uint32_t> all(ids_);
  auto emitted = tokenizer_->Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_),
                                    skip_special_tokens_);
  if (!emitted.ok()) return emitted.status();
  auto window = tokenizer_->Decode(all.subspan(prefix_offset_), skip_special_tokens_);
  if (!window.ok()) {
    ids_.pop_back();
    return window.status();
  }
  // Hold back while the newest bytes may be the start of a character, and in the (decoder
  // dependent) case that the window's text does not extend what was emitted.
  if (window->size() <= emitted->size() || absl::EndsWith(*window, kReplacementChar) ||
      !absl::StartsWith(*window, *emitted)) {
    return std::string();
  }
  std::string text = window->substr(emitted->size());
  prefix_offset_ = read_offset_;
  read_offset_ = ids_.size();
  return text;
}

absl::StatusOr<std::string> IncrementalDecoder::Finish() {
  const absl::Span<const uint32_t> all(ids_);
  auto emitted = tokenizer_->Decode(all.subspan(prefix_offset_, read_offset_ - prefix_offset_),
                                    skip_special_tokens_);
  if (!emitted.ok()) return emitted.status();
  auto window = tokenizer_->Decode(all.subspan(prefix_offset_), skip_special_tokens_);
  if (!window.ok()) return window.status();
  prefix_offset_ = read_offset_ = ids_.size();
  if (!absl::StartsWith(*window, *emitted)) return *window;  // decoder-specific; cannot split
  return window->substr(emitted->size());
}

}  // namespace deepinfer::tokenizer
