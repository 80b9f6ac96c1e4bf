// ExchangeThread: runs expert exchanges (ExpertDispatcher::Exchange: communicator calls and host
// copies only) one at a time, in the order they were submitted, on a thread of its own, so that
// the engine thread computes one micro-batch while the other's exchange runs (DeepseekV3Model's
// two micro-batches, MoeBlock's staged forward). Every rank of a group submits its exchanges in
// the same order, which is then the order of the collectives on every rank.
//
// The thread starts at the first Submit. Every submitted exchange must be waited for (Wait or
// WaitAll) before what it reads and writes goes away; the destructor waits for all of them.
// Submit and Wait are called from one thread (the model's).
#ifndef DEEPINFER_WORKER_MODEL_MOE_EXCHANGE_THREAD_H_
#define DEEPINFER_WORKER_MODEL_MOE_EXCHANGE_THREAD_H_

#include <cstdint>
#include <deque>
#include <map>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/model/expert_dispatcher.h"

namespace deepinfer {

class ExchangeThread {
 public:
  ExchangeThread() = default;
  ~ExchangeThread();
  ExchangeThread(const ExchangeThread&) = delete;
  ExchangeThread& operator=(const ExchangeThread&) = delete;

  using Ticket = int64_t;
  // Queues `exchange` behind the ones submitted before (an empty one completes at once, OK).
  Ticket Submit(ExpertDispatcher::Exchange exchange);
  // Waits until exchange `ticket` has run; its status (each ticket once).
  absl::Status Wait(Ticket ticket);
  // Waits for every exchange submitted so far; the first error among those not waited for.
  absl::Status WaitAll();

 private:
  void Loop();

  absl::Mutex mu_;
  std::deque<std::pair<Ticket, ExpertDispatcher::Exchange>> queue_ ABSL_GUARDED_BY(mu_);
  // Statuses of the exchanges that ran and were not waited for yet.
  std::map<Ticket, absl::Status> finished_ ABSL_GUARDED_BY(mu_);
  Ticket next_ ABSL_GUARDED_BY(mu_) = 0;
  Ticket ran_ ABSL_GUARDED_BY(mu_) = 0;  // exchanges [0, ran_) have run
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_MODEL_MOE_EXCHANGE_THREAD_H_
