// CollectiveQueue: a rank's started collectives run one at a time in the order they were started; a failure
// stops the ones after it and is returned once; the queue's end runs what it still holds.
#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sim/collective_queue.h"

namespace ddpcheck::sim {
namespace {

using core::Status;

TEST(CollectiveQueue, RunsJobsOneAtATimeInTheOrderStarted) {
  CollectiveQueue queue;
  std::vector<int> order;  // written only by the queue's thread, read after Wait
  std::atomic<int> running{0};
  std::atomic<bool> overlapped{false};
  for (int i = 0; i < 50; ++i) {
    queue.Start([&, i] {
      if (running.fetch_add(1) != 0) overlapped = true;
      std::this_thread::sleep_for(std::chrono::microseconds(100 * (i % 3)));
      order.push_back(i);
      running.fetch_sub(1);
      return Status::Ok();
    });
  }
  EXPECT_TRUE(queue.Wait().ok());
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[static_cast<size_t>(i)], i);
  EXPECT_FALSE(overlapped);
}

TEST(CollectiveQueue, SkipsTheJobsAfterAFailureAndReturnsItOnce) {
  CollectiveQueue queue;
  std::vector<int> ran;
  queue.Start([&] { ran.push_back(0); return Status::Ok(); });
  queue.Start([&] { ran.push_back(1); return Status::Mismatch("bucket 1 differs"); });
  queue.Start([&] { ran.push_back(2); return Status::Ok(); });
  queue.Start([&] { ran.push_back(3); return Status::Timeout("never"); });
  queue.WaitIdle();  // keeps the failure
  const Status first = queue.Wait();
  EXPECT_EQ(first.code(), core::Code::kMismatch);
  EXPECT_EQ(first.message(), "bucket 1 differs");
  EXPECT_EQ(ran, (std::vector<int>{0, 1}));
  EXPECT_TRUE(queue.Wait().ok());  // returned once
  queue.Start([&] { ran.push_back(4); return Status::Ok(); });  // a fresh start runs again
  EXPECT_TRUE(queue.Wait().ok());
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 4}));
}

TEST(CollectiveQueue, TurnsAnExceptionIntoAnInternalFailure) {
  CollectiveQueue queue;
  queue.Start([]() -> Status { throw std::runtime_error("boom"); });
  const Status st = queue.Wait();
  EXPECT_EQ(st.code(), core::Code::kInternal);
  EXPECT_NE(st.message().find("boom"), std::string::npos);
}

TEST(CollectiveQueue, ItsEndRunsTheJobsItStillHolds) {
  std::atomic<int> ran{0};
  {
    CollectiveQueue queue;
    for (int i = 0; i < 5; ++i) {
      queue.Start([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ++ran;
        return Status::Ok();
      });
    }
  }
  EXPECT_EQ(ran.load(), 5);
}

TEST(CollectiveQueue, RunHereRunsAfterTheStartedOnesWithTheirBookkeeping) {
  CollectiveQueue queue;
  std::vector<int> ran;
  queue.Start([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ran.push_back(0);
    return Status::Ok();
  });
  EXPECT_TRUE(queue.RunHere([&] { ran.push_back(1); return Status::Ok(); }).ok());  // after job 0
  EXPECT_EQ(ran, (std::vector<int>{0, 1}));
  const Status failed = queue.RunHere([&] { ran.push_back(2); return Status::Mismatch("small bucket"); });
  EXPECT_EQ(failed.code(), core::Code::kMismatch);  // returned at once...
  EXPECT_TRUE(queue.RunHere([&] { ran.push_back(3); return Status::Ok(); }).ok());  // ...nothing runs after it...
  queue.Start([&] { ran.push_back(4); return Status::Ok(); });
  EXPECT_EQ(queue.Wait().message(), "small bucket");  // ...and it is returned again, once, by the next Wait
  EXPECT_EQ(ran, (std::vector<int>{0, 1, 2}));
  EXPECT_TRUE(queue.Wait().ok());
}

TEST(CollectiveQueue, WaitWithNothingStartedReturnsAtOnce) {
  CollectiveQueue queue;
  EXPECT_TRUE(queue.Wait().ok());
  queue.WaitIdle();
}

}  // namespace
}  // namespace ddpcheck::sim
