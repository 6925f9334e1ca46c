// GlooRingSum, the in-memory model of Gloo's ring allreduce order: hand-derived cases first, then bitwise
// agreement with the installed libgloo, including inputs large enough that Gloo caps its segment size.
#include <cmath>
#include <cstring>
#include <latch>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/gloo_ring.h"
#include "sim/communicator_gloo.h"
#include "sim/store.h"
#include "tests/test_util.h"

namespace ddpcheck::sim {
namespace {

using core::DType;
using core::GlooRingChunkElements;
using core::GlooRingSum;

TEST(GlooRingChunkElements, IsTwoSegmentsOfCeilLOverTwoWWhileSegmentsAreUnderOneMiB) {
  EXPECT_EQ(GlooRingChunkElements(1, 4, 3), 2);        // 2 * ceil(1 / 6)
  EXPECT_EQ(GlooRingChunkElements(1000, 4, 3), 334);   // 2 * ceil(1000 / 6) = 2 * 167
  EXPECT_EQ(GlooRingChunkElements(1000, 8, 8), 126);   // 2 * ceil(1000 / 16) = 2 * 63
  EXPECT_EQ(GlooRingChunkElements(7, 4, 8), 2);        // L < W: 2 * ceil(7 / 16)
}

TEST(GlooRingChunkElements, UsesMoreSegmentsPerRankOnceASegmentWouldExceedOneMiB) {
  // 2,000,003 float32 = 8,000,012 bytes > 6 MiB: ceil(8,000,012 / 1 MiB) = 8 segments, rounded up to 9 (a
  // multiple of W = 3); 3 segments per rank of ceil(2,000,003 / 9) = 222,223 elements.
  EXPECT_EQ(GlooRingChunkElements(2000003, 4, 3), 3 * 222223);
  // The golden README's 2 * ceil(L / (2W)) would give 666,668 here.
  EXPECT_NE(GlooRingChunkElements(2000003, 4, 3), 2 * ((2000003 + 5) / 6));
}

// Element i of chunk c is summed as x[c-1] + x[c-2] first. Put +big and -big exactly there and 1 on every
// other rank: the ring order gives W-2 exactly; an order that adds 1s to +-big before they cancel loses them.
template <typename T>
void CheckRingOrder(int world, int64_t n, T big) {
  const int64_t chunk = 2 * ((n + 2 * world - 1) / (2 * world));  // golden README section 6, small inputs
  std::vector<std::vector<T>> x(static_cast<size_t>(world), std::vector<T>(static_cast<size_t>(n), T(1)));
  for (int64_t i = 0; i < n; ++i) {
    const int c = static_cast<int>(i / chunk);
    x[static_cast<size_t>((c - 1 + world) % world)][static_cast<size_t>(i)] = big;
    x[static_cast<size_t>((c - 2 + 2 * world) % world)][static_cast<size_t>(i)] = -big;
  }
  std::vector<const void*> inputs;
  for (const auto& v : x) inputs.push_back(v.data());
  std::vector<T> out(static_cast<size_t>(n));
  ASSERT_TRUE(GlooRingSum(inputs, n, core::DTypeOf<T>(), out.data()));
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[static_cast<size_t>(i)], T(world - 2)) << "W=" << world << " n=" << n << " i=" << i;
}

TEST(GlooRingSum, SumsEachElementAlongTheRingEndingAtItsChunksOwner) {
  for (int world = 2; world <= 8; ++world) {
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{world - 1}, int64_t{world}, int64_t{world + 1}, int64_t{1000},
                      int64_t{1001}}) {
      if (n < 1) continue;
      // 2^25 (2^54): adding any small integer (up to 6) to +big or -big first rounds it away.
      CheckRingOrder<float>(world, n, 33554432.0f);
      CheckRingOrder<double>(world, n, 18014398509481984.0);
    }
  }
}

TEST(GlooRingSum, WritesInPlaceOverOneOfItsInputs) {
  std::vector<float> a{1, 2, 3}, b{10, 20, 30};
  ASSERT_TRUE(GlooRingSum({a.data(), b.data()}, 3, DType::kFloat32, a.data()));
  EXPECT_EQ(a, (std::vector<float>{11, 22, 33}));
  EXPECT_FALSE(GlooRingSum({a.data()}, 3, DType::kFloat16, a.data()));
}

// Values spread over 2^-30 .. 2^30 with random signs, so almost every summation order rounds differently.
template <typename T>
std::vector<T> MixedMagnitudes(std::mt19937_64& rng, int64_t n) {
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-30, 30);
  std::vector<T> v(static_cast<size_t>(n));
  for (auto& e : v) e = static_cast<T>(std::ldexp(mantissa(rng), exponent(rng)));
  return v;
}

