// Streaming detokenization: feed generated ids one at a time and get the new text for each,
// never a partial UTF-8 character or a U+FFFD that later bytes would complete (byte-level
// tokens and byte-fallback "<0xAB>" tokens can split a character across ids).
//
// It decodes a short window of recent ids twice (with and without the newest ones) and emits
// the difference once the window's text no longer ends in U+FFFD, the approach of HF TGI and
// vLLM. The window always starts at an id boundary where earlier text is final, so the
// concatenation of everything emitted plus Finish() equals Tokenizer::DecodeSkippingUnknown of
// all ids: an id the tokenizer does not know (a model may generate one, see there) adds no
// text, as in HF. Text that really ends in U+FFFD (invalid bytes, or a token that is U+FFFD) is
// held until the next id or Finish().
#ifndef TOKENIZER_INCREMENTAL_DECODER_H_
#define TOKENIZER_INCREMENTAL_DECODER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace deepinfer::tokenizer {

class IncrementalDecoder {
 public:
  // `tokenizer` must outlive this object.
  IncrementalDecoder(const Tokenizer* tokenizer, bool skip_special_tokens)
      : tokenizer_(tokenizer), skip_special_tokens_(skip_special_tokens) {}

  // Appends `id` and returns the text that became final (possibly empty).
  std::string Add(uint32_t id);

  // Returns the text still held back (an incomplete character decodes as U+FFFD, as one-shot
  // decoding does). Further Add calls continue after it.
  std::string Finish();

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_tokens_;
  std::vector<uint32_t> ids_;
  size_t prefix_offset_ = 0;  // the window starts here
  size_t read_offset_ = 0;    // text of ids_[prefix_offset_, read_offset_) was emitted
};

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_INCREMENTAL_DECODER_H_
