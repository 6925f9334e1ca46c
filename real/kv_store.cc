#include "real/kv_store.h"

#include <thread>

namespace ddpcheck::real {

bool KvStore::Wait(const std::string& key, std::chrono::milliseconds timeout, std::vector<char>* value) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto pause = std::chrono::milliseconds(1);
  for (;;) {
    if (TryGet(key, value)) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(pause);
    if (pause < std::chrono::milliseconds(50)) pause *= 2;
  }
}

void MemoryKvStore::Set(const std::string& key, const std::vector<char>& value) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    map_[key] = value;
  }
  cv_.notify_all();
}

bool MemoryKvStore::TryGet(const std::string& key, std::vector<char>* value) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  if (value) *value = it->second;
  return true;
}

bool MemoryKvStore::Wait(const std::string& key, std::chrono::milliseconds timeout, std::vector<char>* value) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, timeout, [&] { return map_.count(key) > 0; })) return false;
  if (value) *value = map_[key];
  return true;
}

}  // namespace ddpcheck::real
