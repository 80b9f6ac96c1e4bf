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

// Left-aligned columns, two spaces apart.
std::string Columns(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppend(&line, row[i]);
      if (i + 1 < row.size()) line.append(width[i] - row[i].size() + 2, ' ');
    }
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

// One line per rank the workers reported, then the data-parallel attention balance: the
// busiest rank's mean tokens per step over the mean of all ranks' (1.00: even).
std::string RankSection(const ClusterStatusResponse& status) {
  std::vector<std::vector<std::string>> rows = {{"RANK", "WORKER", "RUNNING", "DECODE", "KV USED",
                                                 "TOKENS/STEP MEAN", "MAX", "STEPS",
                                                 "EXPERT EXCHANGE"}};
  double sum = 0, busiest = -1;
  int counted = 0, busiest_rank = -1;
  for (const WorkerStatus& w : status.workers()) {
    for (const RankLoad& r : w.rank_loads()) {
      const double kv = r.kv_blocks_total() > 0 ? 100.0 * static_cast<double>(r.kv_blocks_used()) /
                                                      static_cast<double>(r.kv_blocks_total())
                                                : 0.0;
      rows.push_back(
          {absl::StrCat(r.rank()), w.worker_id(), absl::StrCat(r.running_requests()),
           absl::StrCat(r.decode_batch()),
           absl::StrFormat("%d/%d (%.0f%%)", r.kv_blocks_used(), r.kv_blocks_total(), kv),
           absl::StrFormat("%.1f", r.window_step_tokens_mean()),
           absl::StrCat(r.window_step_tokens_max()), absl::StrCat(r.window_steps()),
           r.expert_exchange().empty() ? "-" : r.expert_exchange()});
      if (r.window_steps() > 0) {
        sum += r.window_step_tokens_mean();
        ++counted;
        if (r.window_step_tokens_mean() > busiest) {
          busiest = r.window_step_tokens_mean();
          busiest_rank = r.rank();
        }
      }
    }
  }
  if (rows.size() == 1) return "";
  std::string out = Columns(rows);
  if (counted > 1 && sum > 0) {
    const double mean = sum / counted;
    absl::StrAppend(&out, absl::StrFormat("data-parallel balance: max/mean tokens per step %.2f "
                                          "(rank %d busiest: %.1f, mean of %d ranks %.1f)\n",
                                          busiest / mean, busiest_rank, busiest, counted, mean));
  }
  return out;
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
  absl::StrAppend(&out, RankSection(status));
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
