#include "sim/store.h"

#include <gloo/common/error.h>
#include <gloo/rendezvous/hash_store.h>

namespace ddpcheck::sim {

void MemoryStore::set(const std::string& key, const std::vector<char>& data) { Put(key, data); }

void MemoryStore::Put(const std::string& key, const std::vector<char>& data) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    map_[key] = data;
  }
  cv_.notify_all();
}

bool MemoryStore::TryGet(const std::string& key, std::vector<char>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = map_.find(key);
  if (it == map_.end()) return false;
  *out = it->second;
  return true;
}

std::vector<char> MemoryStore::get(const std::string& key) {
  wait({key}, kDefaultTimeout);
  std::vector<char> out;
  TryGet(key, &out);
  return out;
}

void MemoryStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  auto all_present = [&] {
    for (const auto& k : keys) {
      if (map_.find(k) == map_.end()) return false;
    }
    return true;
  };
  std::unique_lock<std::mutex> lock(mu_);
  if (cv_.wait_for(lock, timeout, all_present)) return;
  std::string missing;
  for (const auto& k : keys) {
    if (map_.find(k) == map_.end()) missing += (missing.empty() ? "" : ", ") + k;
  }
  throw gloo::IoException("MemoryStore: wait timeout after " + std::to_string(timeout.count()) +
                          " ms for key(s): " + missing);
}

bool StoreTryGet(gloo::rendezvous::Store& store, const std::string& key, std::vector<char>* out,
                 std::chrono::milliseconds patience) {
  if (auto* s = dynamic_cast<OverwritableStore*>(&store)) return s->TryGet(key, out);
  if (auto* s = dynamic_cast<gloo::rendezvous::HashStore*>(&store)) {
    *out = s->get(key);  // HashStore::get returns an empty value for a missing key, without waiting
    return !out->empty();
  }
  try {
    store.wait({key}, patience);
    *out = store.get(key);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

bool StoreHas(gloo::rendezvous::Store& store, const std::string& key, std::chrono::milliseconds patience) {
  std::vector<char> ignored;
  return StoreTryGet(store, key, &ignored, patience);
}

}  // namespace ddpcheck::sim
