// NcclCommunicator with one rank per GPU (W = the device count; skipped below 2 GPUs), in the style of
// nccl-tests and Gloo's tests: integer-valued data so the reduced result has a closed form and must be exact
// in any summation order; sizes at the boundaries; a missing rank is a Timeout that names it, never a hang.
#include <memory>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/check.h"
#include "real/communicator_nccl.h"
#include "real/cuda_check.h"
#include "real/device.h"
#include "real/device_context.h"
#include "real/kv_store.h"

namespace ddpcheck::real {
namespace {

// Runs fn(rank, ctx, comm) on W threads, one GPU each; returns each rank's failure text ("" when none).
std::vector<std::string> OnEveryGpu(const std::string& run_id, std::chrono::milliseconds timeout,
                                    const std::function<void(int, DeviceContext*, NcclCommunicator*)>& fn) {
  const int world = DeviceCount();
  auto store = std::make_shared<MemoryKvStore>();
  std::vector<std::string> errors(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        std::unique_ptr<DeviceContext> ctx;
        core::Status st = DeviceContext::Create(r, &ctx);
        std::unique_ptr<NcclCommunicator> comm;
        if (st.ok()) st = NcclCommunicator::Create(store, run_id, r, world, ctx.get(), timeout, &comm);
        if (!st.ok()) throw std::runtime_error(st.ToString());
        fn(r, ctx.get(), comm.get());
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

std::vector<float> Download(DeviceContext* ctx, const float* p, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  ctx->TouchAll();
  ctx->HostWait(ctx->compute());
  ctx->HostWait(ctx->comm());
  if (n) DDPCHECK_CUDA(cudaMemcpy(out.data(), p, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost));
  return out;
}

class NcclMultiGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    if (DeviceCount() < 2) GTEST_SKIP() << "needs 2 or more GPUs, have " << DeviceCount();
  }
};

TEST_F(NcclMultiGpu, AllReduceSumIsExactOnIntegerValuedDataAtBoundarySizes) {
  // 0 and 1: degenerate; 1023/1025: not a multiple of any chunking; 1 << 22: several NCCL chunks per rank.
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{1023}, int64_t{1025}, int64_t{1} << 22}) {
    const int world = DeviceCount();
    int64_t wrong_total = 0;
    std::mutex mu;
    auto errors = OnEveryGpu("allreduce-" + std::to_string(n), std::chrono::seconds(60),
                             [&](int r, DeviceContext* ctx, NcclCommunicator* comm) {
      std::vector<float> host(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) host[static_cast<size_t>(i)] = static_cast<float>((i * 7 + r * 13) % 101);
      float* dev = nullptr;
      DDPCHECK_CUDA(cudaMalloc(&dev, std::max<size_t>(1, static_cast<size_t>(n) * sizeof(float))));
      if (n) DDPCHECK_CUDA(cudaMemcpy(dev, host.data(), static_cast<size_t>(n) * sizeof(float), cudaMemcpyHostToDevice));
      core::Status st = comm->AllReduceSum({dev, n, core::DType::kFloat32}, "allreduce test");
      if (!st.ok()) throw std::runtime_error(st.ToString());
      const std::vector<float> got = Download(ctx, dev, n);
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        int64_t want = 0;
        for (int q = 0; q < world; ++q) want += (i * 7 + q * 13) % 101;
        if (got[static_cast<size_t>(i)] != static_cast<float>(want)) ++wrong;
      }
      cudaFree(dev);
      std::lock_guard<std::mutex> lock(mu);
      wrong_total += wrong;
    });
    for (const auto& e : errors) EXPECT_EQ(e, "") << "n = " << n;
    EXPECT_EQ(wrong_total, 0) << "wrong elements summed over all ranks, n = " << n;
  }
}

