// LocalCommunicator beyond the shared contract (tests/communicator_conformance_test.cc): worlds far larger
// than a Gloo mesh, and timeout messages that stay readable when many ranks are missing.
#include <chrono>
#include <cstdint>
#include <latch>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/check.h"
#include "sim/communicator_local.h"
#include "tests/test_util.h"

namespace ddpcheck::sim {
namespace {

using core::Code;
using core::DType;
using core::Status;
using std::chrono::milliseconds;
using ::testing::HasSubstr;

TEST(LocalCommunicator, TwoHundredFiftySixRanksAllReduceExactly) {
  const int world = 256;
  auto lw = LocalWorld::Create(world);
  testing::SpawnRanks(world, [&](int rank) {
    LocalCommunicator comm(lw, rank, milliseconds(30000));
    for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{257}, int64_t{1000}}) {
      std::vector<float> f(static_cast<size_t>(n));
      std::vector<int32_t> used(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        f[static_cast<size_t>(i)] = static_cast<float>(rank % 4 + i % 3);  // sum: 256*(i%3) + 64*(0+1+2+3)
        used[static_cast<size_t>(i)] = rank == i % world ? 1 : 0;          // sum: 1 where some rank used i
      }
      ASSERT_TRUE(comm.AllReduceSum(core::Span{f.data(), n, DType::kFloat32}, "grads").ok());
      ASSERT_TRUE(comm.AllReduceSum(core::Span{used.data(), n, DType::kInt32}, "used map").ok());
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        wrong += f[static_cast<size_t>(i)] != static_cast<float>(256 * (i % 3) + 384);
        wrong += used[static_cast<size_t>(i)] != 1;
      }
      EXPECT_EQ(wrong, 0) << "rank " << rank << " n " << n;
    }
  });
}

TEST(LocalCommunicator, ATimeoutWithManyMissingRanksListsThemAsRanges) {
  const int world = 64;
  auto lw = LocalWorld::Create(world);
  std::latch done(world - 10);
  testing::SpawnRanks(world, [&](int rank) {
    LocalCommunicator comm(lw, rank, milliseconds(300));
    ASSERT_TRUE(comm.Barrier("start").ok());
    if (rank >= 10 && rank < 20) {  // skip the broadcast, then arrive after the others gave up
      done.wait();
      Status late = comm.Barrier("late");
      EXPECT_THAT(late.message(), HasSubstr("local world is unusable after an earlier failure"));
      return;
    }
    std::vector<double> buf(4, rank);
    Status s = comm.Broadcast(core::Span{buf.data(), 4, DType::kFloat64}, 0, "buffers (step 0)");
    done.count_down();
    EXPECT_EQ(s.code(), Code::kTimeout);
    EXPECT_THAT(s.message(), HasSubstr("ranks 10-19 never arrived (last entered: #1 barrier 'start')"));
    EXPECT_THAT(s.message(), HasSubstr("entered #2 broadcast 'buffers (step 0)'"));
  });
}

TEST(LocalCommunicator, RefusesARankOutsideItsWorld) {
  auto lw = LocalWorld::Create(2);
  EXPECT_THROW(LocalCommunicator(lw, 2), core::CheckError);
}

}  // namespace
}  // namespace ddpcheck::sim
