#include "common/eplb/placement_json.h"

#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace deepinfer {
namespace {

// Appends `rows` (one per layer) as a JSON array, one layer per line.
void AppendLayers(const std::vector<nlohmann::json>& rows, std::string& out) {
  out += "[\n";
  for (size_t layer = 0; layer < rows.size(); ++layer) {
    out += "    " + rows[layer].dump();
    out += layer + 1 < rows.size() ? ",\n" : "\n";
  }
  out += "  ]";
}

// Reads an array of `int`s at `json`; `where` names it in errors.
absl::StatusOr<std::vector<int>> IntArray(const nlohmann::json& json, const std::string& where) {
  if (!json.is_array()) return absl::InvalidArgumentError(absl::StrCat(where, " is not an array"));
  std::vector<int> out;
  out.reserve(json.size());
  for (size_t i = 0; i < json.size(); ++i) {
    if (!json[i].is_number_integer()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "[", i, "]: ", json[i].dump(), " is not an integer"));
    }
    const int64_t value = json[i].get<int64_t>();
    if (value < -1 || value > (1 << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "[", i, "]: ", value, " is out of range"));
    }
    out.push_back(static_cast<int>(value));
  }
  return out;
}

absl::StatusOr<std::vector<std::vector<int>>> IntTable(const nlohmann::json& json,
                                                       const std::string& where) {
  if (!json.is_array()) return absl::InvalidArgumentError(absl::StrCat(where, " is not an array"));
  std::vector<std::vector<int>> out;
  for (size_t i = 0; i < json.size(); ++i) {
    absl::StatusOr<std::vector<int>> row = IntArray(json[i], absl::StrCat(where, "[", i, "]"));
    if (!row.ok()) return row.status();
    out.push_back(*std::move(row));
  }
  return out;
}

}  // namespace

std::string PlacementToJson(const ExpertPlacement& placement) {
  const int width = placement.max_replicas();
  std::vector<nlohmann::json> phy2log, log2phy, logcnt;
  for (int layer = 0; layer < placement.num_layers(); ++layer) {
    phy2log.emplace_back(placement.phy2log()[layer]);
    logcnt.emplace_back(placement.logcnt()[layer]);
    nlohmann::json padded = nlohmann::json::array();
    for (std::vector<int> replicas : placement.log2phy()[layer]) {
      replicas.resize(width, -1);
      padded.push_back(replicas);
    }
    log2phy.push_back(std::move(padded));
  }
  std::string out = "{\n  \"phy2log\": ";
  AppendLayers(phy2log, out);
  out += ",\n  \"log2phy\": ";
  AppendLayers(log2phy, out);
  out += ",\n  \"logcnt\": ";
  AppendLayers(logcnt, out);
  out += "\n}\n";
  return out;
}

absl::StatusOr<ExpertPlacement> ParsePlacementJson(absl::string_view text) {
  const nlohmann::json json = nlohmann::json::parse(text.begin(), text.end(), nullptr,
                                                    /*allow_exceptions=*/false);
  if (json.is_discarded()) return absl::InvalidArgumentError("not valid JSON");
  if (!json.is_object()) {
    return absl::InvalidArgumentError(
        "expected an object {\"phy2log\": ..., \"log2phy\": ..., \"logcnt\": ...}");
  }
  for (const char* key : {"phy2log", "log2phy", "logcnt"}) {
    if (!json.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat("missing key \"", key, "\""));
    }
  }
  absl::StatusOr<std::vector<std::vector<int>>> phy2log =
      IntTable(*json.find("phy2log"), "phy2log");
  if (!phy2log.ok()) return phy2log.status();
  absl::StatusOr<std::vector<std::vector<int>>> logcnt = IntTable(*json.find("logcnt"), "logcnt");
  if (!logcnt.ok()) return logcnt.status();
  const nlohmann::json& log2phy_json = *json.find("log2phy");
  if (!log2phy_json.is_array()) return absl::InvalidArgumentError("log2phy is not an array");
  std::vector<std::vector<std::vector<int>>> log2phy;
  for (size_t layer = 0; layer < log2phy_json.size(); ++layer) {
    absl::StatusOr<std::vector<std::vector<int>>> table =
        IntTable(log2phy_json[layer], absl::StrCat("log2phy[", layer, "]"));
    if (!table.ok()) return table.status();
    log2phy.push_back(*std::move(table));
  }
  return ExpertPlacement::FromTables(*std::move(phy2log), std::move(log2phy), *std::move(logcnt));
}

absl::StatusOr<ExpertPlacement> ReadPlacementFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open placement file"));
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ExpertPlacement> placement = ParsePlacementJson(text.str());
  if (!placement.ok()) {
    return absl::Status(placement.status().code(),
                        absl::StrCat(path, ": ", placement.status().message()));
  }
  return placement;
}

absl::Status WritePlacementFile(const std::string& path, const ExpertPlacement& placement) {
  std::ofstream out(path, std::ios::trunc);
  out << PlacementToJson(placement);
  out.close();
  if (!out) return absl::InternalError(absl::StrCat(path, ": cannot write placement file"));
  return absl::OkStatus();
}

}  // namespace deepinfer
