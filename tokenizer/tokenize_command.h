// The library behind `deepinfer tokenize --model DIR --input F.jsonl
// [--add-special-tokens=true|false]`: reads JSONL requests and writes one JSONL result per
// input line, in order.
//
//   {"text": "..."}                  -> {"ids": [...]}
//   {"messages": [...], "tools"?: [...]}
//                                    -> {"prompt": "<rendered>", "ids": [...]}
//
// Messages are rendered with the model's chat template and add_generation_prompt = true, then
// tokenized without adding special tokens (the template already has them). A bad line yields
// {"error": "line N: ..."} (also written to `err`) and does not stop the others.
#ifndef TOKENIZER_TOKENIZE_COMMAND_H_
#define TOKENIZER_TOKENIZE_COMMAND_H_

#include <istream>
#include <ostream>
#include <string>

#include "absl/status/status.h"

namespace deepinfer::tokenizer {

struct TokenizeOptions {
  std::string model_dir;           // holds tokenizer.json (+ tokenizer_config.json)
  bool add_special_tokens = true;  // for {"text"} lines (BOS per add_bos_token)
};

// Returns:
//   kNotFound / kInvalidArgument / kUnimplemented if the model's tokenizer cannot be loaded
//     (nothing is written to `out`; the message names the directory / problem);
//   kInvalidArgument "K of N input lines failed" if some lines failed (each has its error
//     line in `out`);
//   OK otherwise. The CLI should exit non-zero whenever the status is not OK.
absl::Status RunTokenizeCommand(const TokenizeOptions& options, std::istream& in, std::ostream& out,
                                std::ostream& err);

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_TOKENIZE_COMMAND_H_
