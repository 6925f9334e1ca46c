// The GPU world's join before any NCCL call (real/rendezvous.h) and its host waits (real/poll_wait.h), on the
// CPU: ranks as threads over an in-memory KvStore. A rank that never joins is named within the timeout, the way
// the CPU world names it; a full world exchanges rank 0's id; a wait that never completes ends at its deadline.
// No GPU needed (ctest -L gpu-host).
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "real/arrival_record.h"
#include "real/kv_store.h"
#include "real/poll_wait.h"
#include "real/rendezvous.h"

namespace ddpcheck::real {
namespace {

using Clock = std::chrono::steady_clock;

struct Joined {
  core::Status status;
  std::vector<char> id;
  double seconds = 0;
};

// Ranks `present` of a world of `world` join run "r" with `timeout`; returns each present rank's result.
std::vector<Joined> Join(int world, const std::vector<int>& present, std::chrono::milliseconds timeout) {
  auto store = std::make_shared<MemoryKvStore>();
  std::vector<Joined> out(present.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < present.size(); ++i) {
    threads.emplace_back([&, i] {
      const int rank = present[i];
      ArrivalRecord arrivals(store, "r", rank, world);
      const auto t0 = Clock::now();
      out[i].status = JoinAndExchangeId(
          store.get(), &arrivals, "r", rank, world, timeout,
          [](std::vector<char>* id) {
            *id = std::vector<char>(128, 'x');
            return core::Status::Ok();
          },
          128, &out[i].id);
      out[i].seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(GpuRendezvous, AFullWorldGetsRankZerosIdOnEveryRank) {
  const auto joined = Join(4, {0, 1, 2, 3}, std::chrono::milliseconds(5000));
  for (const auto& j : joined) {
    ASSERT_TRUE(j.status.ok()) << j.status.message();
    EXPECT_EQ(j.id, std::vector<char>(128, 'x'));
  }
}

TEST(GpuRendezvous, ARankThatNeverJoinsIsNamedByEveryOtherRankWithinTheTimeout) {
  const auto joined = Join(4, {0, 1, 3}, std::chrono::milliseconds(300));
  for (const auto& j : joined) {
    ASSERT_FALSE(j.status.ok());
    EXPECT_EQ(j.status.code(), core::Code::kTimeout) << j.status.message();
    EXPECT_NE(j.status.message().find("rank 2 never joined (3 of 4 joined)"), std::string::npos) << j.status.message();
    EXPECT_LT(j.seconds, 0.3 + 2.0) << "the join must end at its deadline, not hang";
  }
}

TEST(GpuRendezvous, SeveralMissingRanksAreListedAsRanges) {
  EXPECT_EQ(RankListText({5, 1, 2, 3, 7}), "ranks 1-3, 5, 7");
  EXPECT_EQ(RankListText({4}), "rank 4");
  const auto joined = Join(6, {0}, std::chrono::milliseconds(200));
  ASSERT_EQ(joined.size(), 1u);
  EXPECT_NE(joined[0].status.message().find("ranks 1-5 never joined (1 of 6 joined)"), std::string::npos)
      << joined[0].status.message();
}

TEST(GpuHostWait, AQueryThatNeverCompletesEndsAtItsDeadline) {
  const auto t0 = Clock::now();
  const PollResult r = PollUntil([] { return PollState::kNotReady; }, t0 + std::chrono::milliseconds(150));
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(r, PollResult::kTimedOut);
  EXPECT_GE(waited, 0.15);
  EXPECT_LT(waited, 1.0);
}

TEST(GpuHostWait, DoneAndFailedEndTheWaitAtOnce) {
  std::atomic<int> calls{0};
  EXPECT_EQ(PollUntil([&] { return ++calls < 5 ? PollState::kNotReady : PollState::kDone; },
                      Clock::now() + std::chrono::seconds(10)),
            PollResult::kDone);
  EXPECT_EQ(calls.load(), 5);
  EXPECT_EQ(PollUntil([] { return PollState::kFailed; }, Clock::now() + std::chrono::seconds(10)), PollResult::kFailed);
}

}  // namespace
}  // namespace ddpcheck::real
