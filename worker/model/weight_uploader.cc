// WeightUploader implementation.
#include "worker/model/weight_uploader.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace deepinfer {

WeightUploader::WeightUploader(Backend* backend, WeightUploadOptions options)
    : backend_(backend), options_(options) {}

void WeightUploader::Add(const std::string& shard, std::vector<size_t> sizes,
                         std::vector<std::unique_ptr<DeviceBuffer>*> outs, int64_t scratch_bytes,
                         Produce produce) {
  for (size_t s : sizes) bytes_ += static_cast<int64_t>(s);
  auto it = std::find(shards_.begin(), shards_.end(), shard);
  if (it == shards_.end()) {
    shards_.push_back(shard);
    by_shard_.emplace_back();
    it = shards_.end() - 1;
  }
  by_shard_[it - shards_.begin()].push_back(static_cast<int>(jobs_.size()));
  jobs_.push_back({std::move(sizes), std::move(outs), scratch_bytes, std::move(produce)});
}

absl::Status WeightUploader::Run() {
  absl::Status st = options_.threads <= 1 || jobs_.size() <= 1 ? RunSerially() : RunInParallel();
  jobs_.clear();
  shards_.clear();
  by_shard_.clear();
  return st;
}

absl::Status WeightUploader::RunSerially() {
  for (Job& job : jobs_) {
    std::vector<std::vector<char>> host(job.sizes.size());
    std::vector<char*> out(job.sizes.size());
    for (size_t i = 0; i < host.size(); ++i) {
      host[i].resize(std::max<size_t>(job.sizes[i], 1));
      out[i] = host[i].data();
    }
    if (absl::Status st = job.produce(out); !st.ok()) return st;
    for (size_t i = 0; i < host.size(); ++i) {
      *job.outs[i] = backend_->Allocate(job.sizes[i]);
      backend_->CopyToDevice(host[i].data(), job.sizes[i], (*job.outs[i])->data());
    }
  }
  return absl::OkStatus();
}

namespace {

int64_t Sum(const std::vector<size_t>& sizes) {
  int64_t n = 0;
  for (size_t s : sizes) n += static_cast<int64_t>(s);
  return n;
}

// What the threads and the uploading thread share.
struct Shared {
  absl::Mutex mu;
  std::vector<size_t> next ABSL_GUARDED_BY(mu);  // per shard: its next job not taken
  int64_t in_use ABSL_GUARDED_BY(mu) = 0;        // staging and scratch held, bytes
  // Staging buffers free for the next jobs, by capacity.
  std::multimap<size_t, std::unique_ptr<HostStagingBuffer>> free_staging ABSL_GUARDED_BY(mu);
  int64_t free_bytes ABSL_GUARDED_BY(mu) = 0;
  struct Ready {
    int job;
    std::vector<std::unique_ptr<HostStagingBuffer>> staging;
  };
  std::deque<Ready> ready ABSL_GUARDED_BY(mu);
  int running ABSL_GUARDED_BY(mu) = 0;  // threads not yet done
  // The lowest-numbered failing job so far and its error. Jobs numbered below it still run (one
  // of them may fail too), so the error returned is the one a serial run returns.
  int error_job ABSL_GUARDED_BY(mu) = std::numeric_limits<int>::max();
  absl::Status error ABSL_GUARDED_BY(mu);
};

}  // namespace

