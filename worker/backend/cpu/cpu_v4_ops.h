// CpuV4Ops: the DeepSeek-V4 ops (worker/backend/v4_ops.h) in fp32 on host memory, split over
// the CPU backend's thread pool by rows. Each output row is computed by one thread in a fixed
// order, so results do not depend on the thread count.
#ifndef DEEPINFER_WORKER_BACKEND_CPU_CPU_V4_OPS_H_
#define DEEPINFER_WORKER_BACKEND_CPU_CPU_V4_OPS_H_

#include <cstdint>

#include "worker/backend/cpu/thread_pool.h"
#include "worker/backend/v4_ops.h"

namespace deepinfer {

class CpuV4Ops : public V4Ops {
 public:
  explicit CpuV4Ops(ThreadPool* pool) : pool_(pool) {}

  void HcMix(const HcMixArgs& args) override;
  void HcHead(const HcHeadArgs& args) override;
  void HcExpand(const HcExpandArgs& args) override;
  void CompressWindows(const CompressWindowsArgs& args) override;
  void SinkAttention(const SinkAttentionArgs& args) override;
  void IndexerTopK(const IndexerTopKArgs& args) override;
  void Route(const V4RouteArgs& args) override;
  void CopyRows(const CopyRowsArgs& args) override;
  void SwiGluClamped(int64_t rows, int64_t inter, const float* x, float limit, float* out) override;

 private:
  ThreadPool* pool_;
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CPU_CPU_V4_OPS_H_
