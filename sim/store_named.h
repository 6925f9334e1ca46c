// gloo's RedisStore and FileStore with errors that say which store failed and why, and with deadlines:
//   - NamedRedisStore: every command has the run's timeout (hiredis socket timeouts), so a Redis server that
//     stops answering or dies mid-run ends the operation with "redis://HOST:PORT: SETNX 'key': no answer
//     within 2000 ms" instead of a hang or an unnamed error;
//   - NamedFileStore: a failed write says so with its cause ("disk full" when the filesystem has no space
//     left) instead of gloo's "n > 0. 0 vs 0".
// Both throw StoreFailure, so callers can tell the store's failure from a peer's.
// StoreLine: a second, independent line to the same store for a background thread (the heartbeats of
// sim/peer_watch.h), which replaces and reads small keys, every operation under a deadline.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#define HIREDIS_NESTED_INCLUDE 1
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/redis_store.h>

namespace ddpcheck::sim {

// A store operation failed; what() names the store and the cause.
class StoreFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class NamedRedisStore final : public gloo::rendezvous::RedisStore {
 public:
  // Connects (gloo's RedisStore) and sets every later command's deadline to `timeout`.
  NamedRedisStore(const std::string& host, int port, std::chrono::milliseconds timeout);
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;
  // gloo calls this overload (connectFullMesh): it waits the run's timeout, not gloo's 30 s default.
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  const std::string& host() const { return host_; }
  int port() const { return port_; }

 private:
  [[noreturn]] void Throw(const std::string& op, const std::string& key, const std::exception& e) const;
  std::string host_;
  int port_;
  std::string where_;
  std::chrono::milliseconds timeout_;
};

class NamedFileStore final : public gloo::rendezvous::FileStore {
 public:
  // `timeout`: how long wait(keys) without a timeout waits (gloo's default is 30 s).
  NamedFileStore(const std::string& path, std::chrono::milliseconds timeout);
  // Throws StoreFailure naming a full disk before writing, and when the written value came out short.
  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    FileStore::wait(keys, timeout);
  }
  void wait(const std::vector<std::string>& keys) override { FileStore::wait(keys, timeout_); }
  // The file that holds `key` (gloo names it by a hash of the key). Safe from any thread.
  std::string KeyPath(const std::string& key) { return objectPath(key); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::chrono::milliseconds timeout_;
};

// "disk full (no space left on the filesystem of PATH)" when PATH's filesystem has no free block, else "".
std::string DiskFullCause(const std::string& path);

// A line of its own to a store, for one background thread: keys are replaced (unlike gloo's set, which refuses
// a second write) and read without waiting. Every operation ends within the deadline it was opened with, or
// throws StoreFailure naming the store. Not thread-safe: one thread per line.
class StoreLine {
 public:
  virtual ~StoreLine() = default;
  // Sets `key` to `value`, replacing an earlier value.
  virtual void Replace(const std::string& key, const std::string& value) = 0;
  // The values of `keys`, nullopt for a key that is absent.
  virtual std::vector<std::optional<std::string>> Read(const std::vector<std::string>& keys) = 0;
};

// A new line to the store `store` is (Redis: its own connection, made on first use; FileStore: the same folder;
// sim::MemoryStore: the same map), each operation bounded by `deadline`. nullptr for other stores.
std::unique_ptr<StoreLine> OpenStoreLine(const std::shared_ptr<gloo::rendezvous::Store>& store,
                                         std::chrono::milliseconds deadline);

}  // namespace ddpcheck::sim