// Every rank's all-reduced copy (out[r]) holds GlooRingSum of the ranks' inputs, bit for bit.
template <typename T>
void ExpectRingSums(const std::vector<std::vector<T>>& inputs, const std::vector<std::vector<T>>& out,
                    const std::string& what) {
  const auto n = static_cast<int64_t>(inputs.front().size());
  std::vector<const void*> in;
  for (const auto& v : inputs) in.push_back(v.data());
  std::vector<T> model(static_cast<size_t>(n));
  ASSERT_TRUE(GlooRingSum(in, n, core::DTypeOf<T>(), model.data()));
  for (size_t r = 0; r < out.size(); ++r) {
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      differ += std::memcmp(&model[static_cast<size_t>(i)], &out[r][static_cast<size_t>(i)], sizeof(T)) != 0;
    }
    EXPECT_EQ(differ, 0) << what << " rank " << r;
  }
}

// direct = false: every all-reduce runs gloo::allreduce (the library's own ring), so this checks the model
// against the library; direct = true: small ones run GlooCommunicator's one-round direct exchange.
// transport: Gloo's TCP pairs, or the in-process ones of the threads world (sim/gloo_inproc.h).
template <typename T>
void CheckAgainstGloo(int world, const std::vector<int64_t>& sizes, bool direct = false,
                      GlooTransport transport = GlooTransport::kTcp) {
  auto store = std::make_shared<MemoryStore>();
  std::vector<std::vector<std::vector<T>>> gloo_out(sizes.size());
  std::vector<std::vector<std::vector<T>>> inputs(sizes.size());
  std::mt19937_64 rng(testing::TestSeed() + static_cast<unsigned>(world));
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (int r = 0; r < world; ++r) inputs[k].push_back(MixedMagnitudes<T>(rng, sizes[k]));
    gloo_out[k] = inputs[k];
  }
  // A rank closes its communicator only once every rank is done: gloo resets a pair's connection on close, which
  // would discard what a slower rank has not yet read of the last all-reduce (as sim::RunSim keeps them).
  std::latch finished(world);
  testing::SpawnRanks(world, [&](int rank) {
    std::unique_ptr<GlooCommunicator> comm;
    core::Status s =
        GlooCommunicator::Create(store, "ring", rank, world, std::chrono::milliseconds(30000), &comm, "", transport);
    if (s.ok() && !direct) comm->SetDirectAllReduceBytes(0);
    for (size_t k = 0; k < sizes.size() && s.ok(); ++k) {
      auto& buf = gloo_out[k][static_cast<size_t>(rank)];
      s = comm->AllReduceSum(core::Span{buf.data(), sizes[k], core::DTypeOf<T>()}, "probe");
    }
    if (!s.ok()) {
      finished.count_down();
      throw std::runtime_error(s.ToString());
    }
    finished.arrive_and_wait();
  });
  for (size_t k = 0; k < sizes.size(); ++k) {
    ExpectRingSums(inputs[k], gloo_out[k], "W=" + std::to_string(world) + " n=" + std::to_string(sizes[k]) +
                                               " sizeof " + std::to_string(sizeof(T)) +
                                               (direct ? " (direct)" : " (gloo::allreduce)") +
                                               (transport == GlooTransport::kTcp ? " tcp" : " in-process"));
  }
}

TEST(GlooRingSum, MatchesTheInstalledGlooBitwiseOnMixedMagnitudes) {
  for (GlooTransport transport : {GlooTransport::kTcp, GlooTransport::kInProcess}) {
    for (int world = 2; world <= 8; ++world) {
      std::vector<int64_t> sizes{1, 2, 3, world - 1, world + 1, 1000, 1001, 4097, (1 << 16) + 3};
      std::erase(sizes, 0);
      CheckAgainstGloo<float>(world, sizes, false, transport);
      CheckAgainstGloo<double>(world, sizes, false, transport);
    }
  }
}

// The one-round direct all-reduce gives the ring's bits too, below and above its size cap (65,524 float32 at
// W = 4, 32,756 at W = 8, so 2^16 + 3 elements always take gloo::allreduce).
TEST(GlooCommunicator, DirectAllReduceIsBitwiseGloosRing) {
  for (int world = 2; world <= 8; ++world) {
    std::vector<int64_t> sizes{1, 2, world - 1, world + 1, 1000, 4097, 32768, (1 << 16) + 3};
    std::erase(sizes, 0);
    CheckAgainstGloo<float>(world, sizes, /*direct=*/true);
    CheckAgainstGloo<double>(world, sizes, /*direct=*/true, GlooTransport::kInProcess);
  }
}

