#include "tokenizer/test_tokenizer_json.h"

#include "tokenizer/utf8.h"

namespace deepinfer::tokenizer {

nlohmann::json TestTokenizerJson(const nlohmann::json& post_processor) {
  const ByteLevelAlphabet& alphabet = ByteLevelAlphabet::Get();
  nlohmann::json vocab = nlohmann::json::object();
  for (int b = 0; b < 256; ++b) vocab[alphabet.CharFor(static_cast<uint8_t>(b))] = b;
  const char* merged[] = {"he", "ll", "hell", "hello", "Ġw", "or", "Ġwor", "Ġworl", "Ġworld"};
  int id = 256;
  for (const char* token : merged) vocab[token] = id++;
  auto added = [](int token_id, const char* content, bool special, bool normalized, bool strip,
                  bool single_word) {
    return nlohmann::json{{"id", token_id},
                          {"content", content},
                          {"special", special},
                          {"normalized", normalized},
                          {"lstrip", strip},
                          {"rstrip", strip},
                          {"single_word", single_word}};
  };
  return nlohmann::json{
      {"version", "1.0"},
      {"added_tokens",
       {added(265, "<s>", true, false, false, false), added(266, "</s>", true, false, false, false),
        added(267, "<tool>", false, true, true, false),
        added(268, "[X]", false, false, false, true)}},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor", post_processor},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model",
       {{"type", "BPE"},
        {"vocab", vocab},
        {"merges",
         {"h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d"}}}}};
}

}  // namespace deepinfer::tokenizer
