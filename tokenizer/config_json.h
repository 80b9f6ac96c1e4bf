// Helpers for reading tokenizer.json component objects: typed fields with clear errors, and
// the {"String": s} / {"Regex": r} pattern objects that Split and Replace share.
#ifndef TOKENIZER_CONFIG_JSON_H_
#define TOKENIZER_CONFIG_JSON_H_

#include <memory>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tokenizer/regex.h"

namespace deepinfer::tokenizer {

// A {"String": s} pattern becomes a regex matching s literally.
absl::StatusOr<std::unique_ptr<Regex>> CompilePatternJson(const nlohmann::json& pattern);

// Reads config[key] as a string; InvalidArgument naming `what` if absent or not a string.
absl::StatusOr<std::string> GetStringField(const nlohmann::json& config, const char* key,
                                           const char* what);

// config[key] as bool, `fallback` when absent or null.
bool GetBoolField(const nlohmann::json& config, const char* key, bool fallback);

}  // namespace deepinfer::tokenizer

#endif  // TOKENIZER_CONFIG_JSON_H_
