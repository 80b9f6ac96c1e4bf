// Chain hashes of KV cache blocks (docs/kv-cache.md). A full block of a sequence is known by
// the hash of its parent's chain hash (for the first block, the root hash of the cache key) and
// its tokens, so equal hashes mean equal prefixes up to that block (but for 64-bit collisions,
// which the prefix cache rules out by comparing tokens). The worker's PrefixCache keys its
// blocks by these; the coordinator computes them for prompts to route a request to the rank
// that holds its prefix.
//
// Probe blocks: the blocks at index 2^k - 1 (0, 1, 3, 7, 15, ...) of a sequence. Ranks report
// the hashes of the probe blocks they cache, a compact summary of the prefixes they hold (a
// prefix of n blocks has about log2(n) of them), and the coordinator matches a prompt's probe
// hashes against it: the deepest match bounds the prompt's cached prefix from below.
#ifndef DEEPINFER_COMMON_KV_PREFIX_HASH_H_
#define DEEPINFER_COMMON_KV_PREFIX_HASH_H_

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer {

// The chain hash of a block of `n` tokens after a block whose chain hash is `parent`.
uint64_t PrefixBlockHash(uint64_t parent, const int32_t* tokens, int64_t n);
// The root of the chains of a cache key.
uint64_t PrefixRootHash(const std::string& key);

// Whether block index `i` (0-based) is a probe block.
inline bool IsPrefixProbeBlock(int64_t i) { return i >= 0 && ((i + 1) & i) == 0; }

struct PrefixProbe {
  int32_t block = 0;  // index of the block in the sequence
  uint64_t hash = 0;
};

// The probe blocks among the first `num_blocks` full blocks of `tokens` (of `block_size`
// tokens each), in order.
std::vector<PrefixProbe> PrefixProbes(uint64_t root, const std::vector<int32_t>& tokens,
                                      int32_t block_size, int64_t num_blocks);

}  // namespace deepinfer

#endif  // DEEPINFER_COMMON_KV_PREFIX_HASH_H_
