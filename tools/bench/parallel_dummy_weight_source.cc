// ParallelDummyWeightSource: DummyWeightSource's formula, element ranges split over threads.
// parallel_dummy_weight_source_test checks that the values stay identical to DummyWeightSource.
#include "tools/bench/parallel_dummy_weight_source.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"

namespace deepinfer {
namespace {

// out[i] for i in [begin, end). Compiled per instruction set and picked at run time: with
// AVX-512 the compiler runs the Philox rounds 16 lanes wide (about 3x faster than scalar, the
// values stay bit-identical).
__attribute__((target_clones("avx512f", "avx2", "default"))) void FillRange(
    const DummyFill& fill, int64_t begin, int64_t end, float* out) {
  for (int64_t i = begin; i < end; ++i) out[i] = DummyFillValue(fill, i);
}

}  // namespace

ParallelDummyWeightSource::ParallelDummyWeightSource(uint64_t seed, int num_threads)
    : seed_(seed),
      num_threads_(num_threads > 0 ? num_threads
                                   : std::max(1u, std::thread::hardware_concurrency())) {}

absl::Status ParallelDummyWeightSource::ReadFloat32(const std::string& name,
                                                    const std::vector<int64_t>& shape, float* out) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const DummyFill recipe = DummyTensorFill(seed_, name, shape);
  auto fill = [&](int64_t begin, int64_t end) { FillRange(recipe, begin, end, out); };
  const int64_t threads = std::min<int64_t>(num_threads_, std::max<int64_t>(1, n / (1 << 16)));
  if (threads <= 1) {
    fill(0, n);
    return absl::OkStatus();
  }
  std::vector<std::thread> workers;
  for (int64_t t = 0; t < threads; ++t) {
    workers.emplace_back(fill, n * t / threads, n * (t + 1) / threads);
  }
  for (std::thread& w : workers) w.join();
  return absl::OkStatus();
}

std::string ParallelDummyWeightSource::description() const {
  return absl::StrCat("dummy(seed=", seed_, ")");
}

}  // namespace deepinfer
