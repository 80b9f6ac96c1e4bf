#include "common/eplb/expert_placement.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

// Checks the shape of phy2log and that every entry names a logical expert.
absl::Status CheckPhy2Log(const std::vector<std::vector<int>>& phy2log, int num_logical) {
  if (phy2log.empty()) return absl::InvalidArgumentError("placement has no layers");
  if (num_logical <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement needs at least one logical expert, got ", num_logical));
  }
  const size_t num_physical = phy2log[0].size();
  for (size_t layer = 0; layer < phy2log.size(); ++layer) {
    if (phy2log[layer].size() != num_physical) {
      return absl::InvalidArgumentError(absl::StrCat("phy2log layer ", layer, " has ",
                                                     phy2log[layer].size(), " slots, layer 0 has ",
                                                     num_physical));
    }
    for (size_t p = 0; p < num_physical; ++p) {
      const int e = phy2log[layer][p];
      if (e < 0 || e >= num_logical) {
        return absl::InvalidArgumentError(absl::StrCat("phy2log layer ", layer, " slot ", p,
                                                       " holds expert ", e, ", outside [0, ",
                                                       num_logical, ")"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ExpertPlacement> ExpertPlacement::FromPhy2Log(std::vector<std::vector<int>> phy2log,
                                                             int num_logical) {
  if (absl::Status s = CheckPhy2Log(phy2log, num_logical); !s.ok()) return s;
  ExpertPlacement placement;
  placement.num_logical_ = num_logical;
  placement.num_physical_ = static_cast<int>(phy2log[0].size());
  for (size_t layer = 0; layer < phy2log.size(); ++layer) {
    std::vector<std::vector<int>> replicas(num_logical);
    for (int p = 0; p < placement.num_physical_; ++p) replicas[phy2log[layer][p]].push_back(p);
    std::vector<int> counts(num_logical);
    for (int e = 0; e < num_logical; ++e) {
      if (replicas[e].empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", layer, ": logical expert ", e, " has no physical slot"));
      }
      counts[e] = static_cast<int>(replicas[e].size());
    }
    placement.log2phy_.push_back(std::move(replicas));
    placement.logcnt_.push_back(std::move(counts));
  }
  placement.phy2log_ = std::move(phy2log);
  return placement;
}

absl::StatusOr<ExpertPlacement> ExpertPlacement::FromTables(
    std::vector<std::vector<int>> phy2log, std::vector<std::vector<std::vector<int>>> log2phy,
    std::vector<std::vector<int>> logcnt) {
  if (log2phy.size() != phy2log.size() || logcnt.size() != phy2log.size()) {
    return absl::InvalidArgumentError(absl::StrCat("phy2log has ", phy2log.size(),
                                                   " layers, log2phy ", log2phy.size(), ", logcnt ",
                                                   logcnt.size()));
  }
  if (logcnt.empty()) return absl::InvalidArgumentError("placement has no layers");
  const int num_logical = static_cast<int>(logcnt[0].size());
  if (absl::Status s = CheckPhy2Log(phy2log, num_logical); !s.ok()) return s;
  // Derive the tables from phy2log, then require the given ones to match it, keeping the
  // given replica order.
  absl::StatusOr<ExpertPlacement> derived = FromPhy2Log(phy2log, num_logical);
  if (!derived.ok()) return derived.status();
  for (size_t layer = 0; layer < logcnt.size(); ++layer) {
    if (logcnt[layer].size() != static_cast<size_t>(num_logical) ||
        log2phy[layer].size() != static_cast<size_t>(num_logical)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", layer, ": logcnt has ", logcnt[layer].size(), " experts and log2phy ",
          log2phy[layer].size(), ", expected ", num_logical, " (the size of logcnt's layer 0)"));
    }
    for (int e = 0; e < num_logical; ++e) {
      std::vector<int>& replicas = log2phy[layer][e];
      // Drop the -1 padding; nothing but padding may follow it.
      auto pad = std::find(replicas.begin(), replicas.end(), -1);
      if (std::any_of(pad, replicas.end(), [](int p) { return p != -1; })) {
        return absl::InvalidArgumentError(absl::StrCat("log2phy layer ", layer, " expert ", e,
                                                       ": slot after -1 padding: [",
                                                       absl::StrJoin(replicas, ", "), "]"));
      }
      replicas.erase(pad, replicas.end());
      const int expected = derived->logcnt_[layer][e];
      if (logcnt[layer][e] != expected) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", layer, " expert ", e,
                                                       ": logcnt says ", logcnt[layer][e],
                                                       " replicas, phy2log has ", expected));
      }
      std::vector<int> sorted = replicas;
      std::sort(sorted.begin(), sorted.end());
      if (sorted != derived->log2phy_[layer][e]) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", layer, " expert ", e, ": log2phy lists slots [",
                         absl::StrJoin(replicas, ", "), "], phy2log puts it in slots [",
                         absl::StrJoin(derived->log2phy_[layer][e], ", "), "]"));
      }
    }
  }
  derived->log2phy_ = std::move(log2phy);
  return derived;
}

int ExpertPlacement::max_replicas() const {
  int most = 0;
  for (const auto& layer : logcnt_) {
    for (int count : layer) most = std::max(most, count);
  }
  return most;
}

absl::Status ExpertPlacement::CheckGpuCount(int num_gpus) const {
  if (num_gpus > 0 && num_physical_ % num_gpus == 0) return absl::OkStatus();
  std::vector<int> divisors;
  for (int d = 1; d <= num_physical_; ++d) {
    if (num_physical_ % d == 0) divisors.push_back(d);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "a placement with ", num_physical_, " physical expert slots per layer cannot be spread ",
      "evenly over ", num_gpus, " GPUs; GPU counts that work: ", absl::StrJoin(divisors, ", ")));
}

int ExpertPlacement::GpuOfSlot(int slot, int num_gpus) const {
  CHECK(num_gpus > 0 && num_physical_ % num_gpus == 0) << num_physical_ << " / " << num_gpus;
  CHECK(slot >= 0 && slot < num_physical_) << slot;
  return slot / (num_physical_ / num_gpus);
}

}  // namespace deepinfer
