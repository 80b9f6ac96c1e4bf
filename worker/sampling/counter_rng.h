// CounterRng: Philox4x32-10, a counter-based random generator (Salmon et al., SC'11). The
// output is a pure function of (key, counter), so a request's random numbers depend only on its
// seed and the token position, never on which other requests share the batch or on threads.
#ifndef DEEPINFER_WORKER_SAMPLING_COUNTER_RNG_H_
#define DEEPINFER_WORKER_SAMPLING_COUNTER_RNG_H_

#include <array>
#include <cstdint>

namespace deepinfer {

class CounterRng {
 public:
  // Four 32-bit outputs for the 128-bit counter under the 64-bit key.
  static std::array<uint32_t, 4> Philox(uint64_t key, std::array<uint32_t, 4> ctr) {
    uint32_t k0 = static_cast<uint32_t>(key), k1 = static_cast<uint32_t>(key >> 32);
    for (int round = 0; round < 10; ++round) {
      uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * ctr[0];
      uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * ctr[2];
      ctr = {static_cast<uint32_t>(p1 >> 32) ^ ctr[1] ^ k0, static_cast<uint32_t>(p1),
             static_cast<uint32_t>(p0 >> 32) ^ ctr[3] ^ k1, static_cast<uint32_t>(p0)};
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    return ctr;
  }

  // Uniform in (0, 1] for (seed, position, index): 24 random bits, never 0 so -log(u) is finite.
  static float Uniform(uint64_t seed, int64_t position, int64_t index) {
    auto out = Philox(seed, {static_cast<uint32_t>(position),
                             static_cast<uint32_t>(static_cast<uint64_t>(position) >> 32),
                             static_cast<uint32_t>(index),
                             static_cast<uint32_t>(static_cast<uint64_t>(index) >> 32)});
    return static_cast<float>((out[0] >> 8) + 1) * (1.0f / 16777216.0f);
  }
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_SAMPLING_COUNTER_RNG_H_
