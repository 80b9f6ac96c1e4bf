#include "tokenizer/config_json.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deepinfer::tokenizer {

absl::StatusOr<std::unique_ptr<Regex>> CompilePatternJson(const nlohmann::json& pattern) {
  if (pattern.is_object()) {
    auto it = pattern.find("Regex");
    if (it != pattern.end() && it->is_string()) return Regex::Compile(it->get<std::string>());
    it = pattern.find("String");
    if (it != pattern.end() && it->is_string()) {
      // \Q..\E quotes everything except a literal "\E", which is spliced in separately.
      const std::string literal = it->get<std::string>();
      std::string quoted = "\\Q";
      for (size_t i = 0; i < literal.size(); ++i) {
        if (literal.compare(i, 2, "\\E") == 0) {
          quoted += "\\E\\\\E\\Q";
          ++i;
        } else {
          quoted += literal[i];
        }
      }
      quoted += "\\E";
      return Regex::Compile(quoted);
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pattern must be {\"String\": ...} or {\"Regex\": ...}, got ", pattern.dump()));
}

absl::StatusOr<std::string> GetStringField(const nlohmann::json& config, const char* key,
                                           const char* what) {
  auto it = config.find(key);
  if (it == config.end() || !it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": missing string field '", key, "'"));
  }
  return it->get<std::string>();
}

bool GetBoolField(const nlohmann::json& config, const char* key, bool fallback) {
  auto it = config.find(key);
  return it != config.end() && it->is_boolean() ? it->get<bool>() : fallback;
}

}  // namespace deepinfer::tokenizer
