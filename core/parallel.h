// ParallelFor: fn(0..n-1) over at most one thread per core, for independent pieces of a check (each i writes
// only its own slot). The first exception a piece throws is rethrown once every thread has stopped.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace ddpcheck::core {

template <typename Fn>
void ParallelFor(int64_t n, const Fn& fn) {
  const int64_t threads = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  if (threads <= 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  auto work = [&] {
    for (int64_t i = next++; i < n; i = next++) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

// fn(begin, end) over [0, n) in chunks of `chunk` elements, on every core: for element-wise work over a
// model-sized array whose element k reads and writes only element k (each element's result is the same in
// any chunking).
template <typename Fn>
void ParallelForChunks(int64_t n, int64_t chunk, const Fn& fn) {
  ParallelFor((n + chunk - 1) / chunk, [&](int64_t c) { fn(c * chunk, std::min(n, (c + 1) * chunk)); });
}

}  // namespace ddpcheck::core