TEST(GlooRingSum, MatchesTheInstalledGlooBitwiseWhenSegmentsAreCappedAtOneMiB) {
  for (GlooTransport transport : {GlooTransport::kTcp, GlooTransport::kInProcess}) {
    CheckAgainstGloo<float>(3, {2000003}, false, transport);   // 9 segments of 222,223 elements
    CheckAgainstGloo<double>(2, {1000003}, false, transport);  // 8,000,024 bytes: 8 segments
    CheckAgainstGloo<float>(4, {6653856}, false, transport);   // the 10M MLP's second bucket: 28 segments
  }
}


// Started all-reduces (DDP's large buckets) run on the rank's collective thread while the rank goes on; a
// broadcast issued meanwhile waits for them, so every rank's collectives keep one order, and the sums have
// the ring's bits.
TEST(GlooCommunicator, StartedAllReducesKeepTheirOrderAndTheRingsBits) {
  constexpr int kWorld = 3;
  const std::vector<int64_t> sizes{300001, 70001, 1000};  // the last one small enough for the direct exchange
  auto store = std::make_shared<MemoryStore>();
  std::mt19937_64 rng(testing::TestSeed());
  std::vector<std::vector<std::vector<float>>> inputs(sizes.size()), out(sizes.size());
  for (size_t k = 0; k < sizes.size(); ++k) {
    for (int r = 0; r < kWorld; ++r) inputs[k].push_back(MixedMagnitudes<float>(rng, sizes[k]));
    out[k] = inputs[k];
  }
  std::vector<std::vector<double>> broadcast(kWorld, std::vector<double>(5));
  std::latch finished(kWorld);
  testing::SpawnRanks(kWorld, [&](int rank) {
    std::unique_ptr<GlooCommunicator> comm;
    core::Status s = GlooCommunicator::Create(store, "started", rank, kWorld, std::chrono::milliseconds(30000), &comm);
    for (size_t k = 0; k < sizes.size() && s.ok(); ++k) {
      auto& buf = out[k][static_cast<size_t>(rank)];
      s = comm->StartAllReduceSum(core::Span{buf.data(), sizes[k], DType::kFloat32}, "bucket " + std::to_string(k));
    }
    auto& b = broadcast[static_cast<size_t>(rank)];
    if (rank == 1) b.assign(b.size(), 7.5);
    if (s.ok()) s = comm->Broadcast(core::Span{b.data(), 5, DType::kFloat64}, 1, "after the buckets");
    if (s.ok()) s = comm->WaitPending();
    if (!s.ok()) {
      finished.count_down();
      throw std::runtime_error(s.ToString());
    }
    finished.arrive_and_wait();
  });
  for (size_t k = 0; k < sizes.size(); ++k) ExpectRingSums(inputs[k], out[k], "size " + std::to_string(sizes[k]));
  for (const auto& b : broadcast) EXPECT_EQ(b, std::vector<double>(5, 7.5));
}

// Ranks that start different all-reduces learn it from WaitPending (the fingerprints differ), once; the ones
// started after it are not run.
TEST(GlooCommunicator, AStartedAllReduceThatDiffersIsAMismatchFromWaitPending) {
  constexpr int kWorld = 2;
  auto store = std::make_shared<MemoryStore>();
  std::vector<core::Status> first(kWorld), second(kWorld);
  std::vector<std::vector<float>> a(kWorld, std::vector<float>(200000, 1.0f)), c(kWorld, std::vector<float>(200000, 2.0f));
  std::latch finished(kWorld);
  testing::SpawnRanks(kWorld, [&](int rank) {
    std::unique_ptr<GlooCommunicator> comm;
    core::Status s = GlooCommunicator::Create(store, "differs", rank, kWorld, std::chrono::milliseconds(30000), &comm);
    if (!s.ok()) {
      finished.count_down();
      throw std::runtime_error(s.ToString());
    }
    auto& buf = a[static_cast<size_t>(rank)];
    const int64_t n = rank == 0 ? 200000 : 199999;  // rank 1 reduces one element fewer
    (void)comm->StartAllReduceSum(core::Span{buf.data(), n, DType::kFloat32}, "bucket 0");
    auto& later = c[static_cast<size_t>(rank)];
    (void)comm->StartAllReduceSum(core::Span{later.data(), 200000, DType::kFloat32}, "bucket 1");
    first[static_cast<size_t>(rank)] = comm->WaitPending();
    second[static_cast<size_t>(rank)] = comm->WaitPending();
    finished.arrive_and_wait();
  });
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(first[static_cast<size_t>(r)].code(), core::Code::kMismatch) << first[static_cast<size_t>(r)].ToString();
    EXPECT_NE(first[static_cast<size_t>(r)].message().find("bucket 0"), std::string::npos);
    EXPECT_TRUE(second[static_cast<size_t>(r)].ok());
    EXPECT_EQ(c[static_cast<size_t>(r)], std::vector<float>(200000, 2.0f));  // bucket 1 never ran
  }
}

}  // namespace
}  // namespace ddpcheck::sim
