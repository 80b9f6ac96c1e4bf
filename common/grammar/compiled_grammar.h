// CompiledGrammar: a Grammar turned into a pushdown automaton over bytes, the form the matcher
// walks (grammar_matcher.h).
//
// Each rule becomes an epsilon-free NFA over bytes whose edges either consume a byte in a range
// or call another rule (push a return node, continue at the callee's start; when the callee
// reaches a final node, pop and continue at the return node). Nodes are numbered across all
// rules. Compile rejects what the matcher cannot walk: rules that are referenced but undefined,
// rules that can never complete, and left recursion (a rule that can call itself before
// consuming a byte), naming the rule.
//
// Immutable after Compile; shared by every matcher of the grammar across threads.
#ifndef DEEPINFER_COMMON_GRAMMAR_COMPILED_GRAMMAR_H_
#define DEEPINFER_COMMON_GRAMMAR_COMPILED_GRAMMAR_H_

#include <bitset>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/grammar/grammar.h"

namespace deepinfer::grammar {

struct ByteEdge {
  uint8_t lo;
  uint8_t hi;
  int32_t target;
};

struct CallEdge {
  int32_t rule;
  int32_t target;  // where the caller continues once the callee completes
};

struct PdaNode {
  int32_t rule = -1;
  uint32_t byte_begin = 0, byte_end = 0;  // into byte_edges()
  uint32_t call_begin = 0, call_end = 0;  // into call_edges()
  bool final = false;                     // the rule may complete here
};

using ByteSet = std::bitset<256>;

class CompiledGrammar {
 public:
  // INVALID_ARGUMENT naming the problem (see the file comment); also when the automaton would
  // exceed a size limit (a huge {m,n} repetition).
  static absl::StatusOr<std::shared_ptr<const CompiledGrammar>> Compile(const Grammar& grammar);

  int32_t root_rule() const { return root_rule_; }
  int32_t rule_start(int32_t rule) const { return rule_start_[rule]; }
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }
  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()); }
  const PdaNode& node(int32_t id) const { return nodes_[id]; }
  const ByteEdge* byte_edges_begin(int32_t id) const { return &byte_edges_[nodes_[id].byte_begin]; }
  const ByteEdge* byte_edges_end(int32_t id) const { return &byte_edges_[nodes_[id].byte_end]; }
  const CallEdge* call_edges_begin(int32_t id) const { return &call_edges_[nodes_[id].call_begin]; }
  const CallEdge* call_edges_end(int32_t id) const { return &call_edges_[nodes_[id].call_end]; }
  bool has_byte_edges(int32_t id) const { return nodes_[id].byte_begin != nodes_[id].byte_end; }
  // The bytes that can come right after `rule` completes, in any context it is called from.
  const ByteSet& follow(int32_t rule) const { return follow_[rule]; }

 private:
  CompiledGrammar() = default;

  int32_t root_rule_ = -1;
  std::vector<std::string> rule_names_;
  std::vector<int32_t> rule_start_;
  std::vector<PdaNode> nodes_;
  std::vector<ByteEdge> byte_edges_;
  std::vector<CallEdge> call_edges_;
  std::vector<ByteSet> follow_;
};

// The UTF-8 encodings of the code points in [lo, hi] (surrogates excluded) as sequences of
// byte ranges: a byte string is the encoding of one of those code points exactly when it
// matches one of the sequences range by range.
std::vector<std::vector<std::pair<uint8_t, uint8_t>>> Utf8RangeSequences(uint32_t lo, uint32_t hi);

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_COMPILED_GRAMMAR_H_
