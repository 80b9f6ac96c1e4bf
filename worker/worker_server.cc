#include "worker/worker_server.h"

#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/rpc/incarnation.h"
#include "glog/logging.h"

namespace deepinfer {

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

 private:
  const WorkerServer* const owner_;
};

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(WorkerConfig config) {
  if (config.coordinator_address.empty()) {
    return absl::InvalidArgumentError("no coordinator address (--coordinator HOST:PORT)");
  }
  if (config.devices.empty()) return absl::InvalidArgumentError("no devices to serve");
  std::unique_ptr<WorkerServer> self(new WorkerServer());
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
  if (config.advertise_host.empty()) {
    const bool wildcard = config.host == "0.0.0.0" || config.host == "::" || config.host == "[::]";
    config.advertise_host = wildcard ? LocalHostname() : config.host;
  }
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
  LOG(INFO) << "worker " << link.worker_id << " serving on " << link.listen_address
            << " with " << link.devices.size() << " device(s) (incarnation "
            << self->incarnation_ << "); coordinator " << link.coordinator_address;
  self->link_ = std::make_unique<CoordinatorLink>(std::move(link));
  return self;
}

WorkerServer::~WorkerServer() { Shutdown(); }

void WorkerServer::Shutdown() {
  // The server first: its handlers read link_.
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server_.reset();
  }
  link_.reset();
}

CoordinatorLink::State WorkerServer::link_state() const {
  if (link_ == nullptr) return {};
  return link_->state();
}

}  // namespace deepinfer
