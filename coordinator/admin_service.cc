#include "coordinator/admin_service.h"

#include "glog/logging.h"

namespace deepinfer {
namespace {

grpc::ServerUnaryReactor* Finish(grpc::CallbackServerContext* context, grpc::Status status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(std::move(status));
  return reactor;
}

}  // namespace

AdminServiceImpl::AdminServiceImpl(WorkerRegistry* registry, const TokenAuthenticator* auth,
                                   const Clock* clock, absl::Time start_time)
    : registry_(registry), auth_(auth), clock_(clock), start_time_(start_time) {}

grpc::ServerUnaryReactor* AdminServiceImpl::ClusterStatus(grpc::CallbackServerContext* context,
                                                          const ClusterStatusRequest* request,
                                                          ClusterStatusResponse* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) {
    LOG(WARNING) << "ClusterStatus from " << context->peer() << " refused: " << s.error_message();
    return Finish(context, s);
  }
  const absl::Time now = clock_->Now();
  response->set_coordinator_incarnation(registry_->coordinator_incarnation());
  response->set_coordinator_uptime_ms(absl::ToInt64Milliseconds(now - start_time_));
  for (const WorkerSnapshot& w : registry_->Snapshot()) {
    WorkerStatus* out = response->add_workers();
    out->set_worker_id(w.registration.worker_id);
    out->set_worker_incarnation(w.registration.worker_incarnation);
    out->set_node_name(w.registration.node_name);
    out->set_listen_address(w.registration.listen_address);
    for (const Device& d : w.registration.devices) *out->add_devices() = d;
    out->set_state(w.state);
    out->set_last_seen_ms_ago(absl::ToInt64Milliseconds(now - w.last_seen));
    out->set_restarts(w.restarts);
  }
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* AdminServiceImpl::DrainWorker(grpc::CallbackServerContext* context,
                                                        const DrainWorkerRequest* request,
                                                        DrainWorkerResponse* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return Finish(context, s);
  absl::StatusOr<WorkerState> state = registry_->Drain(request->worker_id());
  if (!state.ok()) return Finish(context, ToGrpcStatus(state.status()));
  LOG(INFO) << "worker " << request->worker_id() << " drained by " << request->client_id();
  response->set_state(*state);
  return Finish(context, grpc::Status::OK);
}

}  // namespace deepinfer
