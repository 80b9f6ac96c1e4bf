#include "common/grammar/grammar_matcher.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
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
      const int32_t ret = store_->Intern(Canonical(e->target), parent);
      work_.push_back(store_->Intern(Canonical(grammar_.rule_start(e->rule)), ret));
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
      if (byte <= e->hi) Close(store_->Intern(Canonical(e->target), store_->parent(f)), out);
    }
  }
}

TokenMaskCache::TokenMaskCache(std::shared_ptr<const CompiledGrammar> grammar,
                               std::shared_ptr<const TokenVocabulary> vocabulary)
    : grammar_(std::move(grammar)), vocabulary_(std::move(vocabulary)) {
  // Nodes of one rule with the same final flag and the same edges (the loop of a string and
  // its entry, after epsilon elimination) start the same walk: they share one entry.
  const int32_t n = grammar_->num_nodes();
  representative_.resize(n);
  absl::flat_hash_map<std::string, int32_t> by_edges;
  std::string key;
  for (int32_t node = 0; node < n; ++node) {
    key.clear();
    auto put = [&](int32_t v) { key.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    put(grammar_->node(node).rule);
    put(grammar_->node(node).final);
    for (const ByteEdge* e = grammar_->byte_edges_begin(node); e != grammar_->byte_edges_end(node);
         ++e) {
      put((e->lo << 8) | e->hi);
      put(e->target);
    }
    put(-1);
    for (const CallEdge* e = grammar_->call_edges_begin(node); e != grammar_->call_edges_end(node);
         ++e) {
      put(e->rule);
      put(e->target);
    }
    representative_[node] = by_edges.try_emplace(key, node).first->second;
  }
  absl::MutexLock lock(&mu_);
  entries_.resize(n);
}

const NodeTokenMasks* TokenMaskCache::Get(int32_t node) {
  node = representative_[node];
  {
    absl::MutexLock lock(&mu_);
    if (entries_[node] != nullptr) return entries_[node].get();
  }
  absl::MutexLock compute_lock(&compute_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (entries_[node] != nullptr) return entries_[node].get();
  }
  std::unique_ptr<NodeTokenMasks> computed = Compute(node);
  absl::MutexLock lock(&mu_);
  entries_[node] = std::move(computed);
  return entries_[node].get();
}

TokenMaskCache::~TokenMaskCache() = default;

void TokenMaskCache::FillAll() {
  for (int32_t n = 0; n < grammar_->num_nodes(); ++n) {
    if (grammar_->has_byte_edges(n)) Get(n);
  }
}

// The stack sets the cache's walks reach from lone stack tops with an open bottom, numbered,
// with transitions computed on first use: a lazily built DFA, so each (set, byte) pair is
// advanced once however many tokens and cache entries pass through it. A set's row of
// transitions is filled at once, one Advance per run of bytes that the set's edges treat alike.
class StackSetDfa {
 public:
  static constexpr uint8_t kHasTops = 1;
  static constexpr uint8_t kOpenBottom = 2;

  StackSetDfa(const CompiledGrammar& grammar, const std::vector<int32_t>* canonical)
      : grammar_(grammar), walker_(grammar, &store_, canonical) {}

  int32_t StartSet(int32_t node) {
    StackSet start;
    start.tops.push_back(store_.Intern(node, FrameStore::kOpenParent));
    return Intern(std::move(start));
  }
  int32_t num_sets() const { return static_cast<int32_t>(sets_.size()); }

  int32_t Next(int32_t set, uint8_t byte) {
    if (set < kDenseSets) {
      const int32_t next = next_[set * 256 + byte];
      if (next >= 0) return next;
      FillRow(set);
      return next_[set * 256 + byte];
    }
    const uint64_t key = (static_cast<uint64_t>(set) << 8) | byte;
    auto it = sparse_next_.find(key);
    if (it != sparse_next_.end()) return it->second;
    walker_.Advance(sets_[set], byte, &scratch_);
    const int32_t id = Intern(scratch_);
    sparse_next_.emplace(key, id);
    return id;
  }
  // kHasTops: some stack is left inside the node's context; kOpenBottom: some stack popped
  // below the open bottom.
  uint8_t flags(int32_t set) const { return flags_[set]; }

  // Whether every byte of `bytes` (4 words of 64 bits) leads from `set` back to `set` (the
  // inside of a string, a repeated character class).
  bool LoopsOn(int32_t set, const uint64_t* bytes) {
    if (loop_known_.size() <= static_cast<size_t>(set)) {
      loop_known_.resize(sets_.size());
      loop_yes_.resize(sets_.size());
    }
    Bits256& known = loop_known_[set];
    Bits256& yes = loop_yes_[set];
    for (int w = 0; w < 4; ++w) {
      if (bytes[w] & known[w] & ~yes[w]) return false;
    }
    for (int w = 0; w < 4; ++w) {
      for (uint64_t todo = bytes[w] & ~known[w]; todo != 0; todo &= todo - 1) {
        const int bit = __builtin_ctzll(todo);
        const bool loops = Next(set, static_cast<uint8_t>(w * 64 + bit)) == set;
        // Next may have added sets: loop_known_ and loop_yes_ do not grow there.
        loop_known_[set][w] |= uint64_t{1} << bit;
        if (!loops) return false;
        loop_yes_[set][w] |= uint64_t{1} << bit;
      }
    }
    return true;
  }

  static constexpr int32_t kUnitWall = -2;
  static constexpr size_t kMaxUnitPairs = 256;
  static constexpr int32_t kUnitIrregular = -3;
  // From a set whose flags are exactly kHasTops: the set that every whole string unit
  // (token_vocabulary.h) leads to, when all lead to one set and every byte on the way leaves
  // flags exactly kHasTops; kUnitWall when every byte that begins a unit leaves flags 0 (no
  // stack, nothing popped); kUnitIrregular otherwise.
  int32_t UnitStep(int32_t set, const StringUnitTable& units) {
    if (unit_step_.size() <= static_cast<size_t>(set)) unit_step_.resize(sets_.size(), -1);
    if (unit_step_[set] != -1) return unit_step_[set];
    const int32_t step = ComputeUnitStep(set, units);
    unit_step_.resize(sets_.size(), -1);  // Next may have added sets
    unit_step_[set] = step;
    return step;
  }

 private:
  int32_t ComputeUnitStep(int32_t set, const StringUnitTable& units) {
    bool wall = true;
    for (int b = 0; b < 256 && wall; ++b) {
      if (units.next(StringUnitTable::kBoundary, b) >= 0 && flags(Next(set, b)) != 0) wall = false;
    }
    if (wall) return kUnitWall;
    // The product of the unit automaton and this DFA, breadth first from (kBoundary, set).
    std::vector<std::pair<int, int32_t>> pairs = {{StringUnitTable::kBoundary, set}};
    int32_t after = -1;
    for (size_t q = 0; q < pairs.size(); ++q) {
      const auto [state, from] = pairs[q];
      std::pair<int, int32_t> last(-1, -1);  // the pair of the byte before, known to be queued
      for (int b = 0; b < 256; ++b) {
        const int to = units.next(state, static_cast<uint8_t>(b));
        if (to < 0) continue;
        const int32_t n = Next(from, static_cast<uint8_t>(b));
        if (flags(n) != kHasTops) return kUnitIrregular;
        if (to == StringUnitTable::kBoundary) {
          if (after != -1 && after != n) return kUnitIrregular;
          after = n;
          continue;
        }
        const std::pair<int, int32_t> pair(to, n);
        if (pair == last) continue;
        last = pair;
        if (std::find(pairs.begin(), pairs.end(), pair) == pairs.end()) {
          if (pairs.size() >= kMaxUnitPairs) return kUnitIrregular;
          pairs.push_back(pair);
        }
      }
    }
    return after;
  }

  // Transitions of the first kDenseSets sets are a table (1 KiB a set); later ones, which
  // only grammars with many distinct stack sets reach, go to a map sized by what is used.
  static constexpr int32_t kDenseSets = 4096;
  using Bits256 = std::array<uint64_t, 4>;

  void FillRow(int32_t set) {
    // Bytes where some edge of a top starts or stops applying.
    std::array<bool, 257> cut{};
    cut[0] = cut[256] = true;
    for (int32_t f : sets_[set].tops) {
      const int32_t node = store_.node(f);
      for (const ByteEdge* e = grammar_.byte_edges_begin(node); e != grammar_.byte_edges_end(node);
           ++e) {
        cut[e->lo] = true;
        cut[e->hi + 1] = true;
      }
    }
    for (int lo = 0; lo < 256;) {
      int hi = lo + 1;
      while (!cut[hi]) ++hi;
      walker_.Advance(sets_[set], static_cast<uint8_t>(lo), &scratch_);
      const int32_t id = Intern(scratch_);  // next_ may grow: index it afterwards
      for (int b = lo; b < hi; ++b) next_[set * 256 + b] = id;
      lo = hi;
    }
  }

  int32_t Intern(StackSet set) {
    std::sort(set.tops.begin(), set.tops.end());
    key_.assign(set.tops.begin(), set.tops.end());
    key_.push_back(set.open_bottom ? -1 : -2);
    auto [it, inserted] = ids_.try_emplace(key_, static_cast<int32_t>(sets_.size()));
    if (inserted) {
      flags_.push_back((set.tops.empty() ? 0 : kHasTops) | (set.open_bottom ? kOpenBottom : 0));
      sets_.push_back(std::move(set));
      if (sets_.size() <= static_cast<size_t>(kDenseSets)) next_.resize(sets_.size() * 256, -1);
    }
    return it->second;
  }

  const CompiledGrammar& grammar_;
  FrameStore store_;
  StackWalker walker_;
  std::vector<StackSet> sets_;
  std::vector<uint8_t> flags_;
  std::vector<int32_t> next_;
  absl::flat_hash_map<uint64_t, int32_t> sparse_next_;
  absl::flat_hash_map<std::vector<int32_t>, int32_t> ids_;
  std::vector<int32_t> key_;
  StackSet scratch_;
  // Per set: the bytes whose transition is known to loop back or not, and those that do.
  std::vector<Bits256> loop_known_, loop_yes_;
  // Per set: UnitStep's answer, -1 until asked.
  std::vector<int32_t> unit_step_;
};

std::unique_ptr<NodeTokenMasks> TokenMaskCache::Compute(int32_t node) {
  // The DFA is shared by the cache's walks; one that has grown large starts afresh.
  if (dfa_ == nullptr || dfa_->num_sets() > kMaxDfaSets) {
    dfa_ = std::make_unique<StackSetDfa>(*grammar_, &representative_);
  }
  std::unique_ptr<NodeTokenMasks> out = ComputeInString(node);
  return out != nullptr ? std::move(out) : ComputeByTrieWalk(node);
}

std::unique_ptr<NodeTokenMasks> TokenMaskCache::ComputeForTesting(int32_t node, bool trie_walk,
                                                                  bool* in_string) {
  node = representative_[node];
  absl::MutexLock compute_lock(&compute_mu_);
  if (dfa_ == nullptr) dfa_ = std::make_unique<StackSetDfa>(*grammar_, &representative_);
  std::unique_ptr<NodeTokenMasks> out = trie_walk ? nullptr : ComputeInString(node);
  *in_string = out != nullptr;
  return out != nullptr ? std::move(out) : ComputeByTrieWalk(node);
}

namespace {

// Moves a full bitmask of accepted tokens into `out`, as ids when they are few.
void SetAccepted(std::vector<uint32_t> accepted, int32_t num_accepted, int32_t vocab_size,
                 NodeTokenMasks* out) {
  if (static_cast<int64_t>(num_accepted) * 32 >= vocab_size) {
    out->accepted_bits = std::move(accepted);
    return;
  }
  out->accepted_ids.reserve(num_accepted);
  for (size_t w = 0; w < accepted.size(); ++w) {
    for (uint32_t bits = accepted[w]; bits != 0; bits &= bits - 1) {
      out->accepted_ids.push_back(static_cast<int32_t>(w * 32) + __builtin_ctz(bits));
    }
  }
}

}  // namespace

// A position inside a string: while the token's bytes are whole string units
// (token_vocabulary.h), every unit from the stack set S_k after k units leads to one set
// S_k+1 keeping a stack inside the node's context and popping nothing (StackSetDfa::UnitStep),
// up to a limit: a wall (no unit may follow, a maxLength reached), a set that repeats (an
// unbounded string), or the vocabulary's most units in a token. So a whole token of at most
// `limit` units is accepted and one of more is rejected (its first unit past the wall leaves
// no stack), which is a precomputed bitmask; a token that leaves the units after u <= limit
// of them is walked byte by byte from S_u at its exit, as the trie walk would. Null when the
// node's walk does not have that form (the trie walk then computes the entry).
std::unique_ptr<NodeTokenMasks> TokenMaskCache::ComputeInString(int32_t node) {
  StackSetDfa& dfa = *dfa_;
  const StringUnitTable& units = vocabulary_->string_units();
  const int32_t start = dfa.StartSet(node);
  if (dfa.flags(start) != StackSetDfa::kHasTops) return nullptr;
  std::vector<int32_t> level(1, start);  // level[k]: S_k; past the end, S_k is the last one
  int32_t limit = units.max_units();
  while (static_cast<int32_t>(level.size()) <= units.max_units()) {
    const int32_t next = dfa.UnitStep(level.back(), units);
    if (next == StackSetDfa::kUnitIrregular) return nullptr;
    if (next == StackSetDfa::kUnitWall) {
      limit = static_cast<int32_t>(level.size()) - 1;
      break;
    }
    if (next == level.back()) break;
    level.push_back(next);
  }
  const TokenVocabulary& vocab = *vocabulary_;
  const ByteSet& follow = grammar_->follow(grammar_->node(node).rule);
  auto out = std::make_unique<NodeTokenMasks>();
  const uint32_t* whole = units.whole_up_to(limit);
  std::vector<uint32_t> accepted(whole, whole + vocab.mask_words());
  const int32_t last_level = static_cast<int32_t>(level.size()) - 1;
  // The leaving tokens' walks share prefixes: after[d] is the set after the first d bytes
  // from the exit of the entry walked last (valid for d <= valid) and whether the token is
  // undecided if no stack is left there; entries sharing more than `dead` bytes with the
  // one before are rejected with it (their shared prefix leaves no stack and pops nothing).
  const char* const bytes = units.leaving_bytes().data();
  struct After {
    int32_t set;
    bool undecided;
  };
  std::vector<After> after(vocab.trie_max_depth() + 1);
  int32_t valid = 0, dead = std::numeric_limits<int32_t>::max();
  for (const StringUnitTable::Leaving& t : units.leaving()) {
    if (t.units > limit) break;
    if (t.shared == 0) {
      after[0] = {level[std::min(t.units, last_level)], false};
      valid = 0;
      dead = std::numeric_limits<int32_t>::max();
    }
    if (t.shared >= dead) continue;
    dead = std::numeric_limits<int32_t>::max();
    const int32_t len = t.end - t.begin;
    const char* const suffix = bytes + t.begin;
    int32_t d = std::min(t.shared, valid);
    for (;; ++d) {
      const uint8_t flags = dfa.flags(after[d].set);
      if (d > 0 && !(flags & StackSetDfa::kHasTops)) {
        // Decided by the first d bytes (and the next one).
        if (d == len) {
          if (flags != 0) {
            accepted[t.token >> 5] |= 1u << (t.token & 31);
          } else if (after[d].undecided) {
            out->undecided_ids.push_back(t.token);
          }
        } else if (after[d].undecided || ((flags & StackSetDfa::kOpenBottom) &&
                                          follow.test(static_cast<uint8_t>(suffix[d])))) {
          out->undecided_ids.push_back(t.token);
        } else if (flags == 0) {
          dead = d;
        }
        break;
      }
      if (d == len) {
        accepted[t.token >> 5] |= 1u << (t.token & 31);
        break;
      }
      const uint8_t b = static_cast<uint8_t>(suffix[d]);
      after[d + 1] = {dfa.Next(after[d].set, b),
                      after[d].undecided || ((flags & StackSetDfa::kOpenBottom) && follow.test(b))};
    }
    valid = d;
  }
  int32_t num_accepted = 0;
  for (uint32_t w : accepted) num_accepted += __builtin_popcount(w);
  SetAccepted(std::move(accepted), num_accepted, vocab.size(), out.get());
  return out;
}

// Walks the vocabulary's trie depth first from a lone stack top on `node` whose lower part is
// open, so tokens sharing a prefix share its walk. Per trie node (a token prefix) with the
// stack set S it reaches:
// * S keeps a stack inside the node's context: tokens ending here are accepted, and the walk
//   goes on into the subtree, or accepts the whole subtree at once when every byte below
//   leads from S back to S (the inside of a string);
// * otherwise the whole subtree is decided at once: a token there is undecided when some stack
//   popped below the open bottom earlier with the next byte in the rule's follow set (or pops
//   here and the token's next byte is in it), rejected else. Tokens ending exactly here are
//   accepted when a stack popped below the open bottom with the last byte.
std::unique_ptr<NodeTokenMasks> TokenMaskCache::ComputeByTrieWalk(int32_t node) {
  const TokenVocabulary& vocab = *vocabulary_;
  const int32_t* const sorted = vocab.sorted().data();
  const ByteSet& follow = grammar_->follow(grammar_->node(node).rule);
  StackSetDfa& dfa = *dfa_;
  // at_depth[d]: the set after the current path's first d bytes, times 2, plus 1 when some
  // prefix of it popped below the open bottom with the next byte in the follow set.
  std::vector<int32_t> at_depth(vocab.trie_max_depth() + 1);
  at_depth[0] = 2 * dfa.StartSet(node);

  auto out = std::make_unique<NodeTokenMasks>();
  std::vector<uint32_t> accepted(vocab.mask_words(), 0);
  uint32_t* const accepted_bits = accepted.data();
  int32_t num_accepted = 0;
  auto accept = [&](int32_t begin, int32_t end) {
    num_accepted += end - begin;
    for (int32_t k = begin; k < end; ++k) accepted_bits[sorted[k] >> 5] |= 1u << (sorted[k] & 31);
  };
  auto undecide = [&](int32_t begin, int32_t end) {
    out->undecided_ids.insert(out->undecided_ids.end(), sorted + begin, sorted + end);
  };
  const TokenVocabulary::TrieNode* const trie = &vocab.trie(0);
  const int32_t n = vocab.trie_size();
  for (int32_t i = 0; i < n;) {
    const TokenVocabulary::TrieNode& t = trie[i];
    const int32_t parent = at_depth[t.depth - 1];
    const int32_t parent_set = parent >> 1;
    const bool undecided =
        (parent & 1) || ((dfa.flags(parent_set) & StackSetDfa::kOpenBottom) && follow.test(t.byte));
    const int32_t set = dfa.Next(parent_set, t.byte);
    const uint8_t flags = dfa.flags(set);
    const int32_t here_end = i + 1 < n ? trie[i + 1].token_begin : vocab.trie_token_end(i);
    if (flags != 0) {
      accept(t.token_begin, here_end);
    } else if (undecided) {
      undecide(t.token_begin, here_end);
    }
    if (flags & StackSetDfa::kHasTops) {
      if (t.subtree_end == i + 1) {
        ++i;
      } else if (dfa.LoopsOn(set, vocab.trie_subtree_bytes(i))) {
        accept(here_end, vocab.trie_token_end(i));
        i = t.subtree_end;
      } else {
        at_depth[t.depth] = 2 * set + undecided;
        ++i;
      }
      continue;
    }
    // No stack is left inside: the subtree's tokens share a verdict, or, when the last byte
    // popped below the open bottom, the tokens under each child share one.
    if (undecided) {
      undecide(here_end, vocab.trie_token_end(i));
    } else if (flags & StackSetDfa::kOpenBottom) {
      for (int32_t c = i + 1; c < t.subtree_end; c = trie[c].subtree_end) {
        if (follow.test(trie[c].byte)) undecide(trie[c].token_begin, vocab.trie_token_end(c));
      }
    }
    i = t.subtree_end;
  }
  SetAccepted(std::move(accepted), num_accepted, vocab.size(), out.get());
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
