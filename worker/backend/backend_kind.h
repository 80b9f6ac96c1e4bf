// CheckBackendBuilt: the one answer every binary gives for a --backend whose design is in this
// source tree but which no build contains (today "ascend": ascend/README.md). Apart from
// backend_factory, which links the backends themselves, so that the CLI (which links none)
// refuses such a name with the same line before it starts any process.
#ifndef DEEPINFER_WORKER_BACKEND_BACKEND_KIND_H_
#define DEEPINFER_WORKER_BACKEND_BACKEND_KIND_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace deepinfer {

// UNIMPLEMENTED for a backend that exists only as a design ("ascend"), with a one-line message
// that says so and points to the design; OK for every other name (whether this binary can make
// that backend is MakeBackend's answer).
absl::Status CheckBackendBuilt(absl::string_view kind);

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_BACKEND_KIND_H_
