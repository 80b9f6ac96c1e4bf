// GrammarMatcher: one request's position in a compiled grammar, token by token: which tokens may
// come next (a bitmask over the vocabulary), accepting the sampled token, rolling back, and
// whether the grammar is complete (only then are stop tokens allowed).
//
// The parser state is a set of stacks of the pushdown automaton (compiled_grammar.h): each
// stack is a chain of frames (node, parent frame), interned so equal stacks share one id.
// Walking a token's bytes advances every stack in the set.
//
// Masks come from a per-(grammar, vocabulary) cache, TokenMaskCache, in the manner of
// XGrammar's adaptive token mask cache: for every node a stack top can sit on, the tokens are
// split once, by walking the vocabulary's trie (token_vocabulary.h) from that node alone, into
// those accepted whatever lies below the top of the stack, those rejected whatever lies below,
// and the few whose fate depends on it (the node's rule completes inside the token and the next
// byte may follow the rule somewhere in the grammar). A mask is then the union of the cached
// accepted sets of the current stack tops plus a full walk of only the undecided tokens. The
// walk shares each prefix's work among the tokens that extend it, skips the subtree of a prefix
// that leaves no stack, and accepts a subtree whole when every byte below it leads back to the
// same stack set (the inside of a string), as llguidance's token trie walk does; the stack
// sets and their transitions are a DFA built lazily and shared by all of the cache's walks, and
// nodes with the same rule, final flag and edges share one entry (and name one DFA state). A
// node inside a JSON string skips the trie walk: its entry is a bitmask precomputed with the
// vocabulary (the tokens made of at most the string units left, token_vocabulary.h) plus a walk
// of only the few tokens that leave the string's units, from where they leave.
#ifndef DEEPINFER_COMMON_GRAMMAR_GRAMMAR_MATCHER_H_
#define DEEPINFER_COMMON_GRAMMAR_GRAMMAR_MATCHER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/grammar/compiled_grammar.h"
#include "common/grammar/token_vocabulary.h"

namespace deepinfer::grammar {

// Interned stack frames. parent is another frame's id, kRootParent below the root rule, or
// kOpenParent below a stack whose lower part is unknown (the mask cache's walks).
class FrameStore {
 public:
  static constexpr int32_t kRootParent = -1;
  static constexpr int32_t kOpenParent = -2;

  int32_t Intern(int32_t node, int32_t parent);
  int32_t node(int32_t frame) const { return frames_[frame].node; }
  int32_t parent(int32_t frame) const { return frames_[frame].parent; }
  int32_t size() const { return static_cast<int32_t>(frames_.size()); }
  // Forgets frames created after size() was `size`.
  void Truncate(int32_t size);

 private:
  struct Frame {
    int32_t node;
    int32_t parent;
  };
  std::vector<Frame> frames_;
  absl::flat_hash_map<uint64_t, int32_t> ids_;
};

// A set of stacks with every stack top on a node that consumes bytes (calls expanded, finished
// rules popped), and whether some stack has finished the root rule (or, in the cache's walks,
// popped below its open bottom).
struct StackSet {
  std::vector<int32_t> tops;
  bool complete = false;
  bool open_bottom = false;
};

// Advancing stack sets over bytes in one FrameStore.
class StackWalker {
 public:
  // canonical (optional): per node, a node that behaves the same (same rule, final flag and
  // edges), which frames then name instead, so equal stacks reached by different nodes are one.
  StackWalker(const CompiledGrammar& grammar, FrameStore* store,
              const std::vector<int32_t>* canonical = nullptr)
      : grammar_(grammar), store_(store), canonical_(canonical) {}

  // The stacks of a frame with its calls expanded and finished rules popped.
  void Start(int32_t frame, StackSet* out);
  // Every stack of `in` after consuming `byte`.
  void Advance(const StackSet& in, uint8_t byte, StackSet* out);

 private:
  void Close(int32_t frame, StackSet* out);
  int32_t Canonical(int32_t node) const {
    return canonical_ != nullptr ? (*canonical_)[node] : node;
  }

