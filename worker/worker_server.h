// WorkerServer: everything a deepinfer-worker process runs, as one object main.cc
// (and tests) start and stop: the WorkerService gRPC server and the CoordinatorLink
// that registers and heartbeats. The engine (ranks, model) joins it later.
#ifndef DEEPINFER_WORKER_WORKER_SERVER_H_
#define DEEPINFER_WORKER_WORKER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator/rpc/auth.h"
#include "grpcpp/grpcpp.h"
#include "proto/worker.grpc.pb.h"
#include "worker/coordinator_link.h"

namespace deepinfer {

struct WorkerConfig {
  std::string coordinator_address;
  std::string auth_token;
  // Where WorkerService listens; port 0 picks a free one.
  std::string host = "127.0.0.1";
  int port = 0;
  // Host name others use to reach this worker; empty: `host`, or this machine's
  // hostname when `host` is a wildcard address.
  std::string advertise_host;
  // Empty: "<node_name>:<port>".
  std::string worker_id;
  // Empty: this machine's hostname.
  std::string node_name;
  std::vector<Device> devices;
};

class WorkerServer {
 public:
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(WorkerConfig config);
  ~WorkerServer();

  WorkerServer(const WorkerServer&) = delete;
  WorkerServer& operator=(const WorkerServer&) = delete;

  // Stops heartbeating and serving. Idempotent.
  void Shutdown();

  int port() const { return port_; }
  const std::string& worker_id() const { return config_.worker_id; }
  uint64_t incarnation() const { return incarnation_; }
  CoordinatorLink::State link_state() const;

 private:
  class Service;
  WorkerServer() = default;

  WorkerConfig config_;
  uint64_t incarnation_ = 0;
  int port_ = 0;
  absl::Time start_time_;
  std::unique_ptr<TokenAuthenticator> auth_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<CoordinatorLink> link_;
};

// This machine's hostname ("localhost" if it cannot be read).
std::string LocalHostname();

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_WORKER_SERVER_H_
