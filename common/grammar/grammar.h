// Grammar: the intermediate form every structured-output front end produces (EBNF, regex,
// choice, JSON Schema; see grammar_builders.h) and CompileGrammar turns into the pushdown
// automaton the matcher walks (compiled_grammar.h).
//
// A grammar is a set of named rules; each rule's body is an expression tree over byte strings,
// character classes (sets of Unicode code points, matched as their UTF-8 encodings), sequences,
// alternations, bounded or unbounded repetitions and references to rules. Expressions live in
// an arena owned by the grammar and are named by index.
#ifndef DEEPINFER_COMMON_GRAMMAR_GRAMMAR_H_
#define DEEPINFER_COMMON_GRAMMAR_GRAMMAR_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace deepinfer::grammar {

// Inclusive code point ranges, sorted and disjoint after Normalize.
using CodepointRanges = std::vector<std::pair<uint32_t, uint32_t>>;

constexpr uint32_t kMaxCodepoint = 0x10FFFF;
constexpr int32_t kUnbounded = -1;

struct Expr {
  enum class Kind { kEmpty, kBytes, kCharClass, kSequence, kAlternation, kRepeat, kRuleRef };
  Kind kind = Kind::kEmpty;
  std::string bytes;              // kBytes
  CodepointRanges ranges;         // kCharClass: the code points it matches
  std::vector<int32_t> children;  // kSequence, kAlternation; kRepeat: exactly one
  int32_t min = 0;                // kRepeat
  int32_t max = 0;                // kRepeat: kUnbounded or >= min
  int32_t rule = -1;              // kRuleRef
};

class Grammar {
 public:
  // Rules are created by name; a name may be referenced before its body is set.
  int32_t Rule(absl::string_view name);
  void SetBody(int32_t rule, int32_t expr);
  void SetRoot(int32_t rule) { root_ = rule; }

  int32_t Empty();
  int32_t Bytes(absl::string_view bytes);
  // `ranges` need not be sorted; `negated` takes the complement within [0, kMaxCodepoint].
  int32_t CharClass(CodepointRanges ranges, bool negated = false);
  int32_t Sequence(std::vector<int32_t> children);
  int32_t Alternation(std::vector<int32_t> children);
  int32_t Repeat(int32_t child, int32_t min, int32_t max);
  int32_t Ref(int32_t rule);
  // Keeps references to `rule` as calls: the compile inlines small rules into their callers
  // otherwise. A rule used in many places (a JSON string) then has one set of automaton nodes,
  // so the matcher's per-node mask cache is filled once for all of them.
  void KeepAsCall(int32_t rule) { keep_as_call_.insert(rule); }
  bool kept_as_call(int32_t rule) const { return keep_as_call_.contains(rule); }
  // A fresh rule named `prefix` (or prefix_N when taken) whose body is `expr`.
  int32_t NewRule(absl::string_view prefix, int32_t expr);

  int32_t root() const { return root_; }
  int32_t num_rules() const { return static_cast<int32_t>(rule_names_.size()); }
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }
  int32_t rule_body(int32_t rule) const { return rule_bodies_[rule]; }
  const Expr& expr(int32_t id) const { return exprs_[id]; }
  bool HasRule(absl::string_view name) const { return rule_ids_.contains(name); }

  // INVALID_ARGUMENT naming the rule when a referenced rule has no body or there is no root.
  absl::Status Validate() const;

  // EBNF text of the grammar, for error messages and tests.
  std::string ToString() const;

 private:
  int32_t Add(Expr e);
  std::string ExprToString(int32_t id) const;

  std::vector<Expr> exprs_;
  std::vector<std::string> rule_names_;
  std::vector<int32_t> rule_bodies_;
  absl::flat_hash_map<std::string, int32_t> rule_ids_;
  absl::flat_hash_set<int32_t> keep_as_call_;
  int32_t root_ = -1;
};

// Sorts and merges overlapping or adjacent ranges.
CodepointRanges NormalizeRanges(CodepointRanges ranges);
// The complement of normalized `ranges` within [0, kMaxCodepoint].
CodepointRanges ComplementRanges(const CodepointRanges& ranges);

}  // namespace deepinfer::grammar

#endif  // DEEPINFER_COMMON_GRAMMAR_GRAMMAR_H_
