#include "common/grammar/grammar.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace deepinfer::grammar {

CodepointRanges NormalizeRanges(CodepointRanges ranges) {
  std::sort(ranges.begin(), ranges.end());
  CodepointRanges out;
  for (const auto& [lo, hi] : ranges) {
    if (lo > hi) continue;
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

CodepointRanges ComplementRanges(const CodepointRanges& ranges) {
  CodepointRanges out;
  uint32_t next = 0;
  for (const auto& [lo, hi] : ranges) {
    if (lo > next) out.emplace_back(next, lo - 1);
    next = hi + 1;
  }
  if (next <= kMaxCodepoint) out.emplace_back(next, kMaxCodepoint);
  return out;
}

int32_t Grammar::Add(Expr e) {
  exprs_.push_back(std::move(e));
  return static_cast<int32_t>(exprs_.size()) - 1;
}

int32_t Grammar::Rule(absl::string_view name) {
  auto it = rule_ids_.find(name);
  if (it != rule_ids_.end()) return it->second;
  const int32_t id = static_cast<int32_t>(rule_names_.size());
  rule_names_.emplace_back(name);
  rule_bodies_.push_back(-1);
  rule_ids_.emplace(std::string(name), id);
  return id;
}

void Grammar::SetBody(int32_t rule, int32_t expr) { rule_bodies_[rule] = expr; }

int32_t Grammar::NewRule(absl::string_view prefix, int32_t expr) {
  std::string name(prefix);
  for (int n = 1; rule_ids_.contains(name); ++n) name = absl::StrCat(prefix, "_", n);
  const int32_t rule = Rule(name);
  SetBody(rule, expr);
  return rule;
}

int32_t Grammar::Empty() { return Add(Expr{}); }

int32_t Grammar::Bytes(absl::string_view bytes) {
  if (bytes.empty()) return Empty();
  Expr e;
  e.kind = Expr::Kind::kBytes;
  e.bytes = std::string(bytes);
  return Add(std::move(e));
}

int32_t Grammar::CharClass(CodepointRanges ranges, bool negated) {
  Expr e;
  e.kind = Expr::Kind::kCharClass;
  e.ranges = NormalizeRanges(std::move(ranges));
  if (negated) e.ranges = ComplementRanges(e.ranges);
  return Add(std::move(e));
}

int32_t Grammar::Sequence(std::vector<int32_t> children) {
  if (children.size() == 1) return children[0];
  if (children.empty()) return Empty();
  Expr e;
  e.kind = Expr::Kind::kSequence;
  e.children = std::move(children);
  return Add(std::move(e));
}

int32_t Grammar::Alternation(std::vector<int32_t> children) {
  if (children.size() == 1) return children[0];
  Expr e;
  e.kind = Expr::Kind::kAlternation;
  e.children = std::move(children);
  return Add(std::move(e));
}

int32_t Grammar::Repeat(int32_t child, int32_t min, int32_t max) {
  Expr e;
  e.kind = Expr::Kind::kRepeat;
  e.children = {child};
  e.min = min;
  e.max = max;
  return Add(std::move(e));
}

int32_t Grammar::Ref(int32_t rule) {
  Expr e;
  e.kind = Expr::Kind::kRuleRef;
  e.rule = rule;
  return Add(std::move(e));
}

absl::Status Grammar::Validate() const {
  if (root_ < 0) return absl::InvalidArgumentError("the grammar has no root rule");
  for (int32_t r = 0; r < num_rules(); ++r) {
    if (rule_bodies_[r] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rule '", rule_names_[r], "' is referenced but never defined"));
    }
  }
  return absl::OkStatus();
}

namespace {

std::string EscapeByte(uint32_t c, char quote) {
  if (c == '\\' || c == static_cast<uint32_t>(quote) || c == ']' || c == '-' || c == '^') {
    if (quote == '"' && (c == ']' || c == '-' || c == '^')) return std::string(1, c);
    return absl::StrCat("\\", std::string(1, static_cast<char>(c)));
  }
  if (c == '\n') return "\\n";
  if (c == '\t') return "\\t";
  if (c == '\r') return "\\r";
  if (c < 0x20 || c == 0x7F) return absl::StrFormat("\\x%02X", c);
  if (c < 0x80) return std::string(1, static_cast<char>(c));
  return absl::StrFormat("\\u{%X}", c);
}

}  // namespace

std::string Grammar::ExprToString(int32_t id) const {
  const Expr& e = exprs_[id];
  switch (e.kind) {
    case Expr::Kind::kEmpty:
      return "\"\"";
    case Expr::Kind::kBytes: {
      std::string s = "\"";
      for (unsigned char c : e.bytes) {
        s += c < 0x80 ? EscapeByte(c, '"') : absl::StrFormat("\\x%02X", c);
      }
      return s + "\"";
    }
    case Expr::Kind::kCharClass: {
      std::string s = "[";
      for (const auto& [lo, hi] : e.ranges) {
        s += EscapeByte(lo, ']');
        if (hi != lo) s += absl::StrCat("-", EscapeByte(hi, ']'));
      }
      return s + "]";
    }
    case Expr::Kind::kSequence:
    case Expr::Kind::kAlternation: {
      std::vector<std::string> parts;
      for (int32_t c : e.children) parts.push_back(ExprToString(c));
      return absl::StrCat("(", absl::StrJoin(parts, e.kind == Expr::Kind::kSequence ? " " : " | "),
                          ")");
    }
    case Expr::Kind::kRepeat: {
      const std::string inner = ExprToString(e.children[0]);
      if (e.max == kUnbounded) return absl::StrCat(inner, "{", e.min, ",}");
      return absl::StrCat(inner, "{", e.min, ",", e.max, "}");
    }
    case Expr::Kind::kRuleRef:
      return rule_names_[e.rule];
  }
  return "";
}

std::string Grammar::ToString() const {
  std::string out;
  for (int32_t r = 0; r < num_rules(); ++r) {
    absl::StrAppend(&out, rule_names_[r],
                    " ::= ", rule_bodies_[r] < 0 ? "<undefined>" : ExprToString(rule_bodies_[r]),
                    "\n");
  }
  return out;
}

}  // namespace deepinfer::grammar
