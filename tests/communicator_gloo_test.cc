// GlooCommunicator beyond the shared contract (tests/communicator_conformance_test.cc): rendezvous through
// each kind of store, run-id namespaces, a rank that never joins or leaves early, large worlds, and the
// cost of the flight recorder and fingerprints.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <latch>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/hash_store.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/communicator_gloo.h"
#include "sim/store.h"
#include "tests/test_util.h"

namespace ddpcheck::sim {
namespace {

using core::Code;
using core::DType;
using core::Status;
using std::chrono::milliseconds;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

std::unique_ptr<GlooCommunicator> MustCreate(std::shared_ptr<gloo::rendezvous::Store> store, const std::string& run,
                                             int rank, int world, milliseconds timeout = milliseconds(20000)) {
  std::unique_ptr<GlooCommunicator> comm;
  Status s = GlooCommunicator::Create(std::move(store), run, rank, world, timeout, &comm);
  if (!s.ok()) throw std::runtime_error("rank " + std::to_string(rank) + ": " + s.ToString());
  return comm;
}

// Every rank contributes `value`; returns the reduced first element (all elements must agree).
float AllReduceConstant(GlooCommunicator& comm, float value, int64_t n, const std::string& what) {
  std::vector<float> buf(static_cast<size_t>(n), value);
  Status s = comm.AllReduceSum(core::Span{buf.data(), n, DType::kFloat32}, what);
  if (!s.ok()) throw std::runtime_error(s.ToString());
  for (float v : buf) {
    if (v != buf[0]) throw std::runtime_error("elements disagree after " + what);
  }
  return buf[0];
}

TEST(GlooRendezvous, TimesOutNamingARankThatNeverJoins) {
  auto store = std::make_shared<MemoryStore>();
  const milliseconds timeout(500);
  testing::SpawnRanks(2, [&](int rank) {  // rank 2 of 3 never calls Create
    std::unique_ptr<GlooCommunicator> comm;
    const auto start = Clock::now();
    Status s = GlooCommunicator::Create(store, "run", rank, 3, timeout, &comm);
    EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("rendezvous of run 'run' on rank " + std::to_string(rank) + " of 3 timed out "
                                       "after 500 ms: rank 2 never joined (2 of 3 joined)"));
    EXPECT_LT(MsSince(start), 500 + 2500);
    EXPECT_EQ(comm, nullptr);
  });
}

TEST(GlooRendezvous, RanksAsThreadsMeetThroughAFileStoreAndNameASkippingRank) {
  testing::TempDir dir;
  const int world = 3;
  std::latch others_done(world - 1);
  testing::SpawnRanks(world, [&](int rank) {
    // One FileStore per rank, as separate processes would have.
    auto comm = MustCreate(std::make_shared<gloo::rendezvous::FileStore>(dir.path()), "fs", rank, world,
                           milliseconds(1000));
    EXPECT_EQ(AllReduceConstant(*comm, static_cast<float>(rank + 1), 1000, "bucket 0 (step 0)"), 6.0f);
    if (rank == 2) {
      others_done.wait();
      return;
    }
    std::vector<float> buf(10, 1.0f);
    Status s = comm->AllReduceSum(core::Span{buf.data(), 10, DType::kFloat32}, "bucket 0 (step 1)");
    others_done.count_down();
    EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("rank 2 never arrived (last entered: #1 allreduce 'bucket 0 (step 0)')"));
  });
}

TEST(GlooRendezvous, TwoRunsWithDifferentIdsOnOneHashStoreDoNotMix) {
  auto store = std::make_shared<gloo::rendezvous::HashStore>();
  testing::SpawnRanks(5, [&](int thread) {  // threads 0-1: run "a" (W=2); threads 2-4: run "b" (W=3)
    const bool in_a = thread < 2;
    auto comm = in_a ? MustCreate(store, "a", thread, 2) : MustCreate(store, "b", thread - 2, 3);
    for (int step = 0; step < 3; ++step) {
      const std::string what = "step " + std::to_string(step);
      EXPECT_EQ(AllReduceConstant(*comm, in_a ? 1.0f : 10.0f, 100, what), in_a ? 2.0f : 30.0f) << what;
    }
  });
}

