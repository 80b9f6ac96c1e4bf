// FakeClusterService.
#include "tests/testing/fake_cluster_service.h"

namespace deepinfer::testing {

FakeClusterService::FakeClusterService() {
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(this);
  server_ = builder.BuildAndStart();
}

FakeClusterService::~FakeClusterService() { server_->Shutdown(); }

grpc::ServerUnaryReactor* FakeClusterService::Register(grpc::CallbackServerContext* context,
                                                       const RegisterRequest* request,
                                                       RegisterResponse* response) {
  absl::MutexLock lock(&mu_);
  ++registrations_;
  last_register_ = *request;
  response->set_coordinator_incarnation(incarnation_);
  response->set_heartbeat_interval_ms(30);
  response->set_heartbeat_timeout_ms(5000);
  auto* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* FakeClusterService::Heartbeat(grpc::CallbackServerContext* context,
                                                        const HeartbeatRequest* request,
                                                        HeartbeatResponse* response) {
  absl::MutexLock lock(&mu_);
  auto* reactor = context->DefaultReactor();
  if (request->coordinator_incarnation() != incarnation_) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "other incarnation"));
    return reactor;
  }
  heartbeats_by_worker_[request->worker_id()] = *request;
  response->set_coordinator_incarnation(incarnation_);
  response->set_state(READY);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* FakeClusterService::ReportResults(grpc::CallbackServerContext* context,
                                                            const ReportResultsRequest* request,
                                                            ReportResultsResponse* response) {
  absl::MutexLock lock(&mu_);
  auto* reactor = context->DefaultReactor();
  if (refuse_reports_ > 0) {
    --refuse_reports_;
    ++incarnation_;
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND, "unknown worker"));
    return reactor;
  }
  if (request->coordinator_incarnation() != incarnation_) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "other incarnation"));
    return reactor;
  }
  for (const RequestResult& r : request->results()) results_[r.request_id()] = r;
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

uint64_t FakeClusterService::incarnation() {
  absl::MutexLock lock(&mu_);
  return incarnation_;
}

void FakeClusterService::RefuseNextReports(int n) {
  absl::MutexLock lock(&mu_);
  refuse_reports_ = n;
}

int FakeClusterService::registrations() {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

RegisterRequest FakeClusterService::last_register() {
  absl::MutexLock lock(&mu_);
  return last_register_;
}

void FakeClusterService::AwaitRegistered(const std::string& worker) {
  absl::MutexLock lock(&mu_);
  auto done = [this, &worker]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return heartbeats_by_worker_.count(worker) > 0;
  };
  mu_.Await(absl::Condition(&done));
}

HeartbeatRequest FakeClusterService::AwaitGroup(const std::string& worker, uint64_t generation) {
  absl::MutexLock lock(&mu_);
  auto done = [this, &worker, generation]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = heartbeats_by_worker_.find(worker);
    if (it == heartbeats_by_worker_.end()) return false;
    const HeartbeatRequest& hb = it->second;
    return hb.group_generation() == generation && hb.group_status() != GROUP_FORMING &&
           hb.group_status() != GROUP_STATUS_UNSPECIFIED;
  };
  mu_.Await(absl::Condition(&done));
  return heartbeats_by_worker_[worker];
}

HeartbeatRequest FakeClusterService::AwaitStatus(const std::string& worker, uint64_t generation,
                                                 GroupStatus status) {
  absl::MutexLock lock(&mu_);
  auto done = [this, &worker, generation, status]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = heartbeats_by_worker_.find(worker);
    return it != heartbeats_by_worker_.end() && it->second.group_generation() == generation &&
           it->second.group_status() == status;
  };
  mu_.Await(absl::Condition(&done));
  return heartbeats_by_worker_[worker];
}

std::map<std::string, RequestResult> FakeClusterService::AwaitResults(size_t n) {
  absl::MutexLock lock(&mu_);
  auto done = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return results_.size() >= n; };
  mu_.Await(absl::Condition(&done));
  return results_;
}

}  // namespace deepinfer::testing
