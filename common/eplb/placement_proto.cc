#include "common/eplb/placement_proto.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace deepinfer {

ExpertPlacementSpec PlacementToProto(const ExpertPlacement& placement, uint64_t epoch) {
  ExpertPlacementSpec spec;
  spec.set_epoch(epoch);
  spec.set_num_logical(placement.num_logical());
  const int width = placement.max_replicas();
  for (int l = 0; l < placement.num_layers(); ++l) {
    ExpertPlacementLayer* layer = spec.add_layers();
    for (int e : placement.phy2log()[l]) layer->add_phy2log(e);
    layer->set_replica_width(width);
    for (const std::vector<int>& slots : placement.log2phy()[l]) {
      for (int r = 0; r < width; ++r) {
        layer->add_log2phy(r < static_cast<int>(slots.size()) ? slots[r] : -1);
      }
    }
  }
  return spec;
}

absl::StatusOr<ExpertPlacement> PlacementFromProto(const ExpertPlacementSpec& spec) {
  if (spec.layers_size() == 0) {
    return absl::InvalidArgumentError("expert placement: no layers");
  }
  const int E = spec.num_logical();
  std::vector<std::vector<int>> phy2log, logcnt;
  std::vector<std::vector<std::vector<int>>> log2phy;
  for (int l = 0; l < spec.layers_size(); ++l) {
    const ExpertPlacementLayer& layer = spec.layers(l);
    const int width = layer.replica_width();
    if (E <= 0 || width <= 0 || layer.log2phy_size() != static_cast<int64_t>(E) * width) {
      return absl::InvalidArgumentError(absl::StrCat("expert placement layer ", l, ": log2phy has ",
                                                     layer.log2phy_size(), " entries, expected ", E,
                                                     " logical experts x replica width ", width));
    }
    phy2log.emplace_back(layer.phy2log().begin(), layer.phy2log().end());
    log2phy.emplace_back(E);
    logcnt.emplace_back(E, 0);
    for (int e = 0; e < E; ++e) {
      for (int r = 0; r < width; ++r) {
        const int slot = layer.log2phy(e * width + r);
        log2phy[l][e].push_back(slot);
        if (slot >= 0) ++logcnt[l][e];
      }
    }
  }
  return ExpertPlacement::FromTables(std::move(phy2log), std::move(log2phy), std::move(logcnt));
}

}  // namespace deepinfer
