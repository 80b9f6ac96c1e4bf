// JSON as grammars: any JSON object (OpenAI's response_format json_object) and the JSON text
// a JSON Schema admits (response_format json_schema, vLLM's `json` / guided_json).
//
// Supported keywords: type (one or a list), properties, required, additionalProperties (false,
// true or a schema; absent means true), enum, const, anyOf, oneOf (as anyOf: exclusivity is not
// enforced), allOf with one member, $ref into the document (#, #/$defs/..., #/definitions/...,
// any JSON pointer; recursion allowed), $defs/definitions, items, prefixItems, minItems,
// maxItems, minLength, maxLength, pattern (matched against the whole string), format (date,
// time, date-time, uuid, email), minimum, maximum, exclusiveMinimum, exclusiveMaximum (on
// integers any bound; on numbers integral bounds). Annotations (title, description, default,
// examples, $schema, $id, $comment, deprecated, readOnly, writeOnly) are accepted and change
// nothing. Any other keyword is an error naming it and where it is.
//
// The text generated is compact JSON with an optional single space after ',' and ':';
// properties come in the order the schema lists them, then any additional ones.
#ifndef DEEPINFER_COMMON_GRAMMAR_JSON_SCHEMA_GRAMMAR_H_
#define DEEPINFER_COMMON_GRAMMAR_JSON_SCHEMA_GRAMMAR_H_

#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"
#include "nlohmann/json.hpp"

namespace deepinfer::grammar {

// Any JSON object, whitespace as JSON allows it between tokens.
Grammar JsonObjectGrammar();

// INVALID_ARGUMENT naming the keyword or value at fault and its JSON pointer.
absl::StatusOr<Grammar> JsonSchemaGrammar(const nlohmann::ordered_json& schema);

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_JSON_SCHEMA_GRAMMAR_H_
