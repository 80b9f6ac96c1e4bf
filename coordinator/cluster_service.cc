#include "coordinator/cluster_service.h"

#include "glog/logging.h"

namespace deepinfer {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

}  // namespace

ClusterServiceImpl::ClusterServiceImpl(WorkerRegistry* registry, const TokenAuthenticator* auth,
                                       absl::Duration heartbeat_interval)
    : registry_(registry), auth_(auth), heartbeat_interval_(heartbeat_interval) {}

grpc::ServerUnaryReactor* ClusterServiceImpl::Register(grpc::CallbackServerContext* context,
                                                       const RegisterRequest* request,
                                                       RegisterResponse* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) {
    LOG(WARNING) << "Register from " << context->peer() << " refused: " << s.error_message();
    return Finish(context, s);
  }
  WorkerRegistration registration;
  registration.worker_id = request->worker_id();
  registration.worker_incarnation = request->worker_incarnation();
  registration.node_name = request->node_name();
  registration.listen_address = request->listen_address();
  registration.devices.assign(request->devices().begin(), request->devices().end());
  // Workers from before ranks existed send 0: one rank.
  registration.num_ranks = request->num_ranks() > 0 ? request->num_ranks() : 1;
  absl::Status status = registry_->Register(registration);
  if (!status.ok()) return Finish(context, ToGrpcStatus(status));
  LOG(INFO) << "worker " << request->worker_id() << " registered from " << request->listen_address()
            << " (node " << request->node_name() << ", " << request->devices_size()
            << " device(s), incarnation " << request->worker_incarnation() << ")";
  response->set_coordinator_incarnation(registry_->coordinator_incarnation());
  response->set_heartbeat_interval_ms(absl::ToInt64Milliseconds(heartbeat_interval_));
  response->set_heartbeat_timeout_ms(absl::ToInt64Milliseconds(registry_->heartbeat_timeout()));
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Heartbeat(grpc::CallbackServerContext* context,
                                                        const HeartbeatRequest* request,
                                                        HeartbeatResponse* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return Finish(context, s);
  WorkerReport report;
  report.rank_loads.assign(request->rank_loads().begin(), request->rank_loads().end());
  report.group_generation = request->group_generation();
  report.group_status = request->group_status();
  report.group_error = request->group_error();
  absl::StatusOr<WorkerState> state =
      registry_->Heartbeat(request->worker_id(), request->worker_incarnation(),
                           request->coordinator_incarnation(), std::move(report));
  if (!state.ok()) {
    VLOG(1) << "heartbeat refused: " << state.status();
    return Finish(context, ToGrpcStatus(state.status()));
  }
  if (balancer_ != nullptr) balancer_->OnHeartbeat(request->worker_id(), *request);
  if (jobs_ != nullptr) {
    jobs_->OnProgress(request->worker_id(), request->group_generation(),
                      request->request_progress());
  }
  response->set_coordinator_incarnation(registry_->coordinator_incarnation());
  response->set_state(*state);
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* ClusterServiceImpl::ReportResults(grpc::CallbackServerContext* context,
                                                            const ReportResultsRequest* request,
                                                            ReportResultsResponse* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return Finish(context, s);
  absl::Status sender = registry_->CheckSender(request->worker_id(), request->worker_incarnation(),
                                               request->coordinator_incarnation());
  if (!sender.ok()) return Finish(context, ToGrpcStatus(sender));
  if (jobs_ != nullptr) {
    std::vector<RequestResult> results(request->results().begin(), request->results().end());
    if (absl::Status s = jobs_->OnResults(results); !s.ok()) {
      return Finish(context, ToGrpcStatus(s));
    }
  }
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* ClusterServiceImpl::Deregister(grpc::CallbackServerContext* context,
                                                         const DeregisterRequest* request,
                                                         DeregisterResponse* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return Finish(context, s);
  absl::StatusOr<WorkerTransition> left = registry_->Deregister(
      request->worker_id(), request->worker_incarnation(), request->coordinator_incarnation());
  if (!left.ok()) {
    LOG(WARNING) << "Deregister refused: " << left.status();
    return Finish(context, ToGrpcStatus(left.status()));
  }
  // The job manager's scheduler sees LEFT at its next tick: it re-queues the requests in
  // flight and forms the next group without this worker.
  LOG(INFO) << "worker " << request->worker_id() << " deregistered ("
            << (request->reason().empty() ? "no reason given" : request->reason())
            << "): " << WorkerStateName(left->from) << " -> " << WorkerStateName(left->to);
  return Finish(context, grpc::Status::OK);
}

}  // namespace deepinfer