  const CompiledGrammar& grammar_;
  FrameStore* store_;
  const std::vector<int32_t>* canonical_;
  std::vector<uint32_t> seen_;
  uint32_t stamp_ = 0;
  std::vector<int32_t> work_;
};

// Per node of a compiled grammar: the tokens accepted from a stack top there whatever lies
// below it, and the tokens that depend on what lies below.
struct NodeTokenMasks {
  std::vector<uint32_t> accepted_bits;  // a full bitmask, or empty when accepted_ids is used
  std::vector<int32_t> accepted_ids;
  std::vector<int32_t> undecided_ids;
};

class StackSetDfa;

class TokenMaskCache {
 public:
  TokenMaskCache(std::shared_ptr<const CompiledGrammar> grammar,
                 std::shared_ptr<const TokenVocabulary> vocabulary);
  ~TokenMaskCache();

  // Computes the entry on first use; thread-safe; the pointer stays valid.
  const NodeTokenMasks* Get(int32_t node);
  // Fills every node's entry (what a bench or a compile-ahead wants).
  void FillAll();
  // Computes `node`'s entry afresh, as Get does or (trie_walk) by the plain trie walk, the
  // reference the tests hold the string positions' tables to; `in_string` tells whether the
  // string-unit tables computed it.
  std::unique_ptr<NodeTokenMasks> ComputeForTesting(int32_t node, bool trie_walk, bool* in_string);

  const CompiledGrammar& grammar() const { return *grammar_; }
  const TokenVocabulary& vocabulary() const { return *vocabulary_; }
  std::shared_ptr<const CompiledGrammar> grammar_ptr() const { return grammar_; }
  std::shared_ptr<const TokenVocabulary> vocabulary_ptr() const { return vocabulary_; }

 private:
  // Past this many stack sets the walks' DFA starts afresh: it lives as long as the cache, and
  // a worker keeps a cache per spec, so its memory (1 KiB of transitions a set, plus the sets)
  // stays a few MiB.
  static constexpr int32_t kMaxDfaSets = 4096;

  std::unique_ptr<NodeTokenMasks> Compute(int32_t node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_);
  std::unique_ptr<NodeTokenMasks> ComputeInString(int32_t node)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_);
  std::unique_ptr<NodeTokenMasks> ComputeByTrieWalk(int32_t node)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_);

  const std::shared_ptr<const CompiledGrammar> grammar_;
  const std::shared_ptr<const TokenVocabulary> vocabulary_;
  // Per node, the node whose entry it uses: the first with the same rule, final flag and
  // edges (set once by the constructor).
  std::vector<int32_t> representative_;
  // Held while an entry is computed (computes are serialized: they share dfa_); taken before
  // mu_, which guards the entries and is never held during a compute.
  absl::Mutex compute_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::unique_ptr<StackSetDfa> dfa_ ABSL_GUARDED_BY(compute_mu_);
  absl::Mutex mu_;
  std::vector<std::unique_ptr<NodeTokenMasks>> entries_ ABSL_GUARDED_BY(mu_);
};

class GrammarMatcher {
 public:
  explicit GrammarMatcher(std::shared_ptr<TokenMaskCache> cache);

  // Consumes `token` when the grammar allows it; false (state unchanged) otherwise. A stop
  // token is allowed only when the grammar is complete, and ends the matcher.
  bool AcceptToken(int32_t token);
  // Consumes raw bytes (tests, forced text); false and unchanged when they do not fit.
  bool AcceptBytes(absl::string_view bytes);
  // Sets bit t of words[t / 32] (bit t % 32) for every token allowed next, clears the others.
  // `words` has vocabulary().mask_words() entries.
  void FillNextTokenBitmask(uint32_t* words);
  // Undoes the last `tokens` accepted tokens (at most NumAcceptedTokens()).
  void Rollback(int32_t tokens);
  int32_t NumAcceptedTokens() const { return static_cast<int32_t>(history_.size()) - 1; }

  // The text so far is a complete sentence of the grammar.
  bool IsComplete() const { return history_.back().stacks.complete; }
  // A stop token was accepted.
  bool IsTerminated() const { return history_.back().terminated; }

  const TokenVocabulary& vocabulary() const { return cache_->vocabulary(); }

 private:
  struct State {
    StackSet stacks;
    bool terminated = false;
    int32_t store_size = 0;  // frames in use once this state was made
  };
  bool TokenFitsFrom(int32_t frame, const std::string& bytes);

  std::shared_ptr<TokenMaskCache> cache_;
  FrameStore store_;
  StackWalker walker_;
  std::vector<State> history_;
  StackSet scratch_a_, scratch_b_;
};

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_GRAMMAR_MATCHER_H_
