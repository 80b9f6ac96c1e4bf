#include "worker/coordinator_link.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/auth.h"
#include "glog/logging.h"

namespace deepinfer {
namespace {

std::unique_ptr<grpc::ClientContext> MakeContext(const CoordinatorLinkConfig& config) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + config.rpc_timeout));
  AttachAuthToken(config.auth_token, context.get());
  return context;
}

}  // namespace

CoordinatorLink::CoordinatorLink(CoordinatorLinkConfig config)
    : config_(std::move(config)),
      stub_(ClusterService::NewStub(
          grpc::CreateChannel(config_.coordinator_address, grpc::InsecureChannelCredentials()))),
      thread_([this] { Run(); }) {
  if (config_.outbox != nullptr) results_thread_ = std::thread([this] { SendResults(); });
}

CoordinatorLink::~CoordinatorLink() { Stop(); }

void CoordinatorLink::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  // The results thread may be waiting for results: it sees stop_ at once.
  if (config_.outbox != nullptr) config_.outbox->Interrupt();
  if (thread_.joinable()) thread_.join();
  if (results_thread_.joinable()) results_thread_.join();
}

absl::Status CoordinatorLink::Leave(const std::string& reason) {
  if (config_.outbox != nullptr) {
    const absl::Time deadline = absl::Now() + config_.leave_flush_timeout;
    while (config_.outbox->size() > 0 && absl::Now() < deadline && state().registered) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (size_t left = config_.outbox->size(); left > 0) {
      LOG(WARNING) << left << " result(s) not delivered before leaving; the coordinator runs "
                   << "those requests again";
    }
  }
  Stop();
  uint64_t incarnation;
  {
    absl::MutexLock lock(&mu_);
    if (!state_.registered) return absl::OkStatus();
    incarnation = state_.coordinator_incarnation;
    state_.registered = false;
  }
  DeregisterRequest request;
  request.set_worker_id(config_.worker_id);
  request.set_worker_incarnation(config_.worker_incarnation);
  request.set_coordinator_incarnation(incarnation);
  request.set_reason(reason);
  DeregisterResponse response;
  grpc::Status status = stub_->Deregister(MakeContext(config_).get(), request, &response);
  if (!status.ok()) {
    LOG(WARNING) << "Deregister at " << config_.coordinator_address
                 << " failed: " << status.error_message() << " [code " << status.error_code()
                 << "]; the coordinator notices after its heartbeat timeout";
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  LOG(INFO) << "deregistered from coordinator " << config_.coordinator_address << " (" << reason
            << ")";
  return absl::OkStatus();
}

CoordinatorLink::State CoordinatorLink::state() const {
  absl::MutexLock lock(&mu_);
  return state_;
}

bool CoordinatorLink::SleepUnlessStopped(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stop_), d);
  return !stop_;
}

void CoordinatorLink::LogFailure(const std::string& what, const grpc::Status& status) {
  // First failure and then every 20th, so an absent coordinator does not flood logs.
  if (consecutive_failures_++ % 20 == 0) {
    LOG(WARNING) << what << " " << config_.coordinator_address << " failed ("
                 << consecutive_failures_ << " in a row): " << status.error_message() << " [code "
                 << status.error_code() << "]";
  }
  absl::MutexLock lock(&mu_);
  state_.last_error = absl::StrCat(what, ": ", status.error_message());
}

void CoordinatorLink::Run() {
  for (;;) {
    bool registered;
    absl::Duration interval;
    {
      absl::MutexLock lock(&mu_);
      if (stop_) return;
      registered = state_.registered;
      interval = heartbeat_interval_;
    }
    if (!registered) {
      if (!RegisterOnce() && !SleepUnlessStopped(config_.retry_interval)) return;
      continue;
    }
    if (!SleepUnlessStopped(interval)) return;
    HeartbeatOnce();
  }
}

