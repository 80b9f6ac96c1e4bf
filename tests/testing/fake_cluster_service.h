// FakeClusterService: an in-process ClusterService (the coordinator's side of
// register/heartbeat/results) for worker tests. It accepts every worker, records the last
// heartbeat of each and every result, can play a restarted coordinator, and lets tests wait
// for what arrives (no sleeps: conditions on its mutex).
#ifndef DEEPINFER_TESTS_TESTING_FAKE_CLUSTER_SERVICE_H_
#define DEEPINFER_TESTS_TESTING_FAKE_CLUSTER_SERVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/grpcpp.h"
#include "proto/cluster.grpc.pb.h"

namespace deepinfer::testing {

class FakeClusterService final : public ClusterService::CallbackService {
 public:
  // Serves on 127.0.0.1, a free port; workers are told to heartbeat every 30 ms.
  FakeClusterService();
  ~FakeClusterService() override;

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const RegisterRequest* request,
                                     RegisterResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const HeartbeatRequest* request,
                                      HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* ReportResults(grpc::CallbackServerContext* context,
                                          const ReportResultsRequest* request,
                                          ReportResultsResponse* response) override;

  int port() const { return port_; }
  uint64_t incarnation();
  // The next `n` ReportResults calls answer NOT_FOUND and draw a new incarnation, as a
  // restarted coordinator would.
  void RefuseNextReports(int n);
  int registrations();
  RegisterRequest last_register();

  // Waits until `worker` heartbeats with the current incarnation (its link then says
  // registered).
  void AwaitRegistered(const std::string& worker);
  // Waits for a heartbeat of `worker` reporting `generation` in a state other than FORMING.
  HeartbeatRequest AwaitGroup(const std::string& worker, uint64_t generation);
  // Waits for a heartbeat of `worker` reporting `generation` with `status`.
  HeartbeatRequest AwaitStatus(const std::string& worker, uint64_t generation, GroupStatus status);
  // Waits until results for at least `n` distinct requests arrived; returns them by id.
  std::map<std::string, RequestResult> AwaitResults(size_t n);

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
  absl::Mutex mu_;
  uint64_t incarnation_ ABSL_GUARDED_BY(mu_) = 1000;
  int registrations_ ABSL_GUARDED_BY(mu_) = 0;
  int refuse_reports_ ABSL_GUARDED_BY(mu_) = 0;
  RegisterRequest last_register_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, HeartbeatRequest> heartbeats_by_worker_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, RequestResult> results_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer::testing

#endif  // DEEPINFER_TESTS_TESTING_FAKE_CLUSTER_SERVICE_H_