absl::Status WeightUploader::RunInParallel() {
  Shared sh;
  const int64_t budget = std::max<int64_t>(options_.staging_bytes, 1);
  const int num_threads = std::min<int>(options_.threads, static_cast<int>(jobs_.size()));
  {
    absl::MutexLock lock(&sh.mu);
    sh.next.assign(shards_.size(), 0);
    sh.running = num_threads;
  }

  // A staging buffer of at least `size` bytes: a free one not much larger, else a new one.
  auto take_staging = [&](size_t size) -> std::unique_ptr<HostStagingBuffer> {
    {
      absl::MutexLock lock(&sh.mu);
      auto it = sh.free_staging.lower_bound(size);
      if (it != sh.free_staging.end() &&
          it->first <= std::max<size_t>(2 * size, size + (16 << 20))) {
        std::unique_ptr<HostStagingBuffer> b = std::move(it->second);
        sh.free_bytes -= static_cast<int64_t>(it->first);
        sh.free_staging.erase(it);
        return b;
      }
    }
    return backend_->AllocateHostStaging(size);
  };

  auto work = [&](int t) {
    size_t shard = static_cast<size_t>(t) % shards_.size();
    while (true) {
      int j = -1;
      int64_t cost = 0;
      {
        absl::MutexLock lock(&sh.mu);
        // This thread's shard first, then the next one with jobs left below the failing one (a
        // shard's jobs are numbered in order, so none of its later jobs is below it either).
        for (size_t k = 0; k < shards_.size() && j < 0; ++k) {
          const size_t s = (shard + k) % shards_.size();
          if (sh.next[s] < by_shard_[s].size() && by_shard_[s][sh.next[s]] < sh.error_job) {
            shard = s;
            j = by_shard_[s][sh.next[s]++];
          }
        }
        if (j < 0) {
          --sh.running;
          return;
        }
        cost = Sum(jobs_[j].sizes) + jobs_[j].scratch_bytes;
        auto room = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh.mu) {
          return sh.in_use == 0 || sh.in_use + cost <= budget;
        };
        sh.mu.Await(absl::Condition(&room));
        if (j > sh.error_job) continue;  // a lower job failed meanwhile
        sh.in_use += cost;
      }
      const Job& job = jobs_[j];
      std::vector<std::unique_ptr<HostStagingBuffer>> staging;
      std::vector<char*> out;
      for (size_t size : job.sizes) {
        staging.push_back(take_staging(std::max<size_t>(size, 1)));
        out.push_back(static_cast<char*>(staging.back()->data()));
      }
      absl::Status st = job.produce(out);
      absl::MutexLock lock(&sh.mu);
      sh.in_use -= job.scratch_bytes;
      if (!st.ok() && j < sh.error_job) {
        sh.error_job = j;
        sh.error = st;
      }
      if (sh.error.ok()) {
        sh.ready.push_back({j, std::move(staging)});
      } else {
        sh.in_use -= Sum(job.sizes);  // not uploaded: the run fails
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < num_threads; ++t) threads.emplace_back(work, t);

  // Uploads in flight (their staging memory is read until the backend is synchronised).
  std::vector<std::unique_ptr<HostStagingBuffer>> in_flight;
  int64_t in_flight_bytes = 0;
  auto synchronize = [&] {
    if (in_flight.empty()) return;
    backend_->Synchronize();
    absl::MutexLock lock(&sh.mu);
    sh.in_use -= in_flight_bytes;
    for (auto& b : in_flight) {
      sh.free_bytes += static_cast<int64_t>(b->size_bytes());
      const size_t capacity = b->size_bytes();
      sh.free_staging.emplace(capacity, std::move(b));
    }
    // Keep at most a budget's worth for reuse, the largest buffers going first.
    while (sh.free_bytes > budget && !sh.free_staging.empty()) {
      auto last = std::prev(sh.free_staging.end());
      sh.free_bytes -= static_cast<int64_t>(last->first);
      sh.free_staging.erase(last);
    }
    in_flight.clear();
    in_flight_bytes = 0;
  };
  while (true) {
    Shared::Ready item;
    bool idle = false;
    {
      absl::MutexLock lock(&sh.mu);
      idle = sh.ready.empty();
    }
    // Nothing to upload yet: the staging in flight goes back, so that waiting threads can go on.
    if (idle) synchronize();
    {
      absl::MutexLock lock(&sh.mu);
      auto go = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh.mu) {
        return !sh.ready.empty() || sh.running == 0;
      };
      sh.mu.Await(absl::Condition(&go));
      if (sh.ready.empty()) break;  // every thread is done
      item = std::move(sh.ready.front());
      sh.ready.pop_front();
      if (!sh.error.ok()) {  // the run fails: its staging goes back unused
        sh.in_use -= Sum(jobs_[item.job].sizes);
        continue;
      }
    }
    const Job& job = jobs_[item.job];
    for (size_t i = 0; i < job.sizes.size(); ++i) {
      *job.outs[i] = backend_->Allocate(job.sizes[i]);
      backend_->CopyToDeviceAsync(item.staging[i]->data(), job.sizes[i], (*job.outs[i])->data());
      in_flight_bytes += static_cast<int64_t>(job.sizes[i]);
      in_flight.push_back(std::move(item.staging[i]));
    }
    if (in_flight_bytes >= budget / 2) synchronize();
  }
  synchronize();
  for (std::thread& t : threads) t.join();
  absl::MutexLock lock(&sh.mu);
  return sh.error;
}

}  // namespace deepinfer