bool CoordinatorLink::RegisterOnce() {
  RegisterRequest request;
  request.set_worker_id(config_.worker_id);
  request.set_worker_incarnation(config_.worker_incarnation);
  request.set_node_name(config_.node_name);
  request.set_listen_address(config_.listen_address);
  for (const Device& d : config_.devices) *request.add_devices() = d;
  request.set_num_ranks(config_.num_ranks);
  RegisterResponse response;
  grpc::Status status = stub_->Register(MakeContext(config_).get(), request, &response);
  if (!status.ok()) {
    LogFailure("registering with", status);
    return false;
  }
  consecutive_failures_ = 0;
  absl::MutexLock lock(&mu_);
  if (state_.coordinator_incarnation != 0 &&
      state_.coordinator_incarnation != response.coordinator_incarnation()) {
    LOG(INFO) << "coordinator restarted (incarnation " << state_.coordinator_incarnation << " -> "
              << response.coordinator_incarnation() << ")";
  }
  state_.registered = true;
  state_.coordinator_incarnation = response.coordinator_incarnation();
  ++state_.registrations;
  state_.last_error.clear();
  heartbeat_interval_ = absl::Milliseconds(response.heartbeat_interval_ms());
  if (heartbeat_interval_ <= absl::ZeroDuration()) heartbeat_interval_ = absl::Seconds(1);
  LOG(INFO) << "registered as " << config_.worker_id << " with coordinator "
            << config_.coordinator_address << " (incarnation " << response.coordinator_incarnation()
            << "), heartbeat every " << heartbeat_interval_;
  return true;
}

void CoordinatorLink::HeartbeatOnce() {
  HeartbeatRequest request;
  request.set_worker_id(config_.worker_id);
  request.set_worker_incarnation(config_.worker_incarnation);
  uint64_t known_incarnation;
  {
    absl::MutexLock lock(&mu_);
    known_incarnation = state_.coordinator_incarnation;
  }
  request.set_coordinator_incarnation(known_incarnation);
  if (config_.fill_heartbeat) config_.fill_heartbeat(&request);
  HeartbeatResponse response;
  grpc::Status status = stub_->Heartbeat(MakeContext(config_).get(), request, &response);
  if (status.ok() && response.coordinator_incarnation() == known_incarnation) {
    consecutive_failures_ = 0;
    return;
  }
  const bool must_register = status.ok() || status.error_code() == grpc::StatusCode::NOT_FOUND ||
                             status.error_code() == grpc::StatusCode::FAILED_PRECONDITION;
  if (must_register) {
    LOG(INFO) << "coordinator asks this worker to register again: "
              << (status.ok() ? "it has a new incarnation" : status.error_message());
    absl::MutexLock lock(&mu_);
    state_.registered = false;
    return;
  }
  // Unreachable coordinator (or refused token): keep the registration and retry; a
  // restarted coordinator answers NOT_FOUND, which leads back to Register.
  LogFailure("heartbeat to", status);
}

void CoordinatorLink::SendResults() {
  ResultOutbox* outbox = config_.outbox;
  for (;;) {
    uint64_t incarnation;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]()
                       ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_ || state_.registered; };
      mu_.Await(absl::Condition(&ready));
      if (stop_) return;
      incarnation = state_.coordinator_incarnation;
    }
    // Stop() interrupts the wait.
    if (!outbox->WaitForResults(absl::Milliseconds(100))) continue;
    std::vector<RequestResult> batch = outbox->Peek(config_.results_per_call);
    ReportResultsRequest request;
    request.set_worker_id(config_.worker_id);
    request.set_worker_incarnation(config_.worker_incarnation);
    request.set_coordinator_incarnation(incarnation);
    for (RequestResult& r : batch) *request.add_results() = std::move(r);
    ReportResultsResponse response;
    grpc::Status status = stub_->ReportResults(MakeContext(config_).get(), request, &response);
    if (status.ok()) {
      outbox->Pop(batch.size());
      absl::MutexLock lock(&mu_);
      state_.results_delivered += static_cast<int64_t>(batch.size());
      continue;
    }
    if (status.error_code() == grpc::StatusCode::NOT_FOUND ||
        status.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      // The coordinator does not know this registration: register again (unless the link
      // thread already did, with a newer incarnation), then resend.
      LOG(INFO) << "ReportResults refused (" << status.error_message() << "); resending after "
                << "registering again";
      absl::MutexLock lock(&mu_);
      if (state_.coordinator_incarnation == incarnation) state_.registered = false;
      continue;
    }
    LOG(WARNING) << "ReportResults to " << config_.coordinator_address
                 << " failed: " << status.error_message() << " [code " << status.error_code()
                 << "]; retrying";
    if (!SleepUnlessStopped(config_.retry_interval)) return;
  }
}

}  // namespace deepinfer
