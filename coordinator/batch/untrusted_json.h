// Reading JSON that a user wrote (one line of a job's input) without letting its shape hurt
// the coordinator, and naming parts of it in error messages.
//
// nlohmann's own parser copes with any depth, but copying, comparing or dump()ing a value
// recurses, so a value nested 30,000 levels deep overflows the stack later on; its
// ordered_json objects look keys up linearly, so an object with 100,000 keys takes minutes
// to build; and its lexer reads a NUL byte as the end of the input, so whatever follows one
// is dropped. ParseUntrustedJson refuses all three (and duplicate keys, which would silently
// keep one of two values), and DescribeJson / QuoteForMessage name a value in a few dozen
// bytes whatever its size or depth.
#ifndef DEEPINFER_COORDINATOR_BATCH_UNTRUSTED_JSON_H_
#define DEEPINFER_COORDINATOR_BATCH_UNTRUSTED_JSON_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace deepinfer {

// Deepest nesting of objects and lists accepted in one line. Requests need about 10 levels
// (a tool's JSON schema the most); the limit keeps every recursive walk of a value shallow.
inline constexpr int kMaxJsonDepth = 64;

// Parses `text` as exactly one JSON value. INVALID_ARGUMENT, with a message that says what
// and where (byte offsets count from 1; a syntax error's is where the parser noticed it),
// for: a NUL byte, nesting deeper than kMaxJsonDepth, a duplicate key in one object, data
// after the value, and anything not JSON (including invalid UTF-8 and numbers too large for
// a double).
absl::StatusOr<nlohmann::ordered_json> ParseUntrustedJson(absl::string_view text);

// A short description of `value` for an error message: scalars as JSON (strings cut to a few
// dozen bytes), lists and objects by kind and size, never their contents.
std::string DescribeJson(const nlohmann::ordered_json& value);

// `text` in single quotes, JSON-escaped and cut to a few dozen bytes, for naming a field or
// a role a user wrote.
std::string QuoteForMessage(absl::string_view text);

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_BATCH_UNTRUSTED_JSON_H_
