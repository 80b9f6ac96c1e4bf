// NcclCommunicator on real GPUs: every collective in a group of one (one GPU), the bootstrap
// over a TCP group and every collective between two ranks on two GPUs (skipped with fewer),
// deadlines (a rank that never joins, a peer that aborted) and the sticky first error.
// Expected values are computed on the host from the inputs, independently of NCCL.
#include "worker/comm/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/testing/gpu_test_util.h"
#include "worker/comm/data_plane.h"
#include "worker/comm/tcp_test_group.h"

namespace deepinfer::comm {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

int GpuCount() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// A device buffer of this thread's current GPU.
class DeviceBytes {
 public:
  explicit DeviceBytes(size_t bytes) : bytes_(bytes) {
    if (bytes > 0) {
      EXPECT_EQ(cudaMalloc(&ptr_, bytes), cudaSuccess);
      EXPECT_EQ(cudaMemset(ptr_, 0xEE, bytes), cudaSuccess);
    }
  }
  ~DeviceBytes() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  template <typename T>
  void Upload(const std::vector<T>& v) {
    ASSERT_EQ(v.size() * sizeof(T), bytes_);
    if (bytes_ > 0) {
      ASSERT_EQ(cudaMemcpy(ptr_, v.data(), bytes_, cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  template <typename T>
  std::vector<T> Download() const {
    std::vector<T> v(bytes_ / sizeof(T));
    if (bytes_ > 0) {
      EXPECT_EQ(cudaMemcpy(v.data(), ptr_, bytes_, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return v;
  }
  void* get() const { return ptr_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  size_t bytes_;
  void* ptr_ = nullptr;
};

absl::StatusOr<std::unique_ptr<NcclCommunicator>> MakeOneRank(absl::Duration timeout) {
  absl::StatusOr<std::string> id = NcclCommunicator::NewUniqueId();
  if (!id.ok()) return id.status();
  NcclCommunicatorSpec spec;
  spec.unique_id = *id;
  spec.timeout = timeout;
  return NcclCommunicator::Create(spec);
}

// Byte i of what rank `from` sends rank `to`.
uint8_t Payload(int from, int to, size_t i) {
  return static_cast<uint8_t>(from * 61 + to * 17 + i * 7 + (i >> 8));
}

TEST(NcclCommunicatorTest, OneRankRunsEveryCollective) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  EXPECT_EQ(NcclCommunicator::UniqueIdBytes(), 128u);
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto c = MakeOneRank(absl::Seconds(30));
  ASSERT_TRUE(c.ok()) << c.status();
  NcclCommunicator& comm = **c;
  EXPECT_EQ(comm.memory_kind(), MemoryKind::kDevice);
  EXPECT_EQ(comm.world_size(), 1);
  EXPECT_STREQ(std::getenv("NCCL_NVLS_ENABLE"), "0");

  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = Payload(0, 0, i);
  DeviceBytes send(bytes.size()), recv(bytes.size());
  send.Upload(bytes);
  absl::StatusOr<std::vector<size_t>> sizes = comm.AllToAllSizes({bytes.size()});
  ASSERT_TRUE(sizes.ok()) << sizes.status();
  EXPECT_EQ(*sizes, std::vector<size_t>{bytes.size()});
  ASSERT_TRUE(comm.AllToAllV(send.get(), {bytes.size()}, recv.get(), {bytes.size()}).ok());
  ASSERT_TRUE(comm.Barrier().ok());
  EXPECT_EQ(recv.Download<uint8_t>(), bytes);

  // AllGather, also in place.
  DeviceBytes gathered(bytes.size());
  ASSERT_TRUE(comm.AllGather(send.get(), bytes.size(), gathered.get()).ok());
  ASSERT_TRUE(comm.AllGather(gathered.get(), bytes.size(), gathered.get()).ok());
  ASSERT_TRUE(comm.Barrier().ok());
  EXPECT_EQ(gathered.Download<uint8_t>(), bytes);

  // AllReduce of one rank is the identity, for both types and both ops.
  std::vector<float> f = {1.5f, -2.25f, 3e-8f, 7.0f};
  std::vector<int64_t> l = {int64_t{1} << 40, -3, 0, 99};
  DeviceBytes fd(f.size() * 4), fo(f.size() * 4), ld(l.size() * 8);
  fd.Upload(f);
  ld.Upload(l);
  ASSERT_TRUE(comm.AllReduce(fd.as<float>(), fo.as<float>(), f.size(), ReduceOp::kSum).ok());
  ASSERT_TRUE(comm.AllReduce(fd.as<float>(), fd.as<float>(), f.size(), ReduceOp::kMax).ok());
  ASSERT_TRUE(comm.AllReduce(ld.as<int64_t>(), ld.as<int64_t>(), l.size(), ReduceOp::kSum).ok());
  ASSERT_TRUE(comm.Barrier().ok());
  EXPECT_EQ(fo.Download<float>(), f);
  EXPECT_EQ(fd.Download<float>(), f);
  EXPECT_EQ(ld.Download<int64_t>(), l);

  // Zero sizes and null buffers are fine.
  ASSERT_TRUE(comm.AllToAllV(nullptr, {0}, nullptr, {0}).ok());
  ASSERT_TRUE(comm.AllGather(nullptr, 0, nullptr).ok());
  ASSERT_TRUE(comm.AllReduce(static_cast<float*>(nullptr), nullptr, 0, ReduceOp::kSum).ok());
  EXPECT_GT(comm.collectives_run(), 0u);

  // On an explicit stream.
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  DeviceBytes recv2(bytes.size());
  ASSERT_TRUE(comm.AllToAllV(send.get(), {bytes.size()}, recv2.get(), {bytes.size()}, stream).ok());
  ASSERT_TRUE(comm.Barrier(stream).ok());
  EXPECT_EQ(recv2.Download<uint8_t>(), bytes);
  cudaStreamDestroy(stream);
}

TEST(NcclCommunicatorTest, BadCallBreaksTheCommunicatorAndTheFirstErrorSticks) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto c = MakeOneRank(absl::Seconds(30));
  ASSERT_TRUE(c.ok()) << c.status();
  DeviceBytes a(16), b(8);
  absl::Status bad = (*c)->AllToAllV(a.get(), {16}, b.get(), {8});
  EXPECT_TRUE(absl::IsInvalidArgument(bad)) << bad;
  EXPECT_THAT(std::string(bad.message()), HasSubstr("AllToAllV on rank 0"));
  absl::Status later = (*c)->Barrier();
  EXPECT_EQ(later, bad);
  (*c)->Abort(absl::CancelledError("shutdown"));
  EXPECT_EQ((*c)->AllToAllSizes({0}).status(), bad);  // still the first error
}

TEST(NcclCommunicatorTest, AbortFailsLaterCallsWithAborted) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  auto c = MakeOneRank(absl::Seconds(30));
  ASSERT_TRUE(c.ok()) << c.status();
  (*c)->Abort(absl::CancelledError("leaving"));
  absl::Status s = (*c)->Barrier();
  EXPECT_TRUE(absl::IsAborted(s)) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("leaving"));
}

TEST(NcclCommunicatorTest, BadSpecIsInvalidArgument) {
  NcclCommunicatorSpec spec;
  spec.unique_id = "short";
  EXPECT_TRUE(absl::IsInvalidArgument(NcclCommunicator::Create(spec).status()));
  spec.unique_id = std::string(NcclCommunicator::UniqueIdBytes(), '\0');
  spec.rank = 2;
  spec.world_size = 2;
  EXPECT_TRUE(absl::IsInvalidArgument(NcclCommunicator::Create(spec).status()));
}

TEST(NcclCommunicatorTest, MissingRankTimesOutInsteadOfHanging) {
  DEEPINFER_SKIP_WITHOUT_GPU();
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  absl::StatusOr<std::string> id = NcclCommunicator::NewUniqueId();
  ASSERT_TRUE(id.ok()) << id.status();
  NcclCommunicatorSpec spec;
  spec.rank = 0;
  spec.world_size = 2;  // rank 1 never comes
  spec.unique_id = *id;
  spec.timeout = absl::Seconds(3);
  const absl::Time start = absl::Now();
  auto c = NcclCommunicator::Create(spec);
  EXPECT_TRUE(absl::IsDeadlineExceeded(c.status())) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("rank 0 of 2"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
}

// ---- Two ranks, one GPU each ----------------------------------------------------------------

class NcclTwoRankTest : public ::testing::Test {
 protected:
  static constexpr int kWorld = 2;
  void SetUp() override {
    if (GpuCount() < kWorld) GTEST_SKIP() << "needs " << kWorld << " GPUs, have " << GpuCount();
    tcp_ = testing::MakeTcpGroup(kWorld);
    ASSERT_EQ(tcp_.size(), static_cast<size_t>(kWorld));
    std::vector<absl::Status> status(kWorld);
    nccl_.resize(kWorld);
    testing::OnAllRanks(kWorld, [&](int r) {
      cudaSetDevice(r);
      auto c = FormNcclCommunicator(tcp_[r].get(), r, nullptr, absl::Seconds(20));
      status[r] = c.status();
      if (c.ok()) nccl_[r] = std::move(*c);
    });
    for (int r = 0; r < kWorld; ++r)
      ASSERT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
  }
  // Together, as ranks would: a healthy communicator's finalize may wait for its peers.
  void TearDown() override {
    if (nccl_.size() == kWorld) testing::OnAllRanks(kWorld, [&](int r) { nccl_[r].reset(); });
  }
  testing::TcpGroup tcp_;
  std::vector<std::unique_ptr<Communicator>> nccl_;
};

TEST_F(NcclTwoRankTest, EveryCollectiveMatchesTheHostComputation) {
  // Rank r sends (r + 1) * 1000 + 37 * to bytes to rank `to`; rank 1 sends nothing to itself.
  auto bytes_from_to = [](int from, int to) -> size_t {
    return from == 1 && to == 1 ? 0 : (from + 1) * 1000 + 37 * to;
  };
  std::vector<absl::Status> status(kWorld);
  std::vector<std::string> problems(kWorld);
  testing::OnAllRanks(kWorld, [&](int me) {
    cudaSetDevice(me);
    Communicator& c = *nccl_[me];
    std::vector<size_t> send_bytes(kWorld);
    std::vector<uint8_t> send_host;
    for (int to = 0; to < kWorld; ++to) {
      send_bytes[to] = bytes_from_to(me, to);
      for (size_t i = 0; i < send_bytes[to]; ++i) send_host.push_back(Payload(me, to, i));
    }
    auto recv_bytes = c.AllToAllSizes(send_bytes);
    if (!recv_bytes.ok()) {
      status[me] = recv_bytes.status();
      return;
    }
    std::vector<uint8_t> expect;
    for (int from = 0; from < kWorld; ++from) {
      if ((*recv_bytes)[from] != bytes_from_to(from, me)) problems[me] += "sizes differ; ";
      for (size_t i = 0; i < bytes_from_to(from, me); ++i) expect.push_back(Payload(from, me, i));
    }
    DeviceBytes send(send_host.size()), recv(expect.size());
    send.Upload(send_host);
    status[me] = c.AllToAllV(send.get(), send_bytes, recv.get(), *recv_bytes);
    if (!status[me].ok()) return;
    // AllGather of 3 floats per rank; AllReduce sum and max of floats and int64s.
    std::vector<float> mine = {static_cast<float>(me) + 0.5f, -1.0f * me, 1e3f};
    DeviceBytes g_send(12), g_recv(12 * kWorld);
    g_send.Upload(mine);
    std::vector<int64_t> li = {me * 10 + 1, -(int64_t{1} << 41) * (me + 1)};
    DeviceBytes l(16), f(12), fmax(12);
    l.Upload(li);
    f.Upload(mine);
    for (absl::Status s :
         {c.AllGather(g_send.get(), 12, g_recv.get()),
          c.AllReduce(l.as<int64_t>(), l.as<int64_t>(), 2, ReduceOp::kSum),
          c.AllReduce(f.as<float>(), fmax.as<float>(), 3, ReduceOp::kMax),
          c.AllReduce(f.as<float>(), f.as<float>(), 3, ReduceOp::kSum), c.Barrier()}) {
      if (!s.ok() && status[me].ok()) status[me] = s;
    }
    if (!status[me].ok()) return;
    if (recv.Download<uint8_t>() != expect) problems[me] += "AllToAllV data differs; ";
    std::vector<float> all = g_recv.Download<float>();
    if (all != std::vector<float>({0.5f, -0.0f, 1e3f, 1.5f, -1.0f, 1e3f})) {
      problems[me] += "AllGather differs; ";
    }
    if (l.Download<int64_t>() != std::vector<int64_t>({12, -(int64_t{1} << 41) * 3})) {
      problems[me] += "int64 sum differs; ";
    }
    if (fmax.Download<float>() != std::vector<float>({1.5f, 0.0f, 1e3f})) {
      problems[me] += "float max differs; ";
    }
    if (f.Download<float>() != std::vector<float>({2.0f, -1.0f, 2e3f})) {
      problems[me] += "float sum differs; ";
    }
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(status[r].ok()) << "rank " << r << ": " << status[r];
    EXPECT_EQ(problems[r], "") << "rank " << r;
  }
}

TEST_F(NcclTwoRankTest, APeerThatLeftFailsTheOtherWithinTheTimeout) {
  // Rank 1 aborts; rank 0's barrier cannot complete and must fail, not hang.
  nccl_[1]->Abort(absl::CancelledError("rank 1 leaves"));
  cudaSetDevice(0);
  const absl::Time start = absl::Now();
  // A fresh group with a short deadline for rank 0 would be cleaner; the group's is 20 s.
  absl::Status s = nccl_[0]->Barrier();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.code(), AnyOf(absl::StatusCode::kDeadlineExceeded, absl::StatusCode::kUnavailable,
                              absl::StatusCode::kInternal));
  EXPECT_LT(absl::Now() - start, absl::Seconds(60));
  EXPECT_EQ(nccl_[0]->Barrier(), s);  // sticky
}

}  // namespace
}  // namespace deepinfer::comm
