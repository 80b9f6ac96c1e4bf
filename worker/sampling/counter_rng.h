// CounterRng: Philox4x32-10, a counter-based random generator (Salmon et al., SC'11). The
// output is a pure function of (key, counter), so a request's random numbers depend only on its
// seed and the token position, never on which other requests share the batch or on threads.
//
// One definition for the host and the device: compiled by nvcc the core functions are
// __host__ __device__, so Sampler (host) and kernels/sampling:sample (device) draw bit-identical
// uniforms. The arithmetic is 32x32->64 integer products, xors and one exact int->float
// conversion times a power of two, so no rounding mode or contraction can make them differ.
#ifndef DEEPINFER_WORKER_SAMPLING_COUNTER_RNG_H_
#define DEEPINFER_WORKER_SAMPLING_COUNTER_RNG_H_

#include <array>
#include <cstdint>

#if defined(__CUDACC__)
#define DEEPINFER_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define DEEPINFER_HOST_DEVICE inline
#endif

namespace deepinfer {

// Philox4x32-10 in place on ctr[0..3] under the 64-bit key.
DEEPINFER_HOST_DEVICE void Philox4x32(uint64_t key, uint32_t ctr[4]) {
  uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * ctr[0];
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * ctr[2];
    const uint32_t c0 = static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ k0;
    const uint32_t c2 = static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ k1;
    ctr[0] = c0;
    ctr[1] = static_cast<uint32_t>(p1);
    ctr[2] = c2;
    ctr[3] = static_cast<uint32_t>(p0);
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
}

// Uniform in (0, 1] for (seed, position, index): 24 random bits, never 0 so -log(u) is finite.
DEEPINFER_HOST_DEVICE float CounterUniform(uint64_t seed, int64_t position, int64_t index) {
  uint32_t ctr[4] = {
      static_cast<uint32_t>(position), static_cast<uint32_t>(static_cast<uint64_t>(position) >> 32),
      static_cast<uint32_t>(index), static_cast<uint32_t>(static_cast<uint64_t>(index) >> 32)};
  Philox4x32(seed, ctr);
  return static_cast<float>((ctr[0] >> 8) + 1) * (1.0f / 16777216.0f);
}

class CounterRng {
 public:
  // Four 32-bit outputs for the 128-bit counter under the 64-bit key (host only).
  static std::array<uint32_t, 4> Philox(uint64_t key, std::array<uint32_t, 4> ctr) {
    Philox4x32(key, ctr.data());
    return ctr;
  }

  // Uniform in (0, 1] for (seed, position, index); see CounterUniform.
  static DEEPINFER_HOST_DEVICE float Uniform(uint64_t seed, int64_t position, int64_t index) {
    return CounterUniform(seed, position, index);
  }
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_SAMPLING_COUNTER_RNG_H_
