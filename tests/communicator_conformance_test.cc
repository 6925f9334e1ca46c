// The Communicator contract, checked the nccl-tests way on both sim backends (Gloo over TCP, and the
// in-memory LocalCommunicator): integer-valued inputs whose sum has a closed form, every size that is a
// boundary for a ring of W ranks, every dtype DDP reduces, in place; then the failure contract (a rank that
// skips a collective is named in a Timeout, ranks that disagree are named in a Mismatch).
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <latch>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/communicator.h"
#include "sim/communicator_gloo.h"
#include "sim/communicator_local.h"
#include "sim/store.h"
#include "tests/test_util.h"

namespace ddpcheck::sim {
namespace {

using core::Code;
using core::DType;
using core::Status;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

// kGloo: GlooCommunicator as `run` uses it (small all-reduces as one direct round); kGlooRing: every
// all-reduce through gloo::allreduce.
enum class Backend { kGloo, kGlooRing, kLocal };

std::string BackendName(const ::testing::TestParamInfo<Backend>& info) {
  switch (info.param) {
    case Backend::kGloo: return "Gloo";
    case Backend::kGlooRing: return "GlooRing";
    default: return "Local";
  }
}

// Runs fn(comm) on `world` rank threads, each with its own fresh communicator of `backend`.
void WithWorld(Backend backend, int world, milliseconds timeout, const std::function<void(core::Communicator&)>& fn) {
  static std::atomic<int> runs{0};
  const std::string run_id = "conformance-" + std::to_string(runs++);
  auto store = std::make_shared<MemoryStore>();
  auto local = LocalWorld::Create(world);
  testing::SpawnRanks(world, [&](int rank) {
    std::unique_ptr<core::Communicator> comm;
    if (backend != Backend::kLocal) {
      std::unique_ptr<GlooCommunicator> gloo;
      Status s = GlooCommunicator::Create(store, run_id, rank, world, timeout, &gloo);
      if (!s.ok()) throw std::runtime_error("rank " + std::to_string(rank) + ": " + s.ToString());
      if (backend == Backend::kGlooRing) gloo->SetDirectAllReduceBytes(0);
      comm = std::move(gloo);
    } else {
      comm = std::make_unique<LocalCommunicator>(local, rank, timeout);
    }
    fn(*comm);
  });
}

// Sizes that are boundaries for a ring of W ranks: 0 (no data), 1, 2 (fewer elements than segments),
// W-1, W, W+1 (around one element per rank), 1000 (not a multiple of 2W for W = 3), 2^16+3 (many
// elements, not a multiple of anything).
std::vector<int64_t> BoundarySizes(int world) {
  return {0, 1, 2, world - 1, world, world + 1, 1000, (1 << 16) + 3};
}

// Rank r's input: a(i) + r*b(i), so the sum over W ranks is W*a(i) + b(i)*W(W-1)/2, at most 120 in
// magnitude for W <= 8: exact in every dtype and every summation order.
int64_t A(int64_t i) { return i % 17 - 8; }
int64_t B(int64_t i) { return i % 5 - 2; }

template <typename T>
void CheckAllReduce(core::Communicator& comm, int64_t n) {
  const int64_t w = comm.world();
  std::vector<T> buf(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = static_cast<T>(A(i) + comm.rank() * B(i));
  Status s = comm.AllReduceSum(core::Span{buf.data(), n, core::DTypeOf<T>()}, "sum " + std::to_string(n));
  ASSERT_TRUE(s.ok()) << s.ToString();
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (buf[static_cast<size_t>(i)] != static_cast<T>(w * A(i) + B(i) * w * (w - 1) / 2)) ++wrong;
  }
  EXPECT_EQ(wrong, 0) << "rank " << comm.rank() << " of " << w << ", " << n << " " << core::DTypeName(core::DTypeOf<T>());
}

class CommunicatorContract : public ::testing::TestWithParam<Backend> {};

TEST_P(CommunicatorContract, AllReduceSumIsExactForEveryBoundarySizeAndDtype) {
  for (int world : {1, 2, 3, 4, 8}) {
    WithWorld(GetParam(), world, milliseconds(10000), [&](core::Communicator& comm) {
      for (int64_t n : BoundarySizes(world)) {
        CheckAllReduce<float>(comm, n);
        CheckAllReduce<double>(comm, n);
        CheckAllReduce<int32_t>(comm, n);
        CheckAllReduce<int64_t>(comm, n);
      }
    });
  }
}

TEST_P(CommunicatorContract, BroadcastDeliversTheRootsBufferFromEveryRoot) {
  for (int world : {1, 2, 3, 4, 8}) {
    WithWorld(GetParam(), world, milliseconds(10000), [&](core::Communicator& comm) {
      for (int root = 0; root < world; ++root) {
        for (int64_t n : {int64_t{1}, int64_t{world + 1}, int64_t{1000}}) {
          std::vector<double> buf(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) buf[static_cast<size_t>(i)] = 1000.0 * comm.rank() + static_cast<double>(i);
          Status s = comm.Broadcast(core::Span{buf.data(), n, DType::kFloat64}, root, "params");
          ASSERT_TRUE(s.ok()) << s.ToString();
          int64_t wrong = 0;
          for (int64_t i = 0; i < n; ++i) wrong += buf[static_cast<size_t>(i)] != 1000.0 * root + static_cast<double>(i);
          EXPECT_EQ(wrong, 0) << "rank " << comm.rank() << " root " << root << " n " << n;
        }
      }
    });
  }
}

TEST_P(CommunicatorContract, AllGatherPlacesRankRsInputAtOffsetR) {
  for (int world : {1, 2, 3, 4, 8}) {
    WithWorld(GetParam(), world, milliseconds(10000), [&](core::Communicator& comm) {
      for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1000}}) {
        std::vector<int64_t> in(static_cast<size_t>(n));
        std::vector<int64_t> out(static_cast<size_t>(n * world), -1);
        for (int64_t i = 0; i < n; ++i) in[static_cast<size_t>(i)] = 100000 * comm.rank() + i;
        Status s = comm.AllGather(core::ConstSpan(in.data(), n, DType::kInt64),
                                  core::Span{out.data(), n * world, DType::kInt64}, "used map");
        ASSERT_TRUE(s.ok()) << s.ToString();
        int64_t wrong = 0;
        for (int64_t j = 0; j < n * world; ++j) wrong += out[static_cast<size_t>(j)] != 100000 * (j / n) + j % n;
        EXPECT_EQ(wrong, 0) << "rank " << comm.rank() << " n " << n;
      }
    });
  }
}

