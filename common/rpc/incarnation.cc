#include "common/rpc/incarnation.h"

#include "absl/random/random.h"

namespace deepinfer {

uint64_t NewIncarnation() {
  // absl::BitGen is seeded from the OS entropy source, so two processes started in the
  // same instant still differ.
  absl::BitGen gen;
  uint64_t value = 0;
  while (value == 0) value = absl::Uniform<uint64_t>(gen);
  return value;
}

}  // namespace deepinfer
