#include "coordinator/coordinator_server.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/rpc/incarnation.h"
#include "glog/logging.h"

namespace deepinfer {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorConfig& config, const Clock* clock) {
  if (config.heartbeat_interval <= absl::ZeroDuration() ||
      config.heartbeat_timeout <= config.heartbeat_interval) {
    return absl::InvalidArgumentError(
        absl::StrCat("heartbeat timeout (", absl::FormatDuration(config.heartbeat_timeout),
                     ") must be longer than the heartbeat interval (",
                     absl::FormatDuration(config.heartbeat_interval), "), and both positive"));
  }
  if (config.port < 0 || config.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("port ", config.port, " is out of range"));
  }
  if (config.model.empty() != config.state_dir.empty()) {
    return absl::InvalidArgumentError(
        "batch jobs need both a model (--model) and a state directory (--state-dir)");
  }
  std::unique_ptr<CoordinatorServer> self(new CoordinatorServer());
  self->clock_ = clock != nullptr ? clock : &self->real_clock_;
  self->auth_ = std::make_unique<TokenAuthenticator>(config.auth_token);
  self->registry_ =
      std::make_unique<WorkerRegistry>(self->clock_, NewIncarnation(), config.heartbeat_timeout);
  self->cluster_service_ = std::make_unique<ClusterServiceImpl>(
      self->registry_.get(), self->auth_.get(), config.heartbeat_interval);
  self->admin_service_ = std::make_unique<AdminServiceImpl>(
      self->registry_.get(), self->auth_.get(), self->clock_, self->clock_->Now());

  if (!config.model.empty()) {
    absl::StatusOr<std::unique_ptr<PromptBuilder>> prompts = PromptBuilder::FromModel(config.model);
    if (!prompts.ok()) {
      return absl::Status(prompts.status().code(),
                          absl::StrCat("model '", config.model, "': ", prompts.status().message()));
    }
    self->prompts_ = std::move(*prompts);
    absl::StatusOr<std::unique_ptr<BatchJobStore>> store = BatchJobStore::Open(config.state_dir);
    if (!store.ok()) return store.status();
    self->store_ = std::move(*store);
    self->worker_channel_ =
        std::make_unique<GrpcWorkerChannel>(config.auth_token, absl::Seconds(10));
    JobManagerConfig jobs = config.jobs;
    jobs.regroup_delay = config.heartbeat_timeout + config.heartbeat_interval;
    if (jobs.model_name.empty()) {
      jobs.model_name = config.model.substr(config.model.find_last_of('/') + 1);
    }
    self->jobs_ = std::make_unique<JobManager>(self->store_.get(), self->prompts_.get(),
                                               self->registry_.get(), self->worker_channel_.get(),
                                               self->clock_, jobs);
    self->cluster_service_->set_job_manager(self->jobs_.get());
    self->admin_service_->set_job_manager(self->jobs_.get());
    if (self->prompts_->limits().routed_experts > 0) {
      ExpertBalancerConfig eplb = config.eplb;
      eplb.num_logical = static_cast<int>(self->prompts_->limits().routed_experts);
      eplb.num_groups =
          static_cast<int>(std::max<int64_t>(1, self->prompts_->limits().expert_groups));
      const int64_t moe_layers = self->prompts_->limits().moe_layers;
      if (eplb.initial != nullptr && (eplb.initial->num_logical() != eplb.num_logical ||
                                      eplb.initial->num_layers() != moe_layers)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--expert-placement has ", eplb.initial->num_layers(), " layers of ",
                         eplb.initial->num_logical(), " logical experts; the model has ",
                         moe_layers, " MoE layers of ", eplb.num_logical));
      }
      self->balancer_ = std::make_unique<ExpertBalancer>(std::move(eplb));
      self->jobs_->set_expert_balancer(self->balancer_.get());
      self->cluster_service_->set_expert_balancer(self->balancer_.get());
      self->admin_service_->set_expert_balancer(self->balancer_.get());
    }
  }
  self->job_service_ = std::make_unique<JobServiceImpl>(self->jobs_.get(), self->auth_.get(),
                                                        config.after_job_stored);

  const std::string address = absl::StrCat(config.host, ":", config.port);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &self->port_);
  builder.RegisterService(self->cluster_service_.get());
  builder.RegisterService(self->admin_service_.get());
  builder.RegisterService(self->job_service_.get());
  builder.SetMaxReceiveMessageSize(1 << 30);  // job inputs (SubmitJob)
  // A fixed receive window per stream. With gRPC's bandwidth-delay probing the window grows
  // (up to 1 GiB) whenever a sender outpaces the coordinator, as a job upload does, and what
  // was sent waits in memory; 8 MiB still fills a 100 ms round trip at 80 MB/s.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 8 << 20);
  self->server_ = builder.BuildAndStart();
  if (self->server_ == nullptr || self->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", address, " (address in use, or not a local address?)"));
  }
  // Check several times per timeout so a worker is LOST soon after its deadline.
  const absl::Duration check_interval =
      std::min(config.heartbeat_interval, config.heartbeat_timeout / 4);
  self->monitor_ = std::make_unique<HeartbeatMonitor>(self->registry_.get(), check_interval);
  if (self->jobs_ != nullptr) {
    if (absl::Status s = self->jobs_->Start(); !s.ok()) return s;
  }
  LOG(INFO) << "coordinator listening on " << config.host << ":" << self->port_ << " (incarnation "
            << self->incarnation() << ", auth " << (self->auth_->enabled() ? "on" : "off")
            << ", heartbeat every " << config.heartbeat_interval << ", LOST after "
            << config.heartbeat_timeout << ")";
  return self;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::Shutdown() {
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
  // After the server: its handlers use the job manager and the balancer.
  jobs_.reset();
  balancer_.reset();
  monitor_.reset();
}

}  // namespace deepinfer
