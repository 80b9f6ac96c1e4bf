// ParallelDummyWeightSource: DummyWeightSource's formula, element ranges split over threads.
// parallel_dummy_weight_source_test checks that the values stay identical to DummyWeightSource.
#include "tools/bench/parallel_dummy_weight_source.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "worker/model/dtype_conversion.h"

namespace deepinfer {
namespace {

// out[i - begin] = DummyFillValue(fill, i) for i in [begin, end). Compiled per instruction set
// and picked at run time; the constant case is decided before the loop so that the compiler runs
// the Philox rounds as vector code (16 lanes with AVX-512; the values stay bit-identical).
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) void FillRange(
    const DummyFill& fill, int64_t begin, int64_t end, float* out) {
  if (fill.constant) {
    std::fill(out, out + (end - begin), fill.value);
    return;
  }
  const uint64_t key = fill.key;
  const float amplitude = fill.amplitude;
  for (int64_t i = begin; i < end; ++i) {
    out[i - begin] = (2.0f * CounterUniform(key, 0, i) - 1.0f) * amplitude;
  }
}

// The largest of the n values' magnitude bit patterns (sign cleared).
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) uint32_t AbsBitsMax(
    const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u;
    std::memcpy(&u, &x[i], sizeof(u));
    m = std::max(m, u & 0x7FFFFFFFu);
  }
  return m;
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
  ParallelFor(n, 1 << 16,
              [&](int64_t begin, int64_t end) { FillRange(recipe, begin, end, out + begin); });
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
  const DummyFill recipe = DummyTensorFill(seed_, name, shape);
  constexpr int64_t kBlock = 128;
  const int64_t block_rows = (rows + kBlock - 1) / kBlock,
                block_cols = (cols + kBlock - 1) / kBlock;
  Fp8Tensor t;
  t.data.resize(rows * cols);
  t.scales.resize(block_rows * block_cols);
  // Each thread makes whole 128-row strips: their values (in a buffer of its own, while they are
  // in cache), each block's largest magnitude, then the codes.
  ParallelFor(block_rows, 1, [&](int64_t first, int64_t last) {
    std::vector<float> strip(kBlock * cols);
    std::vector<uint32_t> amax_bits(block_cols);
    for (int64_t br = first; br < last; ++br) {
      const int64_t r0 = br * kBlock, strip_rows = std::min(rows, r0 + kBlock) - r0;
      FillRange(recipe, r0 * cols, (r0 + strip_rows) * cols, strip.data());
      // The magnitudes' bit patterns order as the magnitudes do (the values are finite), and an
      // integer maximum vectorises.
      std::fill(amax_bits.begin(), amax_bits.end(), 0u);
      for (int64_t r = 0; r < strip_rows; ++r) {
        const float* row = strip.data() + r * cols;
        for (int64_t bc = 0; bc < block_cols; ++bc) {
          const int64_t c0 = bc * kBlock, c1 = std::min(cols, c0 + kBlock);
          amax_bits[bc] = std::max(amax_bits[bc], AbsBitsMax(row + c0, c1 - c0));
        }
      }
      for (int64_t bc = 0; bc < block_cols; ++bc) {
        float amax;
        std::memcpy(&amax, &amax_bits[bc], sizeof(amax));
        t.scales[br * block_cols + bc] = amax > 0.0f ? amax / 448.0f : 1.0f;
      }
      for (int64_t r = 0; r < strip_rows; ++r) {
        for (int64_t bc = 0; bc < block_cols; ++bc) {
          const int64_t c0 = bc * kBlock, c1 = std::min(cols, c0 + kBlock);
          FloatsToF8E4M3(strip.data() + r * cols + c0, c1 - c0, t.scales[br * block_cols + bc],
                         t.data.data() + (r0 + r) * cols + c0);
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
