#include "common/grammar/compiled_grammar.h"

#include <algorithm>
#include <functional>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace deepinfer::grammar {
namespace {

// Bounds the automaton a request can make the coordinator or a worker build.
constexpr size_t kMaxNfaStates = 500'000;
// Deeper chains of inlined rules stay calls (bounds Build's recursion).
constexpr int kMaxInlineDepth = 32;
// Bounds the recursion of the compile's checks over rules.
constexpr int32_t kMaxRules = 4000;

int Utf8Length(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

void EncodeUtf8(uint32_t c, uint8_t* out) {
  switch (Utf8Length(c)) {
    case 1:
      out[0] = static_cast<uint8_t>(c);
      break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (c >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (c >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (c >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (c & 0x3F));
  }
}

void SplitUtf8(uint32_t lo, uint32_t hi,
               std::vector<std::vector<std::pair<uint8_t, uint8_t>>>* out) {
  if (lo > hi) return;
  // Surrogates have no UTF-8 encoding.
  if (lo <= 0xDFFF && hi >= 0xD800) {
    if (lo < 0xD800) SplitUtf8(lo, 0xD7FF, out);
    if (hi > 0xDFFF) SplitUtf8(0xE000, hi, out);
    return;
  }
  // Both ends must have the same encoded length.
  for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= boundary && hi > boundary) {
      SplitUtf8(lo, boundary, out);
      SplitUtf8(boundary + 1, hi, out);
      return;
    }
  }
  // Split until every continuation byte position spans a full 0x80-0xBF range or both ends
  // share the leading bytes, so the range is a product of byte ranges.
  for (int i = 1; i < Utf8Length(lo); ++i) {
    const uint32_t mask = (1u << (6 * i)) - 1;
    if ((lo & ~mask) != (hi & ~mask)) {
      if ((lo & mask) != 0) {
        SplitUtf8(lo, lo | mask, out);
        SplitUtf8((lo | mask) + 1, hi, out);
        return;
      }
      if ((hi & mask) != mask) {
        SplitUtf8(lo, (hi & ~mask) - 1, out);
        SplitUtf8(hi & ~mask, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  EncodeUtf8(lo, a);
  EncodeUtf8(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < Utf8Length(lo); ++i) seq.emplace_back(a[i], b[i]);
  out->push_back(std::move(seq));
}

// One rule's Thompson NFA with epsilon edges, before elimination.
struct EpsState {
  std::vector<ByteEdge> bytes;
  std::vector<CallEdge> calls;
  std::vector<int32_t> eps;
};

class RuleBuilder {
 public:
  // inline_rules[r]: references to r are replaced by r's body.
  RuleBuilder(const Grammar& g, const std::vector<char>* inline_rules)
      : g_(g), inline_(inline_rules) {}

  absl::StatusOr<int32_t> Build(int32_t expr, int32_t from) {
    if (states_.size() > kMaxNfaStates) {
      return absl::InvalidArgumentError(
          "the grammar is too large (a repetition count or a string length limit is too big)");
    }
    const Expr& e = g_.expr(expr);
    switch (e.kind) {
      case Expr::Kind::kEmpty:
        return from;
      case Expr::Kind::kBytes: {
        int32_t cur = from;
        for (unsigned char c : e.bytes) {
          const int32_t next = New();
          states_[cur].bytes.push_back({c, c, next});
          cur = next;
        }
        return cur;
      }
      case Expr::Kind::kCharClass: {
        const int32_t end = New();
        std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
        for (const auto& [lo, hi] : e.ranges) SplitUtf8(lo, hi, &seqs);
        // Sequences of one byte range share the end state directly; longer ones share their
        // suffix-free prefixes through a small map keyed by (state, lo, hi).
        absl::flat_hash_map<uint64_t, int32_t> prefix;
        for (const auto& seq : seqs) {
          int32_t cur = from;
          for (size_t i = 0; i < seq.size(); ++i) {
            if (i + 1 == seq.size()) {
              states_[cur].bytes.push_back({seq[i].first, seq[i].second, end});
              break;
            }
            const uint64_t key =
                (static_cast<uint64_t>(cur) << 16) | (seq[i].first << 8) | seq[i].second;
            auto it = prefix.find(key);
            if (it == prefix.end()) {
              const int32_t next = New();
              states_[cur].bytes.push_back({seq[i].first, seq[i].second, next});
              it = prefix.emplace(key, next).first;
            }
            cur = it->second;
          }
        }
        return end;
      }
      case Expr::Kind::kSequence: {
        int32_t cur = from;
        for (int32_t c : e.children) {
          absl::StatusOr<int32_t> next = Build(c, cur);
          if (!next.ok()) return next.status();
          cur = *next;
        }
        return cur;
      }
      case Expr::Kind::kAlternation: {
        const int32_t end = New();
        for (int32_t c : e.children) {
          const int32_t start = New();
          states_[from].eps.push_back(start);
          absl::StatusOr<int32_t> last = Build(c, start);
          if (!last.ok()) return last.status();
          states_[*last].eps.push_back(end);
        }
        return end;
      }
      case Expr::Kind::kRepeat: {
        int32_t cur = from;
        for (int32_t i = 0; i < e.min; ++i) {
          const int32_t start = New();
          states_[cur].eps.push_back(start);
          absl::StatusOr<int32_t> next = Build(e.children[0], start);
          if (!next.ok()) return next.status();
          cur = *next;
        }
        const int32_t end = New();
        if (e.max == kUnbounded) {
          const int32_t loop = New();
          states_[cur].eps.push_back(loop);
          absl::StatusOr<int32_t> body_end = Build(e.children[0], loop);
          if (!body_end.ok()) return body_end.status();
          states_[*body_end].eps.push_back(loop);
          states_[loop].eps.push_back(end);
          return end;
        }
        for (int32_t i = e.min; i < e.max; ++i) {
          states_[cur].eps.push_back(end);
          const int32_t start = New();
          states_[cur].eps.push_back(start);
          absl::StatusOr<int32_t> next = Build(e.children[0], start);
          if (!next.ok()) return next.status();
          cur = *next;
        }
        states_[cur].eps.push_back(end);
        return end;
      }
      case Expr::Kind::kRuleRef: {
        if ((*inline_)[e.rule] && inline_depth_ < kMaxInlineDepth) {
          ++inline_depth_;
          absl::StatusOr<int32_t> end = Build(g_.rule_body(e.rule), from);
          --inline_depth_;
          return end;
        }
        const int32_t next = New();
        states_[from].calls.push_back({e.rule, next});
        return next;
      }
    }
    return absl::InternalError("unknown expression kind");
  }

  int32_t New() {
    states_.emplace_back();
    return static_cast<int32_t>(states_.size()) - 1;
  }

  std::vector<EpsState>& states() { return states_; }

 private:
  const Grammar& g_;
  const std::vector<char>* inline_;
  int inline_depth_ = 0;
  std::vector<EpsState> states_;
};

// Rules worth inlining into their callers: not recursive and small once their own inlined
// rules are counted. Inlining keeps a stack top inside the caller where it would otherwise sit
// in a tiny rule (a JSON string's character) that completes within almost every token, which
// would leave almost every token undecided in the mask cache.
std::vector<char> RulesToInline(const Grammar& g) {
  constexpr int64_t kMaxInlineSize = 256;
  const int32_t num_rules = g.num_rules();
  std::vector<char> out(num_rules, 0);
  // Rules on a reference cycle stay calls.
  std::vector<std::vector<int32_t>> refs(num_rules);
  std::function<void(int32_t, std::vector<int32_t>*)> collect = [&](int32_t id,
                                                                    std::vector<int32_t>* into) {
    const Expr& e = g.expr(id);
    if (e.kind == Expr::Kind::kRuleRef) into->push_back(e.rule);
    for (int32_t c : e.children) collect(c, into);
  };
  for (int32_t r = 0; r < num_rules; ++r) {
    if (g.rule_body(r) >= 0) collect(g.rule_body(r), &refs[r]);
  }
  std::vector<char> on_cycle(num_rules, 0);
  for (int32_t r = 0; r < num_rules; ++r) {
    std::vector<char> seen(num_rules, 0);
    std::vector<int32_t> work = refs[r];
    while (!work.empty()) {
      const int32_t x = work.back();
      work.pop_back();
      if (x == r) {
        on_cycle[r] = 1;
        break;
      }
      if (seen[x]) continue;
      seen[x] = 1;
      work.insert(work.end(), refs[x].begin(), refs[x].end());
    }
  }
  // Sizes, in automaton edges roughly, with inlined rules expanded.
  std::vector<int64_t> rule_size(num_rules, -1);
  absl::flat_hash_map<int32_t, int64_t> expr_size;  // subexpressions are shared
  std::function<int64_t(int32_t)> size_uncached;
  std::function<int64_t(int32_t)> size = [&](int32_t id) -> int64_t {
    auto it = expr_size.find(id);
    if (it != expr_size.end()) return it->second;
    const int64_t s = size_uncached(id);
    expr_size[id] = s;
    return s;
  };
  size_uncached = [&](int32_t id) -> int64_t {
    const Expr& e = g.expr(id);
    switch (e.kind) {
      case Expr::Kind::kEmpty:
        return 1;
      case Expr::Kind::kBytes:
        return static_cast<int64_t>(e.bytes.size());
      case Expr::Kind::kCharClass:
        return 4 + static_cast<int64_t>(e.ranges.size());
      case Expr::Kind::kSequence:
      case Expr::Kind::kAlternation: {
        int64_t s = 1;
        for (int32_t c : e.children) s = std::min<int64_t>(s + size(c), 1 << 30);
        return s;
      }
      case Expr::Kind::kRepeat:
        return std::min<int64_t>(size(e.children[0]) * (e.max == kUnbounded ? e.min + 1 : e.max),
                                 1 << 30);
      case Expr::Kind::kRuleRef:
        if (on_cycle[e.rule] || g.rule_body(e.rule) < 0 || g.kept_as_call(e.rule)) return 1;
        if (rule_size[e.rule] < 0) rule_size[e.rule] = size(g.rule_body(e.rule));
        return rule_size[e.rule] <= kMaxInlineSize ? rule_size[e.rule] : 1;
    }
    return 1;
  };
  for (int32_t r = 0; r < num_rules; ++r) {
    if (on_cycle[r] || r == g.root() || g.rule_body(r) < 0 || g.kept_as_call(r)) continue;
    if (rule_size[r] < 0) rule_size[r] = size(g.rule_body(r));
    out[r] = rule_size[r] <= kMaxInlineSize;
  }
  return out;
}

}  // namespace

std::vector<std::vector<std::pair<uint8_t, uint8_t>>> Utf8RangeSequences(uint32_t lo, uint32_t hi) {
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> out;
  SplitUtf8(lo, hi, &out);
  return out;
}

absl::StatusOr<std::shared_ptr<const CompiledGrammar>> CompiledGrammar::Compile(
    const Grammar& grammar) {
  if (absl::Status s = grammar.Validate(); !s.ok()) return s;
  if (grammar.num_rules() > kMaxRules) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the grammar has ", grammar.num_rules(), " rules; at most ", kMaxRules, " are supported"));
  }
  std::shared_ptr<CompiledGrammar> out(new CompiledGrammar());
  const int32_t num_rules = grammar.num_rules();
  out->root_rule_ = grammar.root();
  out->rule_names_.reserve(num_rules);
  for (int32_t r = 0; r < num_rules; ++r) out->rule_names_.push_back(grammar.rule_name(r));
  out->rule_start_.assign(num_rules, -1);
  const std::vector<char> inline_rules = RulesToInline(grammar);

  // Per rule: Thompson NFA, then epsilon elimination. The nodes kept are the start and every
  // target of a byte or call edge; each gets the edges of its epsilon closure.
  struct PendingNode {
    std::vector<ByteEdge> bytes;  // targets are local state ids until remapped
    std::vector<CallEdge> calls;
    bool final = false;
    int32_t rule = -1;
  };
  std::vector<PendingNode> pending;
  size_t total_states = 0;
  for (int32_t r = 0; r < num_rules; ++r) {
    RuleBuilder b(grammar, &inline_rules);
    const int32_t start = b.New();
    absl::StatusOr<int32_t> accept = b.Build(grammar.rule_body(r), start);
    if (!accept.ok()) return accept.status();
    std::vector<EpsState>& st = b.states();
    total_states += st.size();
    if (total_states > kMaxNfaStates) {
      return absl::InvalidArgumentError(
          "the grammar is too large (a repetition count or a string length limit is too big)");
    }
    std::vector<int32_t> local_to_node(st.size(), -1);
    std::vector<int32_t> order;  // local ids of kept states, in discovery order
    auto keep = [&](int32_t s) {
      if (local_to_node[s] < 0) {
        local_to_node[s] = static_cast<int32_t>(pending.size() + order.size());
        order.push_back(s);
      }
    };
    keep(start);
    for (size_t i = 0; i < st.size(); ++i) {
      for (const ByteEdge& e : st[i].bytes) keep(e.target);
      for (const CallEdge& e : st[i].calls) keep(e.target);
    }
    out->rule_start_[r] = local_to_node[start];
    std::vector<int32_t> stack;
    std::vector<uint32_t> seen(st.size(), 0);
    uint32_t stamp = 0;
    for (int32_t s : order) {
      PendingNode node;
      node.rule = r;
      ++stamp;
      stack.assign(1, s);
      seen[s] = stamp;
      while (!stack.empty()) {
        const int32_t x = stack.back();
        stack.pop_back();
        if (x == *accept) node.final = true;
        for (const ByteEdge& e : st[x].bytes) {
          node.bytes.push_back({e.lo, e.hi, local_to_node[e.target]});
        }
        for (const CallEdge& e : st[x].calls) {
          node.calls.push_back({e.rule, local_to_node[e.target]});
        }
        for (int32_t y : st[x].eps) {
          if (seen[y] != stamp) {
            seen[y] = stamp;
            stack.push_back(y);
          }
        }
      }
      pending.push_back(std::move(node));
    }
  }

  // Liveness: a node is alive when it can reach a final node of its rule; a rule is productive
  // when its start is alive. Edges into dead nodes and calls of unproductive rules are dropped.
  const int32_t n = static_cast<int32_t>(pending.size());
  std::vector<char> alive(n, 0), productive(num_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t i = 0; i < n; ++i) {
      if (alive[i]) continue;
      bool a = pending[i].final;
      for (const ByteEdge& e : pending[i].bytes) a = a || alive[e.target];
      for (const CallEdge& e : pending[i].calls) a = a || (productive[e.rule] && alive[e.target]);
      if (a) {
        alive[i] = 1;
        changed = true;
        const int32_t r = pending[i].rule;
        if (out->rule_start_[r] == i) productive[r] = 1;
      }
    }
  }
  // Report unproductive rules the root can reach.
  {
    std::vector<char> reached(num_rules, 0);
    std::vector<int32_t> work = {grammar.root()};
    reached[grammar.root()] = 1;
    while (!work.empty()) {
      const int32_t r = work.back();
      work.pop_back();
      if (!productive[r]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rule '", grammar.rule_name(r), "' can never complete (it recurses without end)"));
      }
      for (int32_t i = 0; i < n; ++i) {
        if (pending[i].rule != r || !alive[i]) continue;
        for (const CallEdge& e : pending[i].calls) {
          if (!reached[e.rule] && alive[e.target]) {
            reached[e.rule] = 1;
            work.push_back(e.rule);
          }
        }
      }
    }
  }

  out->nodes_.resize(n);
  for (int32_t i = 0; i < n; ++i) {
    PendingNode& p = pending[i];
    PdaNode& node = out->nodes_[i];
    node.rule = p.rule;
    node.final = p.final;
    std::sort(p.bytes.begin(), p.bytes.end(), [](const ByteEdge& a, const ByteEdge& b) {
      return std::tie(a.lo, a.hi, a.target) < std::tie(b.lo, b.hi, b.target);
    });
    node.byte_begin = static_cast<uint32_t>(out->byte_edges_.size());
    for (size_t k = 0; k < p.bytes.size(); ++k) {
      const ByteEdge& e = p.bytes[k];
      if (!alive[e.target]) continue;
      if (k > 0 && e.lo == p.bytes[k - 1].lo && e.hi == p.bytes[k - 1].hi &&
          e.target == p.bytes[k - 1].target) {
        continue;
      }
      out->byte_edges_.push_back(e);
    }
    node.byte_end = static_cast<uint32_t>(out->byte_edges_.size());
    std::sort(p.calls.begin(), p.calls.end(), [](const CallEdge& a, const CallEdge& b) {
      return std::tie(a.rule, a.target) < std::tie(b.rule, b.target);
    });
    p.calls.erase(std::unique(p.calls.begin(), p.calls.end(),
                              [](const CallEdge& a, const CallEdge& b) {
                                return a.rule == b.rule && a.target == b.target;
                              }),
                  p.calls.end());
    node.call_begin = static_cast<uint32_t>(out->call_edges_.size());
    for (const CallEdge& e : p.calls) {
      if (productive[e.rule] && alive[e.target]) out->call_edges_.push_back(e);
    }
    node.call_end = static_cast<uint32_t>(out->call_edges_.size());
  }

  // Nullable rules (can complete without consuming a byte) and nodes that can reach their
  // rule's end that way.
  std::vector<char> eps_final(n, 0), nullable(num_rules, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t i = 0; i < n; ++i) {
      if (eps_final[i]) continue;
      bool f = out->nodes_[i].final;
      for (const CallEdge* e = out->call_edges_begin(i); e != out->call_edges_end(i); ++e) {
        f = f || (nullable[e->rule] && eps_final[e->target]);
      }
      if (f) {
        eps_final[i] = 1;
        changed = true;
        const int32_t r = out->nodes_[i].rule;
        if (out->rule_start_[r] == i) nullable[r] = 1;
      }
    }
  }

  // Left recursion: the rules each rule can call before consuming a byte.
  {
    std::vector<std::vector<int32_t>> left_calls(num_rules);
    for (int32_t r = 0; r < num_rules; ++r) {
      std::vector<char> seen(n, 0);
      std::vector<int32_t> work = {out->rule_start_[r]};
      seen[work[0]] = 1;
      while (!work.empty()) {
        const int32_t x = work.back();
        work.pop_back();
        for (const CallEdge* e = out->call_edges_begin(x); e != out->call_edges_end(x); ++e) {
          left_calls[r].push_back(e->rule);
          if (nullable[e->rule] && !seen[e->target]) {
            seen[e->target] = 1;
            work.push_back(e->target);
          }
        }
      }
    }
    std::vector<int> color(num_rules, 0);  // 0 new, 1 on the path, 2 done
    std::string cycle_rule;
    std::function<bool(int32_t)> dfs = [&](int32_t r) {
      color[r] = 1;
      for (int32_t s : left_calls[r]) {
        if (color[s] == 1) {
          cycle_rule = out->rule_names_[s];
          return true;
        }
        if (color[s] == 0 && dfs(s)) return true;
      }
      color[r] = 2;
      return false;
    };
    for (int32_t r = 0; r < num_rules; ++r) {
      if (color[r] == 0 && dfs(r)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rule '", cycle_rule,
            "' is left-recursive (it can reach itself before consuming any text); rewrite it "
            "with repetition, e.g. list ::= item (\",\" item)*"));
      }
    }
  }

