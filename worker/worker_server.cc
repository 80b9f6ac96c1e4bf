#include "worker/worker_server.h"

#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "common/rpc/incarnation.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace

std::string LocalHostname() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

// WorkerService (proto/worker.proto), answering from the WorkerServer's state.
class WorkerServer::Service final : public WorkerService::CallbackService {
 public:
  explicit Service(const WorkerServer* owner) : owner_(owner) {}

  grpc::ServerUnaryReactor* GetWorkerInfo(grpc::CallbackServerContext* context,
                                          const GetWorkerInfoRequest* request,
                                          GetWorkerInfoResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (grpc::Status s = owner_->auth_->Check(*context); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
    response->set_worker_id(owner_->config_.worker_id);
    response->set_worker_incarnation(owner_->incarnation_);
    response->set_node_name(owner_->config_.node_name);
    for (const Device& d : owner_->config_.devices) *response->add_devices() = d;
    CoordinatorLink::State link = owner_->link_state();
    response->set_registered(link.registered);
    response->set_coordinator_incarnation(link.registered ? link.coordinator_incarnation : 0);
    response->set_uptime_ms(absl::ToInt64Milliseconds(absl::Now() - owner_->start_time_));
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // The group RPCs only touch the GroupController's queues and state under its mutex;
  // loading, forming and tearing down happen on its control thread and the rank threads.
  grpc::ServerUnaryReactor* PrepareGroup(grpc::CallbackServerContext* context,
                                         const PrepareGroupRequest* request,
                                         PrepareGroupResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::Status s = Admit(*context, request->coordinator_incarnation());
    if (s.ok()) {
      absl::StatusOr<std::string> address = owner_->controller_->Prepare(request->generation());
      if (address.ok()) response->set_root_address(*address);
      s = address.status();
    }
    reactor->Finish(ToGrpc(s));
    return reactor;
  }

  grpc::ServerUnaryReactor* ConfigureGroup(grpc::CallbackServerContext* context,
                                           const ConfigureGroupRequest* request,
                                           ConfigureGroupResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::Status s = Admit(*context, request->coordinator_incarnation());
    if (s.ok()) s = owner_->controller_->Configure(*request);
    reactor->Finish(ToGrpc(s));
    return reactor;
  }

  grpc::ServerUnaryReactor* SubmitRequests(grpc::CallbackServerContext* context,
                                           const SubmitRequestsRequest* request,
                                           SubmitRequestsResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::Status s = Admit(*context, request->coordinator_incarnation());
    if (s.ok()) {
      std::vector<WorkItem> items(request->items().begin(), request->items().end());
      s = owner_->controller_->Submit(request->generation(), std::move(items));
    }
    reactor->Finish(ToGrpc(s));
    return reactor;
  }

  grpc::ServerUnaryReactor* SetExpertPlacement(grpc::CallbackServerContext* context,
                                               const SetExpertPlacementRequest* request,
                                               SetExpertPlacementResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    absl::Status s = Admit(*context, request->coordinator_incarnation());
    if (s.ok()) s = owner_->controller_->SetPlacement(*request);
    reactor->Finish(ToGrpc(s));
    return reactor;
  }

  grpc::ServerUnaryReactor* CancelRequests(grpc::CallbackServerContext* context,
                                           const CancelRequestsRequest* request,
                                           CancelRequestsResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (grpc::Status s = owner_->auth_->Check(*context); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
    if (owner_->controller_ != nullptr) {
      owner_->controller_->Cancel(
          std::vector<std::string>(request->request_ids().begin(), request->request_ids().end()));
    }
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  // Token, a model to serve, and a caller that is the coordinator this worker is registered
  // with (a stale coordinator must not reconfigure it).
  absl::Status Admit(const grpc::CallbackServerContext& context, uint64_t incarnation) const {
    if (grpc::Status s = owner_->auth_->Check(context); !s.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
    }
    if (owner_->controller_ == nullptr) {
      return absl::FailedPreconditionError("this worker was started without a model");
    }
    CoordinatorLink::State link = owner_->link_state();
    if (!link.registered || link.coordinator_incarnation != incarnation) {
      return absl::FailedPreconditionError(
          absl::StrCat("coordinator incarnation ", incarnation,
                       " is not the one this worker is registered with (",
                       link.registered ? absl::StrCat(link.coordinator_incarnation) : "none", ")"));
    }
    return absl::OkStatus();
  }

  const WorkerServer* const owner_;
};

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(WorkerConfig config) {
  if (config.coordinator_address.empty()) {
    return absl::InvalidArgumentError("no coordinator address (--coordinator HOST:PORT)");
  }
  if (config.devices.empty()) return absl::InvalidArgumentError("no devices to serve");
  std::unique_ptr<WorkerServer> self(new WorkerServer());
  const bool wildcard = config.host == "0.0.0.0" || config.host == "::" || config.host == "[::]";
  if (config.advertise_host.empty()) {
    config.advertise_host = wildcard ? LocalHostname() : config.host;
  }
  self->outbox_ = std::make_unique<ResultOutbox>();
  if (!config.engine.model.empty()) {
    const WorkerEngineConfig& e = config.engine;
    if (e.num_ranks < 1) return absl::InvalidArgumentError("the number of ranks must be >= 1");
    auto model = ModelFiles::Open(e.model);
    if (!model.ok()) return model.status();
    self->model_ = std::move(*model);
    if (e.placement != nullptr) {
      // Refused here, not at every ConfigureGroup: a placement for another model never fits.
      const ModelConfig& c = self->model_->config;
      int64_t moe_layers = 0;
      for (int64_t l = 0; l < c.num_hidden_layers; ++l) moe_layers += c.IsMoeLayer(l) ? 1 : 0;
      if (e.placement->num_logical() != c.n_routed_experts ||
          e.placement->num_layers() != moe_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("--expert-placement has ", e.placement->num_layers(), " layers of ",
                         e.placement->num_logical(), " logical experts; the model has ", moe_layers,
                         " MoE layers of ", c.n_routed_experts));
      }
    }
    GroupControllerOptions options;
    options.num_ranks = e.num_ranks;
    options.bind_host = wildcard ? "0.0.0.0" : config.host;
    options.advertise_host = config.advertise_host;
    options.group.model = self->model_.get();
    options.group.backend = e.backend;
    if (absl::Status st = comm::CheckDataPlaneChoice(e.communicator, e.backend); !st.ok()) {
      return st;
    }
    options.group.communicator = e.communicator;
    options.group.threads_per_rank = std::max(1, e.threads_per_rank);
    options.group.dtype = e.dtype;
    options.group.gemm_autotune = e.gemm_autotune;
    options.group.batch_invariant = e.batch_invariant;
    options.group.decode_graphs.enabled = e.cuda_graphs;
    options.group.decode_graphs.max_batch = e.cuda_graph_max_batch;
    options.group.kv_cache_dtype = e.kv_cache_dtype;
    options.group.kv_cache_tokens = e.kv_cache_tokens;
    options.group.gpu_memory_utilization = e.gpu_memory_utilization;
    options.group.max_batch_tokens = e.max_batch_tokens;
    options.group.max_running = e.max_running;
    options.group.step_stats_dir = e.step_stats_dir;
    options.group.prefix_caching = e.prefix_caching;
    options.group.async_scheduling = e.async_scheduling;
    options.group.load_threads = e.load_threads;
    if (e.prefix_caching && (e.kv_host_cache_bytes > 0 || !e.kv_cache_dir.empty())) {
      self->kv_block_store_ = std::make_shared<KvBlockStore>(
          KvBlockStoreOptions{e.kv_host_cache_bytes, e.kv_cache_dir, e.kv_cache_dir_bytes});
      options.group.kv_block_store = self->kv_block_store_;
    }
    options.group.speculative_tokens = e.speculative_tokens;
    options.group.draft_min_confidence = e.draft_min_confidence;
    options.group.prefill_attention = e.prefill_attention;
    options.group.micro_batches = e.micro_batches;
    options.group.collective_timeout = e.collective_timeout;
    options.group.listen_host = wildcard ? "0.0.0.0" : config.host;
    EpExchangeOptions exchange;
    exchange.kind = e.ep_exchange;
    // Decode batches (padded to a graph bucket) and prefill chunks both fit.
    exchange.max_tokens = static_cast<int32_t>(std::max<int64_t>(
        {e.max_batch_tokens, e.max_running, e.cuda_graphs ? e.cuda_graph_max_batch : 0}));
    options.group.dispatcher =
        e.expert_parallel ? EpDispatcherFactory(exchange) : LocalDispatcherFactory();
    options.placement = e.placement;
    ResultOutbox* outbox = self->outbox_.get();
    self->controller_ = std::make_unique<GroupController>(
        std::move(options), [outbox](std::vector<RequestResult> r) { outbox->Add(std::move(r)); });
  }
  self->incarnation_ = NewIncarnation();
  self->start_time_ = absl::Now();
  self->auth_ = std::make_unique<TokenAuthenticator>(config.auth_token);
  self->service_ = std::make_unique<Service>(self.get());

  const std::string address = absl::StrCat(config.host, ":", config.port);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &self->port_);
  builder.RegisterService(self->service_.get());
  self->server_ = builder.BuildAndStart();
  if (self->server_ == nullptr || self->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", address));
  }

  if (config.node_name.empty()) config.node_name = LocalHostname();
  if (config.worker_id.empty()) {
    config.worker_id = absl::StrCat(config.node_name, ":", self->port_);
  }
  self->config_ = std::move(config);

  CoordinatorLinkConfig link;
  link.coordinator_address = self->config_.coordinator_address;
  link.auth_token = self->config_.auth_token;
  link.worker_id = self->config_.worker_id;
  link.worker_incarnation = self->incarnation_;
  link.node_name = self->config_.node_name;
  link.listen_address = absl::StrCat(self->config_.advertise_host, ":", self->port_);
  link.devices = self->config_.devices;
  link.outbox = self->outbox_.get();
  if (self->controller_ != nullptr) {
    link.num_ranks = self->config_.engine.num_ranks;
    GroupController* controller = self->controller_.get();
    link.fill_heartbeat = [controller](HeartbeatRequest* r) { controller->FillHeartbeat(r); };
  }
  LOG(INFO) << "worker " << link.worker_id << " serving on " << link.listen_address << " with "
            << link.devices.size() << " device(s) (incarnation " << self->incarnation_
            << "); coordinator " << link.coordinator_address;
  self->link_ = std::make_unique<CoordinatorLink>(std::move(link));
  return self;
}

WorkerServer::~WorkerServer() { Shutdown(); }

void WorkerServer::Shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // Each part is timed and logged in one line (tools/bench/e2e_job.py reads it).
  const absl::Time start = absl::Now();
  absl::Time mark = start;
  auto lap = [&mark]() {
    const absl::Time now = absl::Now();
    const double s = absl::ToDoubleSeconds(now - mark);
    mark = now;
    return s;
  };
  // The coordinator first: its last results delivered, this worker LEFT, so that it stops
  // sending work here and runs this worker's requests elsewhere at once. The group RPCs are
  // refused from here on (the link is no longer registered).
  if (link_ != nullptr) (void)link_->Leave("the worker is shutting down");
  const double leave_s = lap();
  // Then the server: its handlers read link_.
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
  link_.reset();
  const double server_s = lap();
  // Rank threads end here; results they still produce stay in the outbox. The ranks' caches
  // hand their idle blocks to the store as they go, but only what outlives this process (the
  // disk tier): copying them into host memory freed at exit would only delay the exit.
  if (kv_block_store_ != nullptr) kv_block_store_->BeginShutdown();
  controller_.reset();
  const double ranks_s = lap();
  // The disk tier keeps them for the next worker on the directory.
  if (kv_block_store_ != nullptr) kv_block_store_->Flush();
  const double flush_s = lap();
  LOG(INFO) << absl::StrFormat(
      "shutdown: left the coordinator in %.3f s, server stopped in %.3f s, ranks stopped in "
      "%.3f s, KV store flushed in %.3f s; done at unix %.3f",
      leave_s, server_s, ranks_s, flush_s, absl::ToUnixMicros(absl::Now()) / 1e6);
}

CoordinatorLink::State WorkerServer::link_state() const {
  if (link_ == nullptr) return {};
  return link_->state();
}

}  // namespace deepinfer
