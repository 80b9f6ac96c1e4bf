// StructuredOutputSpec (proto/common.proto, what requests carry between the daemons) to the
// grammar library's StructuredOutput.
#ifndef DEEPINFER_COMMON_GRAMMAR_STRUCTURED_OUTPUT_PROTO_H_
#define DEEPINFER_COMMON_GRAMMAR_STRUCTURED_OUTPUT_PROTO_H_

#include "common/grammar/structured_output.h"
#include "proto/common.pb.h"

namespace deepinfer::grammar {

StructuredOutput FromProto(const StructuredOutputSpec& spec);

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_STRUCTURED_OUTPUT_PROTO_H_
