// ParallelDummyWeightSource: DummyWeightSource's formula, element ranges split over threads.
// parallel_dummy_weight_source_test checks that the values stay identical to DummyWeightSource.
#include "tools/bench/parallel_dummy_weight_source.h"

#include <algorithm>
#include <cmath>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace {

// out[i] for i in [begin, end). Compiled per instruction set and picked at run time: with
// AVX-512 the compiler runs the Philox rounds 16 lanes wide (about 3x faster than scalar, the
// values stay bit-identical).
__attribute__((target_clones("avx512f", "avx2", "default"))) void FillRange(const DummyFill& fill,
                                                                            int64_t begin,
                                                                            int64_t end,
                                                                            float* out) {
  for (int64_t i = begin; i < end; ++i) out[i] = DummyFillValue(fill, i);
}

}  // namespace

ParallelDummyWeightSource::ParallelDummyWeightSource(uint64_t seed, int num_threads,
                                                     bool fp8_matrices)
    : seed_(seed),
      num_threads_(num_threads > 0 ? num_threads
                                   : std::max(1u, std::thread::hardware_concurrency())),
      fp8_matrices_(fp8_matrices) {}

template <typename F>
void ParallelDummyWeightSource::ParallelFor(int64_t n, int64_t grain, const F& f) const {
  const int64_t threads = std::min<int64_t>(num_threads_, std::max<int64_t>(1, n / grain));
  if (threads <= 1) {
    f(0, n);
    return;
  }
  std::vector<std::thread> workers;
  for (int64_t t = 0; t < threads; ++t) {
    workers.emplace_back(f, n * t / threads, n * (t + 1) / threads);
  }
  for (std::thread& w : workers) w.join();
}

absl::Status ParallelDummyWeightSource::ReadFloat32(const std::string& name,
                                                    const std::vector<int64_t>& shape, float* out) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  const DummyFill recipe = DummyTensorFill(seed_, name, shape);
  ParallelFor(n, 1 << 16, [&](int64_t begin, int64_t end) { FillRange(recipe, begin, end, out); });
  return absl::OkStatus();
}

bool ParallelDummyWeightSource::IsFp8MatrixName(const std::string& name) {
  return (absl::EndsWith(name, "_proj.weight") || absl::EndsWith(name, "_proj_with_mqa.weight")) &&
         !absl::EndsWith(name, "kv_b_proj.weight");
}

absl::StatusOr<std::optional<WeightSource::Fp8Tensor>> ParallelDummyWeightSource::ReadFp8(
    const std::string& name, const std::vector<int64_t>& shape) {
  if (!StoresFp8(name) || shape.size() != 2) return std::nullopt;
  const int64_t rows = shape[0], cols = shape[1];
  std::vector<float> values(rows * cols);
  if (absl::Status st = ReadFloat32(name, shape, values.data()); !st.ok()) return st;
  constexpr int64_t kBlock = 128;
  const int64_t block_rows = (rows + kBlock - 1) / kBlock,
                block_cols = (cols + kBlock - 1) / kBlock;
  Fp8Tensor t;
  t.data.resize(rows * cols);
  t.scales.resize(block_rows * block_cols);
  ParallelFor(block_rows, 1, [&](int64_t first, int64_t last) {
    for (int64_t br = first; br < last; ++br) {
      const int64_t r1 = std::min(rows, (br + 1) * kBlock);
      for (int64_t bc = 0; bc < block_cols; ++bc) {
        const int64_t c0 = bc * kBlock, c1 = std::min(cols, c0 + kBlock);
        float amax = 0.0f;
        for (int64_t r = br * kBlock; r < r1; ++r) {
          for (int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(values[r * cols + c]));
        }
        const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
        t.scales[br * block_cols + bc] = scale;
        for (int64_t r = br * kBlock; r < r1; ++r) {
          for (int64_t c = c0; c < c1; ++c) {
            t.data[r * cols + c] = FloatToF8E4M3(values[r * cols + c] / scale);
          }
        }
      }
    }
  });
  return std::optional<Fp8Tensor>(std::move(t));
}

std::string ParallelDummyWeightSource::description() const {
  return absl::StrCat("dummy(seed=", seed_, ")");
}

}  // namespace deepinfer
