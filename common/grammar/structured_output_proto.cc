#include "common/grammar/structured_output_proto.h"

namespace deepinfer::grammar {

StructuredOutput FromProto(const StructuredOutputSpec& spec) {
  StructuredOutput out;
  switch (spec.kind()) {
    case StructuredOutputSpec::JSON_OBJECT:
      out.kind = StructuredOutput::Kind::kJsonObject;
      break;
    case StructuredOutputSpec::JSON_SCHEMA:
      out.kind = StructuredOutput::Kind::kJsonSchema;
      break;
    case StructuredOutputSpec::REGEX:
      out.kind = StructuredOutput::Kind::kRegex;
      break;
    case StructuredOutputSpec::CHOICE:
      out.kind = StructuredOutput::Kind::kChoice;
      break;
    case StructuredOutputSpec::GRAMMAR:
      out.kind = StructuredOutput::Kind::kGrammar;
      break;
    default:
      out.kind = StructuredOutput::Kind::kNone;
  }
  out.text = spec.text();
  out.choices.assign(spec.choices().begin(), spec.choices().end());
  return out;
}

}  // namespace deepinfer::grammar
