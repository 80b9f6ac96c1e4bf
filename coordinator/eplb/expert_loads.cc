#include "coordinator/eplb/expert_loads.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace deepinfer {

absl::Status ValidateExpertLoads(const ExpertLoads& loads) {
  if (loads.empty()) return absl::InvalidArgumentError("expert loads: no layers");
  if (loads[0].empty()) return absl::InvalidArgumentError("expert loads: layer 0 has no experts");
  for (size_t layer = 0; layer < loads.size(); ++layer) {
    if (loads[layer].size() != loads[0].size()) {
      return absl::InvalidArgumentError(absl::StrCat("expert loads: layer ", layer, " has ",
                                                     loads[layer].size(), " experts, layer 0 has ",
                                                     loads[0].size()));
    }
    for (size_t e = 0; e < loads[layer].size(); ++e) {
      const double load = loads[layer][e];
      if (!std::isfinite(load) || load < 0) {
        return absl::InvalidArgumentError(absl::StrCat("expert loads: layer ", layer, " expert ", e,
                                                       " has load ", load,
                                                       "; loads must be finite and >= 0"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<ExpertLoads> ParseExpertLoadsJson(absl::string_view text) {
  const nlohmann::json json = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                                    /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  if (!json.is_array()) {
    return absl::InvalidArgumentError(
        "expected an array of layers, each an array of per-expert loads: [[...], ...]");
  }
  ExpertLoads loads;
  for (size_t layer = 0; layer < json.size(); ++layer) {
    const nlohmann::json& row = json[layer];
    if (!row.is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", layer, " is not an array of per-expert loads"));
    }
    std::vector<double>& out = loads.emplace_back();
    for (size_t e = 0; e < row.size(); ++e) {
      if (!row[e].is_number()) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", layer, " expert ", e, ": ", row[e].dump(), " is not a number"));
      }
      out.push_back(row[e].get<double>());
    }
  }
  if (absl::Status s = ValidateExpertLoads(loads); !s.ok()) return s;
  return loads;
}

std::string ExpertLoadsToJson(const ExpertLoads& loads) {
  // One layer per line: files stay readable and diffable at 256 experts x 60 layers.
  std::string out = "[\n";
  for (size_t layer = 0; layer < loads.size(); ++layer) {
    out += "  " + nlohmann::json(loads[layer]).dump();
    out += layer + 1 < loads.size() ? ",\n" : "\n";
  }
  out += "]\n";
  return out;
}

absl::StatusOr<ExpertLoads> ReadExpertLoadsFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open expert-load file"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ExpertLoads> loads = ParseExpertLoadsJson(text.str());
  if (!loads.ok()) {
    return absl::Status(loads.status().code(), absl::StrCat(path, ": ", loads.status().message()));
  }
  return loads;
}

absl::Status WriteExpertLoadsFile(const std::string& path, const ExpertLoads& loads) {
  std::ofstream out(path, std::ios::trunc);
  out << ExpertLoadsToJson(loads);
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot write expert-load file"));
  return absl::OkStatus();
}

}  // namespace deepinfer
