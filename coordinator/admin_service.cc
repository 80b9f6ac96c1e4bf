#include "coordinator/admin_service.h"

#include <memory>
#include <utility>

#include "common/eplb/placement_json.h"
#include "coordinator/eplb/placement_planner.h"
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
    for (const RankLoad& load : w.report.rank_loads) {
      RankLoad* r = out->add_rank_loads();
      *r = load;
      r->clear_cached_probe_hashes();
    }
  }
  if (jobs_ != nullptr) {
    const GroupView group = jobs_->group();
    response->set_group_generation(group.generation);
    response->set_group_serving(group.serving);
    response->set_group_formation_error(group.formation_error);
    response->set_storage_error(jobs_->storage_error());
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

grpc::ServerUnaryReactor* AdminServiceImpl::GetExpertLoad(grpc::CallbackServerContext* context,
                                                          const GetExpertLoadRequest* request,
                                                          GetExpertLoadResponse* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return Finish(context, s);
  if (balancer_ == nullptr || jobs_ == nullptr) return Finish(context, grpc::Status::OK);
  const GroupView group = jobs_->group();
  balancer_->FillStatus(group.members, response);
  response->set_num_gpus(group.serving ? group.world_size : 0);
  return Finish(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* AdminServiceImpl::Rebalance(grpc::CallbackServerContext* context,
                                                      const RebalanceRequest* request,
                                                      RebalanceResponse* response) {
  if (grpc::Status s = auth_->Check(*context); !s.ok()) return Finish(context, s);
  if (balancer_ == nullptr || jobs_ == nullptr) {
    return Finish(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                        "this coordinator runs without --model: no expert "
                                        "parallel group to rebalance"));
  }
  absl::StatusOr<PlacementPolicy> policy =
      ParsePlacementPolicy(request->policy().empty() ? "auto" : request->policy());
  if (!policy.ok()) return Finish(context, ToGrpcStatus(policy.status()));
  const GroupView group = jobs_->group();
  if (!group.serving || group.world_size < 2) {
    return Finish(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                        group.serving ? "the group has one rank: nothing to balance"
                                                      : "no serving expert-parallel group"));
  }
  absl::StatusOr<ExpertBalancer::Plan> plan =
      balancer_->PlanFor(*policy, group.world_size, static_cast<int>(group.members.size()));
  if (!plan.ok()) return Finish(context, ToGrpcStatus(plan.status()));
  response->set_report(plan->report);
  response->set_placement_json(PlacementToJson(*plan->placement));
  response->set_imbalance_before(plan->imbalance_before);
  response->set_imbalance_after(plan->imbalance_after);
  if (request->dry_run()) return Finish(context, grpc::Status::OK);
  LOG(INFO) << "rebalance asked by " << request->client_id() << ": max/mean tokens per GPU "
            << plan->imbalance_before << " -> " << plan->imbalance_after;
  // The scheduler thread sends it to the workers and finishes the call.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  jobs_->ApplyPlacement(plan->placement, group.generation,
                        [reactor, response](absl::StatusOr<uint64_t> epoch) {
                          if (epoch.ok()) {
                            response->set_epoch(*epoch);
                            response->set_applied(true);
                          }
                          reactor->Finish(ToGrpcStatus(epoch.status()));
                        });
  return reactor;
}

}  // namespace deepinfer
