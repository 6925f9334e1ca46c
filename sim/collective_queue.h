// CollectiveQueue: one thread that runs a rank's started collectives one at a time, in the order they were
// started, as ProcessGroupGloo's work queue runs DDP's bucket all-reduces while the backward goes on.
// Wait() blocks until every started job has run and returns the first failure since the last Wait(); a job
// started after a failure is not run (DDP launches no bucket after a failed one). The thread starts with
// the first job and ends with the queue, after the jobs it holds have run.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

#include "core/status.h"

namespace ddpcheck::sim {

class CollectiveQueue {
 public:
  CollectiveQueue() = default;
  CollectiveQueue(const CollectiveQueue&) = delete;
  CollectiveQueue& operator=(const CollectiveQueue&) = delete;
  ~CollectiveQueue();

  void Start(std::function<core::Status()> job);
  // Runs `job` on the calling thread, in order after the started ones, with their bookkeeping: not run after
  // a failure (returns OK), and its own failure is returned here and kept for the next Wait().
  core::Status RunHere(const std::function<core::Status()>& job);
  core::Status Wait();
  // Blocks like Wait() but keeps the failure for the next Wait().
  void WaitIdle();

 private:
  void Loop();
  void WaitIdleLocked(std::unique_lock<std::mutex>& lock);

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<core::Status()>> jobs_;
  bool running_ = false;  // a job is out of jobs_ and not finished
  bool stop_ = false;
  core::Status failure_;
  std::thread thread_;
};

}  // namespace ddpcheck::sim
