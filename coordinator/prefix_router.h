// PrefixRouter: where the coordinator sends a request so that its prompt's prefix is served
// from a rank's prefix cache instead of computed again (docs/kv-cache.md, "Routing").
//
// What a rank holds: each heartbeat's RankLoad carries the root hash of the rank's cache key
// and the chain hashes of the probe blocks it caches (common/kv/prefix_hash.h); the router also
// remembers the probes of the requests it sent to each rank (they will be cached there once
// prefilled). A request's probes (over all but its prompt's last token, what a hit can serve)
// are matched against each rank: the deepest probe a rank holds bounds its hit from below.
//
// Pick: the rank with the deepest match, unless its tokens in flight (the owner counts a
// request's prompt and max_tokens less the prefix the rank held for it) exceed load_factor x
// those of the least loaded rank + slack_tokens (then the least loaded: the prefix is
// computed again there, and that rank holds it from then on); the least loaded without any
// match.
//
// Groups: a request that shares at least two blocks with a request sent earlier whose prefill
// has not finished yet (its leader) waits until it has, so that it finds the prefix cached
// instead of computing it at the same time. The owner ends a lead (EndLead) once the leader
// generated a token, finished or went back to the queue; a lead also ends when a rank reports
// the led probe cached.
//
// Not thread-safe: the JobManager calls it under its lock.
#ifndef DEEPINFER_COORDINATOR_PREFIX_ROUTER_H_
#define DEEPINFER_COORDINATOR_PREFIX_ROUTER_H_

#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/kv/prefix_hash.h"
#include "proto/common.pb.h"

namespace deepinfer {

struct PrefixRouterOptions {
  // false: Pick is the least loaded rank, nobody waits for a leader.
  bool enabled = true;
  int32_t block_size = 16;
  // A rank holding the prefix takes the request while its tokens in flight are at most
  // load_factor x the least loaded rank's + slack_tokens.
  double load_factor = 1.25;
  int64_t slack_tokens = 2048;
  // Probes remembered from dispatches (oldest forgotten first).
  size_t max_recorded = 1 << 16;
};

class PrefixRouter {
 public:
  explicit PrefixRouter(PrefixRouterOptions options) : options_(options) {}

  // A new group of `world` ranks: forgets what the old one held.
  void Reset(int world);
  // A rank's heartbeat (RankLoad::prefix_cache_root 0: the rank does not cache prefixes).
  void UpdateRank(const RankLoad& load);
  // Whether routing by prefix is on and the ranks' cache key is known.
  bool active() const { return options_.enabled && root_ != 0; }
  uint64_t root() const { return root_; }

  // The probes of a prompt's blocks that a hit can serve (empty when not active()).
  std::vector<PrefixProbe> Probes(const std::vector<int32_t>& prompt) const;
  // Blocks of the prompt rank `rank` is known to hold: the deepest matching probe's + 1.
  int32_t MatchedBlocks(int rank, const std::vector<PrefixProbe>& probes) const;
  // The rank for a request with `probes`, among those with open[r]; `tokens`: each rank's
  // tokens in flight. -1 when no rank is open.
  int Pick(const std::vector<PrefixProbe>& probes, const std::vector<int64_t>& tokens,
           const std::vector<bool>& open) const;
  // The request was sent to `rank`: the rank will hold its probes.
  void Record(int rank, const std::vector<PrefixProbe>& probes);

  // The id of a leader still prefilling a prefix of at least two blocks of `probes`, or null.
  const std::string* LeaderOf(const std::vector<PrefixProbe>& probes) const;
  // Request `id` leads the probes of `probes` from block max(from_block, 1) on that nobody
  // leads yet (from_block: the blocks its rank is known to hold, which it does not compute).
  void Lead(const std::string& id, const std::vector<PrefixProbe>& probes, int32_t from_block);
  void EndLead(const std::string& id);
  std::vector<std::string> leaders() const;

 private:
  const PrefixRouterOptions options_;
  uint64_t root_ = 0;
  std::vector<absl::flat_hash_set<uint64_t>> reported_;  // per rank, from its heartbeat
  absl::flat_hash_map<uint64_t, int> recorded_;          // probe hash -> rank it was sent to
  std::deque<uint64_t> recorded_order_;
  absl::flat_hash_map<uint64_t, std::string> leader_of_;
  absl::flat_hash_map<std::string, std::vector<uint64_t>> led_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_COORDINATOR_PREFIX_ROUTER_H_
