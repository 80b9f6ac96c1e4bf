// A small byte-level BPE tokenizer.json for unit tests (the real DeepSeek-V3 one is only used
// by the parity tests in tests/tokenizer/).
//
// Vocabulary: the 256 byte-level characters (ids 0..255, by byte value) plus merged tokens
// "he"=256 "ll"=257 "hell"=258 "hello"=259 "Ġw"=260 "or"=261 "Ġwor"=262 "Ġworl"=263
// "Ġworld"=264. Added tokens: "<s>"=265 and "</s>"=266 (special), "<tool>"=267 (normalized,
// lstrip, rstrip), "[X]"=268 (single_word).
#ifndef TOKENIZER_TEST_TOKENIZER_JSON_H_
#define TOKENIZER_TEST_TOKENIZER_JSON_H_

#include <string>

#include "nlohmann/json.hpp"

namespace deepinfer::tokenizer {

// `post_processor` replaces the default (null) post-processor.
nlohmann::json TestTokenizerJson(const nlohmann::json& post_processor = nullptr);

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_TEST_TOKENIZER_JSON_H_
