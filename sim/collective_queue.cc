#include "sim/collective_queue.h"

#include <exception>
#include <utility>

namespace ddpcheck::sim {

CollectiveQueue::~CollectiveQueue() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CollectiveQueue::Start(std::function<core::Status()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    jobs_.push_back(std::move(job));
    if (!thread_.joinable()) thread_ = std::thread([this] { Loop(); });
  }
  cv_.notify_all();
}

core::Status CollectiveQueue::RunHere(const std::function<core::Status()>& job) {
  std::unique_lock<std::mutex> lock(mu_);
  WaitIdleLocked(lock);
  if (!failure_.ok()) return core::Status::Ok();
  lock.unlock();
  core::Status st = job();
  lock.lock();
  if (!st.ok()) failure_ = st;
  return st;
}

core::Status CollectiveQueue::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  WaitIdleLocked(lock);
  return std::exchange(failure_, core::Status::Ok());
}

void CollectiveQueue::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  WaitIdleLocked(lock);
}

void CollectiveQueue::WaitIdleLocked(std::unique_lock<std::mutex>& lock) {
  cv_.wait(lock, [this] { return jobs_.empty() && !running_; });
}

void CollectiveQueue::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and every job has run
    std::function<core::Status()> job = std::move(jobs_.front());
    jobs_.pop_front();
    if (!failure_.ok()) {  // not run after a failure
      cv_.notify_all();
      continue;
    }
    running_ = true;
    lock.unlock();
    core::Status st;
    try {
      st = job();
    } catch (const std::exception& e) {
      st = core::Status::Internal(std::string("collective queue: ") + e.what());
    } catch (...) {
      st = core::Status::Internal("collective queue: unknown exception");
    }
    lock.lock();
    running_ = false;
    if (failure_.ok() && !st.ok()) failure_ = std::move(st);
    cv_.notify_all();
  }
}

}  // namespace ddpcheck::sim
