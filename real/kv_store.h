// KvStore: the key-value store the GPU world rendezvouses through (the NCCL unique id, the arrival records
// that name missing ranks). real/ includes no Gloo: the composition root adapts the Gloo store the CPU world
// uses (harness/gpu/hybrid_gloo.h), so both worlds of one run share one store. Keys are never overwritten:
// every key is written once (Gloo's FileStore refuses a second set).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace ddpcheck::real {

class KvStore {
 public:
  virtual ~KvStore() = default;
  // Sets `key` (written once).
  virtual void Set(const std::string& key, const std::vector<char>& value) = 0;
  // Copies the value of `key` and returns true; false at once (or after a very short wait) when absent.
  virtual bool TryGet(const std::string& key, std::vector<char>* value) = 0;
  // Waits up to `timeout` for `key`; false when it never came.
  virtual bool Wait(const std::string& key, std::chrono::milliseconds timeout, std::vector<char>* value);
};

// In-process store for ranks as threads. Thread-safe.
class MemoryKvStore final : public KvStore {
 public:
  void Set(const std::string& key, const std::vector<char>& value) override;
  bool TryGet(const std::string& key, std::vector<char>* value) override;
  bool Wait(const std::string& key, std::chrono::milliseconds timeout, std::vector<char>* value) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<char>> map_;
};

}  // namespace ddpcheck::real
