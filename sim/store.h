// Stores for rendezvous and the flight recorder, plus helpers that work on any gloo store.
//
// Gloo's HashStore and FileStore refuse to set a key twice (set() throws "already set" / "File already
// exists"), and FileStore::get() blocks until the key exists. The flight recorder wants one cheap overwrite
// per collective and a non-blocking read, so ddpcheck has its own in-process store that allows both.
// Every store here is a gloo::rendezvous::Store, so gloo's connectFullMesh rendezvous runs over it too.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace ddpcheck::sim {

// A gloo store that can also replace a key and read without blocking.
class OverwritableStore : public gloo::rendezvous::Store {
 public:
  // Sets `key` to `data`, replacing an earlier value.
  virtual void Put(const std::string& key, const std::vector<char>& data) = 0;
  // Copies the value of `key` into *out and returns true; returns false at once when the key is absent.
  virtual bool TryGet(const std::string& key, std::vector<char>* out) = 0;
};

// In-process store for ranks as threads (one shared instance): gloo's HashStore semantics, except that
// set() replaces an existing key. Thread-safe.
class MemoryStore final : public OverwritableStore {
 public:
  void set(const std::string& key, const std::vector<char>& data) override;
  // Waits up to Store::kDefaultTimeout for the key, then throws gloo::IoException.
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, kDefaultTimeout); }
  // Returns once every key exists; throws gloo::IoException naming the missing keys after `timeout`.
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

  void Put(const std::string& key, const std::vector<char>& data) override;
  bool TryGet(const std::string& key, std::vector<char>* out) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::vector<char>> map_;
};

// Reads `key` from any gloo store without blocking for long: OverwritableStore::TryGet, HashStore::get
// (which returns empty for a missing key, so values must be non-empty), else wait() with `patience` and
// then get(). False when absent.
bool StoreTryGet(gloo::rendezvous::Store& store, const std::string& key, std::vector<char>* out,
                 std::chrono::milliseconds patience = std::chrono::milliseconds(1));

// True when `key` exists in `store` (see StoreTryGet for how long it may wait).
bool StoreHas(gloo::rendezvous::Store& store, const std::string& key,
              std::chrono::milliseconds patience = std::chrono::milliseconds(1));

}  // namespace ddpcheck::sim
