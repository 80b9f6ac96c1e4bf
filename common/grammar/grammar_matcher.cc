#include "common/grammar/grammar_matcher.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "glog/logging.h"

namespace deepinfer::grammar {

int32_t FrameStore::Intern(int32_t node, int32_t parent) {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) | static_cast<uint32_t>(parent);
  auto [it, inserted] = ids_.try_emplace(key, static_cast<int32_t>(frames_.size()));
  if (inserted) frames_.push_back({node, parent});
  return it->second;
}

void FrameStore::Truncate(int32_t size) {
  while (static_cast<int32_t>(frames_.size()) > size) {
    const Frame& f = frames_.back();
    ids_.erase((static_cast<uint64_t>(static_cast<uint32_t>(f.node)) << 32) |
               static_cast<uint32_t>(f.parent));
    frames_.pop_back();
  }
}

void StackWalker::Close(int32_t frame, StackSet* out) {
  work_.clear();
  work_.push_back(frame);
  while (!work_.empty()) {
    const int32_t f = work_.back();
    work_.pop_back();
    if (static_cast<size_t>(f) >= seen_.size()) seen_.resize(store_->size() * 2 + 64, 0);
    if (seen_[f] == stamp_) continue;
    seen_[f] = stamp_;
    const int32_t node = store_->node(f);
    const int32_t parent = store_->parent(f);
    if (grammar_.has_byte_edges(node)) out->tops.push_back(f);
    for (const CallEdge* e = grammar_.call_edges_begin(node); e != grammar_.call_edges_end(node);
         ++e) {
      const int32_t ret = store_->Intern(e->target, parent);
      work_.push_back(store_->Intern(grammar_.rule_start(e->rule), ret));
    }
    if (grammar_.node(node).final) {
      if (parent == FrameStore::kRootParent) {
        out->complete = true;
      } else if (parent == FrameStore::kOpenParent) {
        out->open_bottom = true;
      } else {
        work_.push_back(parent);
      }
    }
  }
}

void StackWalker::Start(int32_t frame, StackSet* out) {
  out->tops.clear();
  out->complete = out->open_bottom = false;
  ++stamp_;
  Close(frame, out);
}

void StackWalker::Advance(const StackSet& in, uint8_t byte, StackSet* out) {
  out->tops.clear();
  out->complete = out->open_bottom = false;
  ++stamp_;
  for (int32_t f : in.tops) {
    const int32_t node = store_->node(f);
    for (const ByteEdge* e = grammar_.byte_edges_begin(node); e != grammar_.byte_edges_end(node);
         ++e) {
      if (e->lo > byte) break;
      if (byte <= e->hi) Close(store_->Intern(e->target, store_->parent(f)), out);
    }
  }
}

