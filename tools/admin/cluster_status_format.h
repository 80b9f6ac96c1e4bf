// Renders a ClusterStatusResponse for people (an aligned table) or for scripts (JSON).
#ifndef DEEPINFER_TOOLS_ADMIN_CLUSTER_STATUS_FORMAT_H_
#define DEEPINFER_TOOLS_ADMIN_CLUSTER_STATUS_FORMAT_H_

#include <string>

#include "proto/admin.pb.h"

namespace deepinfer {

// The coordinator, the group (its generation, whether it serves, why it could not form), then
// a header line and one line per worker: id, state, node, address, devices,
// seconds since last contact, restarts. Then a count per state, and the prefix cache of the
// ranks that report (hit rate; computed tokens per rank, max over mean).
std::string FormatClusterStatusTable(const ClusterStatusResponse& status);

// The response as one JSON object (protobuf's JSON mapping, enums by name).
std::string FormatClusterStatusJson(const ClusterStatusResponse& status);

}  // namespace deepinfer

#endif  // DEEPINFER_TOOLS_ADMIN_CLUSTER_STATUS_FORMAT_H_