TEST(GlooRendezvous, ReusingARunIdOnAStoreIsRejected) {
  auto store = std::make_shared<MemoryStore>();
  auto first = MustCreate(store, "once", 0, 1);
  std::unique_ptr<GlooCommunicator> second;
  Status s = GlooCommunicator::Create(store, "once", 0, 1, milliseconds(500), &second);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.ToString();
  EXPECT_THAT(s.message(), HasSubstr("use a fresh run id"));
}

TEST(GlooCommunicator, ARankThatLeavesIsNamedInsteadOfAHang) {
  auto store = std::make_shared<MemoryStore>();
  const int world = 3;
  testing::SpawnRanks(world, [&](int rank) {
    auto comm = MustCreate(store, "leave", rank, world, milliseconds(1000));
    EXPECT_EQ(AllReduceConstant(*comm, 1.0f, 10, "step 0"), 3.0f);
    if (rank == 1) return;  // destroys its communicator: its connections close
    const auto start = Clock::now();
    std::vector<float> buf(10, 1.0f);
    Status s = comm->AllReduceSum(core::Span{buf.data(), 10, DType::kFloat32}, "step 1");
    EXPECT_EQ(s.code(), Code::kTimeout) << s.ToString();
    EXPECT_THAT(s.message(), HasSubstr("rank 1 never arrived (last entered: #1 allreduce 'step 0')"));
    EXPECT_LT(MsSince(start), 1000 + 2500);
  });
}

TEST(GlooCommunicator, SixtyFourRanksConnectAndAllReduceWithinAMinute) {
  const int world = 64;
  auto store = std::make_shared<MemoryStore>();
  std::atomic<int64_t> connect_ms_max{0};
  const auto start = Clock::now();
  testing::SpawnRanks(world, [&](int rank) {
    auto comm = MustCreate(store, "w64", rank, world, milliseconds(60000));
    int64_t ms = static_cast<int64_t>(MsSince(start));
    for (int64_t prev = connect_ms_max.load(); ms > prev && !connect_ms_max.compare_exchange_weak(prev, ms);) {}
    EXPECT_EQ(AllReduceConstant(*comm, 1.0f, 1000, "bucket 0"), 64.0f);
  });
  const double total = MsSince(start);
  std::printf("[ measure ] W=64: every rank connected after %lld ms; connect + one allreduce of 1000 float32: %.0f ms\n",
              static_cast<long long>(connect_ms_max.load()), total);
  EXPECT_LT(total, 60000.0);
}

// Prints the latency of a small allreduce with and without the flight recorder and fingerprints.
TEST(GlooCommunicator, FlightRecorderAndFingerprintsKeepSmallAllReducesCorrect) {
  const int world = 4;
  const int iters = 100;
  auto store = std::make_shared<MemoryStore>();
  std::mutex mu;
  std::vector<std::string> lines;
  testing::SpawnRanks(world, [&](int rank) {
    auto comm = MustCreate(store, "cost", rank, world);
    for (int mode = 0; mode < 4; ++mode) {
      const bool record = mode & 1, verify = mode & 2;
      comm->SetFlightRecorder(record);
      comm->SetVerifyFingerprints(verify);
      AllReduceConstant(*comm, 1.0f, 256, "warm-up");
      const auto start = Clock::now();
      for (int i = 0; i < iters; ++i) ASSERT_EQ(AllReduceConstant(*comm, 1.0f, 256, "bucket"), 4.0f);
      const double us = MsSince(start) * 1000.0 / iters;
      if (rank == 0) {
        std::lock_guard<std::mutex> lock(mu);
        char line[160];
        std::snprintf(line, sizeof line, "[ measure ] W=4 allreduce of 256 float32: recorder %-3s fingerprints %-3s %7.1f us",
                      record ? "on" : "off", verify ? "on" : "off", us);
        lines.push_back(line);
      }
    }
  });
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  EXPECT_EQ(lines.size(), 4u);
}

}  // namespace
}  // namespace ddpcheck::sim