TokenMaskCache::TokenMaskCache(std::shared_ptr<const CompiledGrammar> grammar,
                               std::shared_ptr<const TokenVocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {
  absl::MutexLock lock(&mu_);
  entries_.resize(grammar_->num_nodes());
}

const NodeTokenMasks* TokenMaskCache::Get(int32_t node) {
  {
    absl::MutexLock lock(&mu_);
    if (entries_[node] != nullptr) return entries_[node].get();
  }
  std::unique_ptr<NodeTokenMasks> computed = Compute(node);
  absl::MutexLock lock(&mu_);
  if (entries_[node] == nullptr) entries_[node] = std::move(computed);
  return entries_[node].get();
}

void TokenMaskCache::FillAll() {
  for (int32_t n = 0; n < grammar_->num_nodes(); ++n) {
    if (grammar_->has_byte_edges(n)) Get(n);
  }
}

namespace {

// The stack sets one cache walk reaches, numbered, with transitions computed on first use: a
// lazily built DFA over the walk, so each (set, byte) pair is advanced once however many
// tokens pass through it.
class StackSetDfa {
 public:
  StackSetDfa(const CompiledGrammar& grammar, int32_t node) : walker_(grammar, &store_) {
    StackSet start;
    start.tops.push_back(store_.Intern(node, FrameStore::kOpenParent));
    Intern(std::move(start));
  }

  int32_t Next(int32_t set, uint8_t byte) {
    if (set < kDenseSets) {
      const int32_t next = next_[set * 256 + byte];
      if (next >= 0) return next;
      const int32_t id = Compute(set, byte);
      next_[set * 256 + byte] = id;  // next_ may have grown
      return id;
    }
    const uint64_t key = (static_cast<uint64_t>(set) << 8) | byte;
    auto it = sparse_next_.find(key);
    if (it != sparse_next_.end()) return it->second;
    const int32_t id = Compute(set, byte);
    sparse_next_.emplace(key, id);
    return id;
  }
  bool has_tops(int32_t set) const { return !sets_[set].tops.empty(); }
  bool open_bottom(int32_t set) const { return sets_[set].open_bottom; }

 private:
  // Transitions of the first kDenseSets sets are a table (1 KiB a set); later ones, which
  // only grammars with many distinct stack sets reach, go to a map sized by what is used.
  static constexpr int32_t kDenseSets = 4096;

  int32_t Compute(int32_t set, uint8_t byte) {
    walker_.Advance(sets_[set], byte, &scratch_);
    return Intern(scratch_);
  }

  int32_t Intern(StackSet set) {
    std::sort(set.tops.begin(), set.tops.end());
    key_.assign(set.tops.begin(), set.tops.end());
    key_.push_back(set.open_bottom ? -1 : -2);
    auto [it, inserted] = ids_.try_emplace(key_, static_cast<int32_t>(sets_.size()));
    if (inserted) {
      sets_.push_back(std::move(set));
      if (sets_.size() <= static_cast<size_t>(kDenseSets)) next_.resize(sets_.size() * 256, -1);
    }
    return it->second;
  }

  FrameStore store_;
  StackWalker walker_;
  std::vector<StackSet> sets_;
  std::vector<int32_t> next_;
  absl::flat_hash_map<uint64_t, int32_t> sparse_next_;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> ids_;
  std::vector<int32_t> key_;
  StackSet scratch_;
};

}  // namespace

// Walks the vocabulary in byte order from a lone stack top on `node` whose lower part is open.
// Tokens sharing a prefix reuse the stack sets computed for it; once a prefix leaves no stack,
// every token extending it gets the same verdict without a walk.
std::unique_ptr<NodeTokenMasks> TokenMaskCache::Compute(int32_t node) const {
  const TokenVocabulary& vocab = *vocabulary_;
  const std::vector<int32_t>& sorted = vocab.sorted();
  const std::vector<uint16_t>& common = vocab.common_prefix();
  const ByteSet& follow = grammar_->follow(grammar_->node(node).rule);

  StackSetDfa dfa(*grammar_, node);
  std::vector<int32_t> depth(1, 0);  // depth[d]: the set after the first d bytes
  // undecided_upto[d]: some prefix shorter than d popped below the open bottom with the next
  // byte in the rule's follow set.
  std::vector<char> undecided_upto(1, 0);

  auto out = std::make_unique<NodeTokenMasks>();
  std::vector<int32_t> accepted;
  int32_t valid = 0;              // depth[0..valid] hold the previous token's prefixes
  size_t dead_length = SIZE_MAX;  // the previous token's shortest prefix that left no stack
  bool dead_undecided = false;    // that token's verdict
  for (size_t k = 0; k < sorted.size(); ++k) {
    const int32_t token = sorted[k];
    const absl::string_view bytes = vocab.sorted_bytes(k);
    const size_t shared = k == 0 ? 0 : common[k];
    if (shared >= dead_length) {
      if (dead_undecided) out->undecided_ids.push_back(token);
      continue;
    }
    dead_length = SIZE_MAX;
    size_t d = std::min<size_t>(shared, valid);
    if (depth.size() < bytes.size() + 1) {
      depth.resize(bytes.size() + 1);
      undecided_upto.resize(bytes.size() + 1, 0);
    }
    bool dead = false;
    for (; d < bytes.size(); ++d) {
      const uint8_t b = static_cast<uint8_t>(bytes[d]);
      undecided_upto[d + 1] = undecided_upto[d] || (dfa.open_bottom(depth[d]) && follow.test(b));
      depth[d + 1] = dfa.Next(depth[d], b);
      valid = static_cast<int32_t>(d + 1);
      if (dfa.has_tops(depth[d + 1]) || d + 1 == bytes.size()) continue;
      // No stack is left inside the node's context. Tokens extending this prefix share the
      // verdict; when the prefix ends by popping below the open bottom, the verdict also
      // depends on the next byte, so only tokens sharing that byte too share it.
      dead = true;
      if (dfa.open_bottom(depth[d + 1])) {
        dead_length = d + 2;
        dead_undecided = undecided_upto[d + 1] || follow.test(static_cast<uint8_t>(bytes[d + 1]));
      } else {
        dead_length = d + 1;
        dead_undecided = undecided_upto[d + 1];
      }
      break;
    }
    const int32_t last = depth[bytes.size()];
    if (!dead && !dfa.has_tops(last) && !dfa.open_bottom(last)) {
      dead = true;
      dead_length = bytes.size();
      dead_undecided = undecided_upto[bytes.size()];
    }
    if (!dead) {
      accepted.push_back(token);
    } else if (dead_undecided) {
      out->undecided_ids.push_back(token);
    }
  }
  if (accepted.size() * 32 >= static_cast<size_t>(vocab.size())) {
    out->accepted_bits.assign(vocab.mask_words(), 0);
    for (int32_t t : accepted) out->accepted_bits[t >> 5] |= 1u << (t & 31);
  } else {
    out->accepted_ids = std::move(accepted);
  }
  return out;
}

GrammarMatcher::GrammarMatcher(std::shared_ptr<TokenMaskCache> cache)
    : cache_(std::move(cache)), walker_(cache_->grammar(), &store_) {
  State start;
  const CompiledGrammar& g = cache_->grammar();
  walker_.Start(store_.Intern(g.rule_start(g.root_rule()), FrameStore::kRootParent), &start.stacks);
  start.store_size = store_.size();
  history_.push_back(std::move(start));
}

bool GrammarMatcher::AcceptBytes(absl::string_view bytes) {
  if (IsTerminated()) return false;
  const int32_t mark = store_.size();
  scratch_a_ = history_.back().stacks;
  for (char c : bytes) {
    walker_.Advance(scratch_a_, static_cast<uint8_t>(c), &scratch_b_);
    std::swap(scratch_a_, scratch_b_);
    if (scratch_a_.tops.empty() && !scratch_a_.complete) {
      store_.Truncate(mark);
      return false;
    }
  }
  State next;
  next.stacks = scratch_a_;
  next.store_size = store_.size();
  history_.push_back(std::move(next));
  return true;
}

bool GrammarMatcher::AcceptToken(int32_t token) {
  const TokenVocabulary& vocab = cache_->vocabulary();
  if (token < 0 || token >= vocab.size() || IsTerminated()) return false;
  if (vocab.is_stop(token)) {
    if (!IsComplete()) return false;
    State next = history_.back();
    next.terminated = true;
    history_.push_back(std::move(next));
    return true;
  }
  const std::string& bytes = vocab.bytes(token);
  if (bytes.empty()) return false;
  return AcceptBytes(bytes);
}

bool GrammarMatcher::TokenFitsFrom(int32_t frame, const std::string& bytes) {
  scratch_a_.tops.assign(1, frame);
  scratch_a_.complete = scratch_a_.open_bottom = false;
  for (char c : bytes) {
    walker_.Advance(scratch_a_, static_cast<uint8_t>(c), &scratch_b_);
    std::swap(scratch_a_, scratch_b_);
    if (scratch_a_.tops.empty() && !scratch_a_.complete) return false;
  }
  return true;
}

void GrammarMatcher::FillNextTokenBitmask(uint32_t* words) {
  const TokenVocabulary& vocab = cache_->vocabulary();
  const int32_t num_words = vocab.mask_words();
  std::memset(words, 0, sizeof(uint32_t) * num_words);
  const State& state = history_.back();
  if (state.terminated) {
    for (int32_t t : vocab.stop_tokens()) words[t >> 5] |= 1u << (t & 31);
    return;
  }
  std::vector<const NodeTokenMasks*> masks(state.stacks.tops.size());
  std::vector<int32_t> nodes_done;
  for (size_t i = 0; i < state.stacks.tops.size(); ++i) {
    const int32_t node = store_.node(state.stacks.tops[i]);
    masks[i] = cache_->Get(node);
    if (std::find(nodes_done.begin(), nodes_done.end(), node) != nodes_done.end()) continue;
    nodes_done.push_back(node);
    if (!masks[i]->accepted_bits.empty()) {
      const uint32_t* bits = masks[i]->accepted_bits.data();
      for (int32_t w = 0; w < num_words; ++w) words[w] |= bits[w];
    } else {
      for (int32_t t : masks[i]->accepted_ids) words[t >> 5] |= 1u << (t & 31);
    }
  }
  const int32_t mark = store_.size();
  for (size_t i = 0; i < state.stacks.tops.size(); ++i) {
    for (int32_t t : masks[i]->undecided_ids) {
      if (words[t >> 5] & (1u << (t & 31))) continue;
      if (TokenFitsFrom(state.stacks.tops[i], vocab.bytes(t))) words[t >> 5] |= 1u << (t & 31);
    }
    store_.Truncate(mark);
  }
  if (state.stacks.complete) {
    for (int32_t t : vocab.stop_tokens()) words[t >> 5] |= 1u << (t & 31);
  }
}

void GrammarMatcher::Rollback(int32_t tokens) {
  CHECK_GE(tokens, 0);
  CHECK_LE(tokens, NumAcceptedTokens());
  history_.resize(history_.size() - tokens);
  store_.Truncate(history_.back().store_size);
}

}  // namespace deepinfer::grammar