TEST_P(CommunicatorContract, BarrierReturnsOnlyAfterEveryRankArrived) {
  const int world = 4;
  std::atomic<int> arrived{0};
  WithWorld(GetParam(), world, milliseconds(10000), [&](core::Communicator& comm) {
    if (comm.rank() == world - 1) std::this_thread::sleep_for(milliseconds(100));
    arrived++;
    Status s = comm.Barrier("epoch end");
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(arrived.load(), world) << "rank " << comm.rank();
  });
}

TEST_P(CommunicatorContract, ARankThatSkipsACollectiveIsNamedInTheOthersTimeout) {
  const int world = 3;
  const milliseconds timeout(500);
  std::latch others_done(world - 1);
  WithWorld(GetParam(), world, timeout, [&](core::Communicator& comm) {
    std::vector<float> buf(100, 1.0f);
    core::Span span{buf.data(), 100, DType::kFloat32};
    ASSERT_TRUE(comm.AllReduceSum(span, "bucket 0 (step 0)").ok());
    if (comm.rank() == 2) {  // skips step 1's allreduce, stays alive until the others have given up
      others_done.wait();
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    Status s = comm.AllReduceSum(span, "bucket 0 (step 1)");
    const auto took = std::chrono::steady_clock::now() - start;
    others_done.count_down();
    EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("collective #2 allreduce 'bucket 0 (step 1)'"));
    EXPECT_THAT(s.message(), HasSubstr("on rank " + std::to_string(comm.rank())));
    EXPECT_THAT(s.message(), HasSubstr("rank 2 never arrived (last entered: #1 allreduce 'bucket 0 (step 0)')"));
    EXPECT_LT(took, timeout + milliseconds(2500));
    Status again = comm.Barrier("after the timeout");
    EXPECT_FALSE(again.ok());
    EXPECT_THAT(again.message(), HasSubstr("unusable after an earlier failure"));
  });
}

TEST_P(CommunicatorContract, ARankReducingADifferentSizeIsNamedInAMismatchOnEveryRank) {
  const int world = 3;
  WithWorld(GetParam(), world, milliseconds(10000), [&](core::Communicator& comm) {
    const int64_t n = comm.rank() == 1 ? 1000 : 1024;
    std::vector<float> buf(1024, 1.0f);
    Status s = comm.AllReduceSum(core::Span{buf.data(), n, DType::kFloat32}, "bucket 0");
    EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("rank 1 entered allreduce of 1000 float32 (#1) while ranks 0, 2 entered "
                                       "allreduce of 1024 float32 (#1)"));
    EXPECT_EQ(buf[0], 1.0f) << "no data moves on a mismatch";
    // Every rank saw the mismatch and skipped the data, so the world is still in step.
    Status next = comm.AllReduceSum(core::Span{buf.data(), 1024, DType::kFloat32}, "bucket 0 again");
    ASSERT_TRUE(next.ok()) << next.ToString();
    EXPECT_EQ(buf[0], 3.0f);
  });
}

TEST_P(CommunicatorContract, ARankSkippingToTheNextCollectiveIsAMismatchNamingBoth) {
  const int world = 2;
  WithWorld(GetParam(), world, milliseconds(10000), [&](core::Communicator& comm) {
    std::vector<double> buf(8, 1.0);
    core::Span span{buf.data(), 8, DType::kFloat64};
    Status s = comm.rank() == 0 ? comm.AllReduceSum(span, "bucket 0") : comm.Broadcast(span, 0, "buffers");
    EXPECT_EQ(s.code(), Code::kMismatch) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("rank 1 entered broadcast of 8 float64 from rank 0 (#1) while rank 0 "
                                       "entered allreduce of 8 float64 (#1)"));
  });
}

INSTANTIATE_TEST_SUITE_P(Sim, CommunicatorContract, ::testing::Values(Backend::kGloo, Backend::kGlooRing, Backend::kLocal), BackendName);

}  // namespace
}  // namespace ddpcheck::sim
