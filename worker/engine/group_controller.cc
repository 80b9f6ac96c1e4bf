// GroupController.
#include "worker/engine/group_controller.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/eplb/placement_proto.h"
#include "glog/logging.h"

namespace deepinfer {

GroupController::GroupController(GroupControllerOptions options, ResultSink sink)
    : options_(std::move(options)), sink_(std::move(sink)) {
  control_thread_ = std::thread([this] { ControlLoop(); });
}

GroupController::~GroupController() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  control_thread_.join();
  std::unique_ptr<RankGroup> current;
  {
    absl::MutexLock lock(&mu_);
    current = std::move(current_);
    retired_.clear();
  }
}

void GroupController::ControlLoop() {
  for (;;) {
    std::vector<std::unique_ptr<RankGroup>> retired;
    {
      absl::MutexLock lock(&mu_);
      auto work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !retired_.empty() || start_pending_;
      };
      mu_.Await(absl::Condition(&work));
      if (stop_) return;
      retired.swap(retired_);
    }
    // Stopping joins rank threads (and frees weights) before the next group loads its own.
    retired.clear();
    absl::MutexLock lock(&mu_);
    if (start_pending_ && retired_.empty() && current_ != nullptr) {
      current_->Start();
      start_pending_ = false;
    }
  }
}

absl::StatusOr<std::string> GroupController::Prepare(uint64_t generation) {
  auto root = comm::TcpCommunicator::ListenRoot(absl::StrCat(options_.bind_host, ":0"));
  if (!root.ok()) return root.status();
  if (!options_.advertise_host.empty() && options_.advertise_host != options_.bind_host) {
    const size_t colon = root->address.rfind(':');
    root->address = absl::StrCat(options_.advertise_host, root->address.substr(colon));
  }
  const std::string address = root->address;
  absl::MutexLock lock(&mu_);
  prepared_generation_ = generation;
  prepared_ = std::make_unique<comm::TcpCommunicator::RootListener>(std::move(*root));
  return address;
}

absl::Status GroupController::Configure(const ConfigureGroupRequest& request) {
  absl::MutexLock lock(&mu_);
  if (current_ != nullptr) {
    const uint64_t have = current_->layout().generation;
    if (request.generation() < have) {
      return absl::FailedPreconditionError(absl::StrCat(
          "generation ", request.generation(), " is older than the current one (", have, ")"));
    }
    if (request.generation() == have) return absl::OkStatus();  // a retried call
  }
  GroupLayout layout;
  layout.generation = request.generation();
  layout.group_incarnation = request.group_incarnation();
  layout.world_size = request.world_size();
  layout.first_rank = request.first_rank();
  layout.num_ranks = options_.num_ranks;
  layout.root_address = request.root_address();
  if (request.placement().layers_size() > 0) {
    auto placement = PlacementFromProto(request.placement());
    if (!placement.ok()) return placement.status();
    layout.placement = std::make_shared<const ExpertPlacement>(std::move(*placement));
    layout.placement_epoch = request.placement().epoch();
  } else {
    layout.placement = options_.placement;
  }
  std::unique_ptr<comm::TcpCommunicator::RootListener> root;
  if (layout.first_rank == 0 && layout.world_size > 1 && prepared_ != nullptr &&
      prepared_generation_ == request.generation()) {
    root = std::move(prepared_);
  }
  // A socket prepared for this or an older generation is not needed any more (a group of
  // one never connects to it).
  if (prepared_generation_ <= request.generation()) prepared_.reset();
  auto group = RankGroup::Create(options_.group, layout, std::move(root), sink_);
  if (!group.ok()) return group.status();
  LOG(INFO) << "configuring group generation " << layout.generation << ": ranks "
            << layout.first_rank << ".." << layout.first_rank + layout.num_ranks - 1 << " of "
            << layout.world_size;
  if (current_ != nullptr) retired_.push_back(std::move(current_));
  current_ = std::move(*group);
  start_pending_ = true;
  return absl::OkStatus();
}

absl::Status GroupController::Submit(uint64_t generation, std::vector<WorkItem> items) {
  absl::MutexLock lock(&mu_);
  if (current_ == nullptr) {
    return absl::FailedPreconditionError("this worker has no group yet (ConfigureGroup first)");
  }
  if (current_->layout().generation != generation) {
    return absl::FailedPreconditionError(absl::StrCat("generation ", generation,
                                                      " is not this worker's group (generation ",
                                                      current_->layout().generation, ")"));
  }
  if (current_->status() == GROUP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("group generation ", generation, " failed: ", current_->error()));
  }
  return current_->Submit(std::move(items));
}

void GroupController::Cancel(const std::vector<std::string>& request_ids) {
  absl::MutexLock lock(&mu_);
  if (current_ != nullptr) current_->Cancel(request_ids);
}

absl::Status GroupController::SetPlacement(const SetExpertPlacementRequest& request) {
  auto placement = PlacementFromProto(request.placement());
  if (!placement.ok()) return placement.status();
  absl::MutexLock lock(&mu_);
  if (current_ == nullptr || current_->layout().generation != request.generation()) {
    return absl::FailedPreconditionError(absl::StrCat("expert placement for group generation ",
                                                      request.generation(),
                                                      ", which is not this worker's group"));
  }
  if (current_->status() == GROUP_FAILED) {
    return absl::FailedPreconditionError(
        absl::StrCat("group generation ", request.generation(), " failed: ", current_->error()));
  }
  return current_->SetPlacement(std::make_shared<const ExpertPlacement>(std::move(*placement)),
                                request.placement().epoch());
}

void GroupController::FillHeartbeat(HeartbeatRequest* request) const {
  absl::MutexLock lock(&mu_);
  if (current_ == nullptr) {
    request->set_group_status(GROUP_NONE);
    return;
  }
  request->set_group_generation(current_->layout().generation);
  request->set_group_status(current_->status());
  request->set_group_error(current_->error());
  for (RankLoad& load : current_->Loads()) *request->add_rank_loads() = std::move(load);
  for (RequestProgress& p : current_->Progress()) {
    *request->add_request_progress() = std::move(p);
  }
  request->set_placement_epoch(current_->placement_epoch());
  for (ExpertLoadReport& r : current_->TakeExpertLoads()) {
    *request->add_expert_loads() = std::move(r);
  }
}

}  // namespace deepinfer
