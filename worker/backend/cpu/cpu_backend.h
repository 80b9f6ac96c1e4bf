// CpuBackend: the reference implementation of Backend in fp32 on host memory, multi-threaded
// with a ThreadPool. Weights are fp32, or bf16 (BackendOptions::dtype) so CI can run the bf16
// model: a bf16 GEMM widens the weight tile and the bf16-rounded activations to fp32 on the
// fly and runs the fp32 kernel, i.e. exactly bf16 x bf16 products with fp32 accumulation. It is
// what CI runs and the oracle the CUDA kernels are checked against, so it favours clear, exactly
// specified arithmetic (fp32 storage, fp32 accumulation with fixed summation order) over speed.
#ifndef DEEPINFER_WORKER_BACKEND_CPU_CPU_BACKEND_H_
#define DEEPINFER_WORKER_BACKEND_CPU_CPU_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/backend.h"
#include "worker/backend/cpu/cpu_v4_ops.h"
#include "worker/backend/cpu/thread_pool.h"

namespace deepinfer {

class CpuBackend : public Backend {
 public:
  // num_threads <= 0: one per hardware thread.
  explicit CpuBackend(int num_threads = 0, WeightDType weight_dtype = WeightDType::kFloat32);

  std::string name() const override { return "cpu"; }
  WeightDType weight_dtype() const override { return weight_dtype_; }
  std::unique_ptr<DeviceBuffer> Allocate(size_t bytes) override;
  void CopyToDevice(const void* host, size_t bytes, void* device) override;
  void CopyToHost(const void* device, size_t bytes, void* host) override;
  void CopyDeviceToDevice(const void* src, size_t bytes, void* dst) override;
  void Synchronize() override {}
  V4Ops* v4_ops() override { return &v4_ops_; }

  void Gemm(int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda, WeightView w,
            int64_t ldw, float* c, int64_t ldc, bool accumulate) override;
  void BatchedGemm(int64_t batch, int64_t m, int64_t n, int64_t k, ActivationView a, int64_t lda,
                   int64_t stride_a, WeightView w, int64_t ldw, int64_t stride_w, float* c,
                   int64_t ldc, int64_t stride_c) override;
  void GroupedGemm(const std::vector<int64_t>& offsets, const std::vector<WeightView>& weights,
                   int64_t n, int64_t k, const float* a, float* c) override;
  void RmsNorm(int64_t rows, int64_t dim, const float* x, int64_t ldx, const float* weight,
               float eps, float* out, int64_t ldout) override;
  void Add(int64_t n, const float* a, const float* b, float* out) override;
  void AddRmsNorm(int64_t rows, int64_t dim, float* x, const float* y, const float* weight,
                  float eps, float* out, uint16_t* out_bf16) override;
  void RmsNormBf16(int64_t rows, int64_t dim, const float* x, int64_t ldx, const float* weight,
                   float eps, uint16_t* out_bf16) override;
  void SiluMul(int64_t rows, int64_t inter, const float* x, float* out) override;
  void SiluMulBf16(int64_t rows, int64_t inter, const float* x, uint16_t* out) override;
  // The host values of Backend::FillDummy, written in place by the thread pool.
  void FillDummy(const DummyFill& fill, int64_t n, WeightDType dtype, void* out) override;
  void NormRopeWriteLatentCache(const NormRopeCacheArgs& args) override;
  void GatherRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                  float* dst) override;
  void ScatterAddRows(int64_t rows, int64_t dim, const float* src, const int32_t* idx,
                      const float* weight, float* dst) override;
  void ApplyRope(int64_t tokens, int64_t heads, float* x, int64_t token_stride, int64_t head_stride,
                 int64_t rope_dim, const int32_t* positions, const float* inv_freq,
                 float attention_factor, bool interleaved) override;
  void WriteLatentCache(int64_t tokens, const float* latent, int64_t ld_latent,
                        const float* rope_key, int64_t ld_rope, const int32_t* slots,
                        const PagedLatentCacheView& cache) override;
  void MlaAttention(const MlaAttentionArgs& args) override;
  bool MhaPrefillAttention(const MhaPrefillArgs& args) override;
  void NoauxTcRoute(const NoauxTcRouteArgs& args) override;
  void AccumulateExpertCounts(int64_t n, const int32_t* ids, int64_t num_experts,
                              const int32_t* count_limit, int64_t* counts) override;
  void ArgmaxRows(int64_t rows, int64_t vocab, const float* logits, int32_t* out) override;
  void GreedySampleRows(int64_t rows, int64_t vocab, const float* logits, int32_t* token,
                        float* logprob) override;
  void MaskLogitsRows(int64_t n, int64_t vocab, float* logits, const int32_t* rows,
                      const uint32_t* masks) override;
  void SampleRows(int64_t rows, int64_t vocab, const float* logits, const RowSamplingParams* params,
                  int32_t* token, float* logprob) override;
  void TopLogprobsRows(int64_t rows, int64_t vocab, const float* logits, int32_t n, int32_t* ids,
                       float* logprobs) override;
  void AdjustLogits(int64_t rows, int64_t vocab, float* logits, int64_t n,
                    const LogitAdjustment* adjustments, const int32_t* count) override;
  void TokenLogprobRows(int64_t rows, int64_t vocab, const float* logits, const int32_t* token,
                        float* logprob) override;

  // The first invalid-argument error an op has hit (only TopLogprobsRows reports one).
  absl::Status status() const override;

 private:
  void Record(const absl::Status& st);

  ThreadPool pool_;
  CpuV4Ops v4_ops_{&pool_};
  const WeightDType weight_dtype_;
  mutable absl::Mutex mu_;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace deepinfer

#endif  // DEEPINFER_WORKER_BACKEND_CPU_CPU_BACKEND_H_