  // FIRST byte sets of nodes, then FOLLOW sets of rules.
  std::vector<ByteSet> first(n);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t i = 0; i < n; ++i) {
      ByteSet f = first[i];
      for (const ByteEdge* e = out->byte_edges_begin(i); e != out->byte_edges_end(i); ++e) {
        for (int c = e->lo; c <= e->hi; ++c) f.set(c);
      }
      for (const CallEdge* e = out->call_edges_begin(i); e != out->call_edges_end(i); ++e) {
        f |= first[out->rule_start_[e->rule]];
        if (nullable[e->rule]) f |= first[e->target];
      }
      if (f != first[i]) {
        first[i] = f;
        changed = true;
      }
    }
  }
  out->follow_.assign(num_rules, ByteSet());
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t i = 0; i < n; ++i) {
      const int32_t caller = out->nodes_[i].rule;
      for (const CallEdge* e = out->call_edges_begin(i); e != out->call_edges_end(i); ++e) {
        ByteSet f = out->follow_[e->rule] | first[e->target];
        if (eps_final[e->target]) f |= out->follow_[caller];
        if (f != out->follow_[e->rule]) {
          out->follow_[e->rule] = f;
          changed = true;
        }
      }
    }
  }
  return std::shared_ptr<const CompiledGrammar>(std::move(out));
}

}  // namespace deepinfer::grammar
