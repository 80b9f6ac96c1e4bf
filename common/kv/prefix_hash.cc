// Chain hashes: splitmix64's finaliser over the parent hash and the tokens.
#include "common/kv/prefix_hash.h"

#include <algorithm>

namespace deepinfer {
namespace {

// splitmix64's finaliser: every input bit moves about half of the output bits.
uint64_t Mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

}  // namespace

uint64_t PrefixBlockHash(uint64_t parent, const int32_t* tokens, int64_t n) {
  uint64_t h = Mix(parent ^ kGolden);
  for (int64_t i = 0; i < n; ++i) h = Mix(h + static_cast<uint32_t>(tokens[i]) + kGolden);
  return Mix(h ^ static_cast<uint64_t>(n));
}

uint64_t PrefixRootHash(const std::string& key) {
  uint64_t h = 14695981039346656037ull;  // FNV-1a, then mixed
  for (unsigned char c : key) h = (h ^ c) * 1099511628211ull;
  return Mix(h);
}

std::vector<PrefixProbe> PrefixProbes(uint64_t root, const std::vector<int32_t>& tokens,
                                      int32_t block_size, int64_t num_blocks) {
  std::vector<PrefixProbe> out;
  if (block_size <= 0) return out;
  const int64_t full =
      std::min<int64_t>(num_blocks, static_cast<int64_t>(tokens.size()) / block_size);
  uint64_t h = root;
  for (int64_t i = 0; i < full; ++i) {
    h = PrefixBlockHash(h, tokens.data() + i * block_size, block_size);
    if (IsPrefixProbeBlock(i)) out.push_back({static_cast<int32_t>(i), h});
  }
  return out;
}

}  // namespace deepinfer