TEST_F(NcclMultiGpu, BroadcastAndAllGatherDeliverRootAndRankValues) {
  const int world = DeviceCount();
  auto errors = OnEveryGpu("bcast-gather", std::chrono::seconds(60), [&](int r, DeviceContext* ctx, NcclCommunicator* comm) {
    float* buf = nullptr;
    float* all = nullptr;
    DDPCHECK_CUDA(cudaMalloc(&buf, 4 * sizeof(float)));
    DDPCHECK_CUDA(cudaMalloc(&all, static_cast<size_t>(world) * 4 * sizeof(float)));
    std::vector<float> mine = {float(r), float(r + 1), float(r + 2), float(r + 3)};
    DDPCHECK_CUDA(cudaMemcpy(buf, mine.data(), 4 * sizeof(float), cudaMemcpyHostToDevice));
    core::Status st = comm->AllGather(core::ConstSpan(buf, 4, core::DType::kFloat32),
                                      {all, world * 4, core::DType::kFloat32}, "allgather test");
    if (!st.ok()) throw std::runtime_error(st.ToString());
    const std::vector<float> gathered = Download(ctx, all, world * 4);
    for (int q = 0; q < world; ++q) {
      for (int k = 0; k < 4; ++k) {
        if (gathered[static_cast<size_t>(q * 4 + k)] != float(q + k)) throw std::runtime_error("allgather: wrong value");
      }
    }
    st = comm->Broadcast({buf, 4, core::DType::kFloat32}, world - 1, "broadcast test");
    if (!st.ok()) throw std::runtime_error(st.ToString());
    const std::vector<float> b = Download(ctx, buf, 4);
    if (b[0] != float(world - 1)) throw std::runtime_error("broadcast: got " + std::to_string(b[0]));
    cudaFree(buf);
    cudaFree(all);
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
}

TEST_F(NcclMultiGpu, ARankThatSkipsACollectiveIsNamedInATimeoutNotAHang) {
  const int world = DeviceCount();
  std::vector<std::string> statuses(static_cast<size_t>(world));
  auto errors = OnEveryGpu("timeout", std::chrono::milliseconds(2000), [&](int r, DeviceContext*, NcclCommunicator* comm) {
    core::Status st = comm->Barrier("barrier 1");
    if (r != world - 1) st = comm->Barrier("barrier 2");  // the last rank never enters it
    statuses[static_cast<size_t>(r)] = st.ToString();
  });
  for (const auto& e : errors) EXPECT_EQ(e, "");
  EXPECT_NE(statuses[0].find("timeout"), std::string::npos) << statuses[0];
  EXPECT_NE(statuses[0].find("rank " + std::to_string(world - 1) + " (last entered #1 'barrier 1')"),
            std::string::npos)
      << statuses[0];
}

TEST(NcclOneGpu, WorldOfOneReducesToItself) {
  auto store = std::make_shared<MemoryKvStore>();
  std::unique_ptr<DeviceContext> ctx;
  ASSERT_TRUE(DeviceContext::Create(0, &ctx).ok());
  std::unique_ptr<NcclCommunicator> comm;
  ASSERT_TRUE(NcclCommunicator::Create(store, "one", 0, 1, ctx.get(), std::chrono::seconds(30), &comm).ok());
  int64_t* dev = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, 3 * sizeof(int64_t)), cudaSuccess);
  const int64_t host[3] = {5, -7, int64_t{1} << 40};
  ASSERT_EQ(cudaMemcpy(dev, host, sizeof(host), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_TRUE(comm->AllReduceSum({dev, 3, core::DType::kInt64}, "one").ok());
  ASSERT_TRUE(comm->Synchronize().ok());
  int64_t back[3] = {0, 0, 0};
  ASSERT_EQ(cudaMemcpy(back, dev, sizeof(back), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(back[0], 5);
  EXPECT_EQ(back[1], -7);
  EXPECT_EQ(back[2], int64_t{1} << 40);
  cudaFree(dev);
}

}  // namespace
}  // namespace ddpcheck::real
