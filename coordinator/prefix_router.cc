// PrefixRouter: matching prompts' probe blocks against what the ranks hold.
#include "coordinator/prefix_router.h"

#include <algorithm>

namespace deepinfer {

void PrefixRouter::Reset(int world) {
  reported_.assign(std::max(0, world), {});
  recorded_.clear();
  recorded_order_.clear();
  leader_of_.clear();
  led_.clear();
}

void PrefixRouter::UpdateRank(const RankLoad& load) {
  if (load.rank() < 0 || load.rank() >= static_cast<int>(reported_.size())) return;
  if (load.prefix_cache_root() != 0 && load.prefix_cache_root() != root_) {
    // The first report of this group's cache key (or a new key): what was remembered under
    // another root cannot match.
    root_ = load.prefix_cache_root();
    recorded_.clear();
    recorded_order_.clear();
  }
  absl::flat_hash_set<uint64_t>& held = reported_[load.rank()];
  held.clear();
  if (load.prefix_cache_root() != root_) return;
  held.insert(load.cached_probe_hashes().begin(), load.cached_probe_hashes().end());
}

std::vector<PrefixProbe> PrefixRouter::Probes(const std::vector<int32_t>& prompt) const {
  if (!active() || prompt.empty()) return {};
  // A hit serves at most all but the last token.
  return PrefixProbes(root_, prompt, options_.block_size,
                      (static_cast<int64_t>(prompt.size()) - 1) / options_.block_size);
}

int32_t PrefixRouter::MatchedBlocks(int rank, const std::vector<PrefixProbe>& probes) const {
  for (auto p = probes.rbegin(); p != probes.rend(); ++p) {
    if (rank < static_cast<int>(reported_.size()) && reported_[rank].contains(p->hash)) {
      return p->block + 1;
    }
    auto r = recorded_.find(p->hash);
    if (r != recorded_.end() && r->second == rank) return p->block + 1;
  }
  return 0;
}

int PrefixRouter::Pick(const std::vector<PrefixProbe>& probes, const std::vector<int64_t>& tokens,
                       const std::vector<bool>& open) const {
  int least = -1;
  for (size_t r = 0; r < open.size(); ++r) {
    if (open[r] && (least < 0 || tokens[r] < tokens[least])) least = static_cast<int>(r);
  }
  if (least < 0 || !active() || probes.empty()) return least;
  int best = -1;
  int32_t best_blocks = 0;
  for (size_t r = 0; r < open.size(); ++r) {
    if (!open[r]) continue;
    const int32_t m = MatchedBlocks(static_cast<int>(r), probes);
    if (m > best_blocks || (m == best_blocks && m > 0 && tokens[r] < tokens[best])) {
      best = static_cast<int>(r);
      best_blocks = m;
    }
  }
  if (best < 0) return least;
  const double limit =
      options_.load_factor * static_cast<double>(tokens[least]) + options_.slack_tokens;
  return static_cast<double>(tokens[best]) <= limit ? best : least;
}

void PrefixRouter::Record(int rank, const std::vector<PrefixProbe>& probes) {
  for (const PrefixProbe& p : probes) {
    auto [it, fresh] = recorded_.insert_or_assign(p.hash, rank);
    if (fresh) recorded_order_.push_back(p.hash);
  }
  while (recorded_order_.size() > options_.max_recorded) {
    recorded_.erase(recorded_order_.front());
    recorded_order_.pop_front();
  }
}

const std::string* PrefixRouter::LeaderOf(const std::vector<PrefixProbe>& probes) const {
  if (!active()) return nullptr;
  for (const PrefixProbe& p : probes) {
    if (p.block < 1) continue;
    auto it = leader_of_.find(p.hash);
    if (it == leader_of_.end()) continue;
    // A rank that reports the probe cached has finished that prefill.
    bool reported = false;
    for (const auto& held : reported_) reported = reported || held.contains(p.hash);
    if (!reported) return &it->second;
  }
  return nullptr;
}

void PrefixRouter::Lead(const std::string& id, const std::vector<PrefixProbe>& probes,
                        int32_t from_block) {
  if (!active()) return;
  for (const PrefixProbe& p : probes) {
    if (p.block < std::max(1, from_block) || leader_of_.contains(p.hash)) continue;
    leader_of_[p.hash] = id;
    led_[id].push_back(p.hash);
  }
}

void PrefixRouter::EndLead(const std::string& id) {
  auto it = led_.find(id);
  if (it == led_.end()) return;
  for (uint64_t h : it->second) leader_of_.erase(h);
  led_.erase(it);
}

std::vector<std::string> PrefixRouter::leaders() const {
  std::vector<std::string> out;
  out.reserve(led_.size());
  for (const auto& [id, hashes] : led_) out.push_back(id);
  return out;
}

}  // namespace deepinfer
