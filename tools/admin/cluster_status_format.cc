#include "tools/admin/cluster_status_format.h"

#include <algorithm>
#include <map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "google/protobuf/util/json_util.h"

namespace deepinfer {
namespace {

std::string DescribeDevices(const WorkerStatus& w) {
  if (w.devices().empty()) return "-";
  // "8x NVIDIA H200" for a uniform node, else a comma list.
  std::map<std::string, int> counts;
  for (const Device& d : w.devices()) {
    std::string name = d.kind() == Device::CPU ? "cpu" : d.name();
    ++counts[name];
  }
  std::vector<std::string> parts;
  for (const auto& [name, n] : counts) parts.push_back(absl::StrCat(n, "x ", name));
  return absl::StrJoin(parts, ", ");
}

// "prefix cache: ..." over the ranks that report: the share of prompt tokens served from the
// cache, and max / mean of the tokens each rank computed (its balance); "" when none reports.
std::string DescribePrefixCache(const ClusterStatusResponse& status) {
  int64_t prompt = 0, cached = 0, max_computed = 0, computed = 0;
  int ranks = 0;
  for (const WorkerStatus& w : status.workers()) {
    for (const RankLoad& r : w.rank_loads()) {
      prompt += r.prompt_tokens();
      cached += r.cached_prompt_tokens();
      computed += r.computed_tokens();
      max_computed = std::max(max_computed, r.computed_tokens());
      ++ranks;
    }
  }
  if (ranks == 0 || prompt == 0) return "";
  std::string out = absl::StrFormat("prefix cache: %d of %d prompt tokens cached (%.1f%%)", cached,
                                    prompt, 100.0 * cached / prompt);
  if (computed > 0) {
    absl::StrAppendFormat(&out, "; computed tokens per rank max/mean %.2f over %d rank(s)",
                          static_cast<double>(max_computed) * ranks / computed, ranks);
  }
  return out + "\n";
}

}  // namespace

std::string FormatClusterStatusTable(const ClusterStatusResponse& status) {
  std::vector<std::vector<std::string>> rows = {
      {"WORKER", "STATE", "NODE", "ADDRESS", "DEVICES", "LAST SEEN", "RESTARTS"}};
  std::map<std::string, int> per_state;
  for (const WorkerStatus& w : status.workers()) {
    const std::string state = WorkerState_Name(w.state());
    ++per_state[state];
    rows.push_back({w.worker_id(), state, w.node_name(), w.listen_address(), DescribeDevices(w),
                    absl::StrFormat("%.1fs ago", w.last_seen_ms_ago() / 1000.0),
                    absl::StrCat(w.restarts())});
  }
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out = absl::StrFormat("coordinator incarnation %016x, up %.0fs, %d worker(s)\n",
                                    status.coordinator_incarnation(),
                                    status.coordinator_uptime_ms() / 1000.0, status.workers_size());
  if (status.group_generation() > 0) {
    absl::StrAppend(&out, "group generation ", status.group_generation(),
                    status.group_serving() ? ": serving\n" : ": not serving\n");
  }
  if (!status.group_formation_error().empty()) {
    absl::StrAppend(&out, "the group could not form: ", status.group_formation_error(), "\n");
  }
  if (!status.storage_error().empty()) {
    absl::StrAppend(&out, "state directory: ", status.storage_error(), "\n");
  }
  if (status.workers().empty()) return out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) line.append(width[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  std::vector<std::string> summary;
  for (const auto& [state, n] : per_state) summary.push_back(absl::StrCat(n, " ", state));
  absl::StrAppend(&out, absl::StrJoin(summary, ", "), "\n");
  absl::StrAppend(&out, DescribePrefixCache(status));
  return out;
}

std::string FormatClusterStatusJson(const ClusterStatusResponse& status) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  // Serialising a message we built ourselves cannot fail.
  (void)google::protobuf::util::MessageToJsonString(status, &json, options);
  return json + "\n";
}

}  // namespace deepinfer
