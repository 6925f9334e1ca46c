// The one way the GPU world's host waits for the device or for NCCL: poll, yielding the core for the first
// `spin` (a wait for a step's kernels is usually shorter than one sleep: Linux's timer slack makes the shortest
// sleep ~55 us), then sleeping with a backoff from 1 us to `max_pause`, until the query says done or failed, or
// the deadline passes. Never a blocking
// cudaStreamSynchronize / cudaEventSynchronize, which would wait forever for a kernel that never ends (an NCCL
// collective whose peer died). Plain C++ (tested on the CPU: tests/gpu_host_rendezvous_test.cc).
#pragma once

#include <chrono>
#include <thread>

namespace ddpcheck::real {

enum class PollState { kNotReady, kDone, kFailed };
enum class PollResult { kDone, kFailed, kTimedOut };

// query: () -> PollState. Returns kTimedOut only after the deadline passed with the query still not ready.
template <class Query>
PollResult PollUntil(Query&& query, std::chrono::steady_clock::time_point deadline,
                     std::chrono::microseconds max_pause = std::chrono::microseconds(500),
                     std::chrono::microseconds spin = std::chrono::microseconds(0)) {
  auto pause = std::chrono::microseconds(1);
  const auto spin_until = std::chrono::steady_clock::now() + spin;
  for (;;) {
    const PollState s = query();
    if (s == PollState::kDone) return PollResult::kDone;
    if (s == PollState::kFailed) return PollResult::kFailed;
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return PollResult::kTimedOut;
    if (now < spin_until) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(pause);
    if (pause < max_pause) pause *= 2;
  }
}

}  // namespace ddpcheck::real
