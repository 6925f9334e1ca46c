#include "sim/store_named.h"

#include <sys/statvfs.h>

#include "sim/communicator_gloo_errors.h"

namespace ddpcheck::sim {

std::string DiskFullCause(const std::string& path) {
  struct statvfs fs {};
  if (statvfs(path.c_str(), &fs) != 0 || fs.f_bavail > 0) return "";
  return "disk full (no space left on the filesystem of " + path + ")";
}

NamedRedisStore::NamedRedisStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : RedisStore(host, port), where_("redis://" + host + ":" + std::to_string(port)), timeout_(timeout) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(timeout.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>(timeout.count() % 1000 * 1000);
  if (redisSetTimeout(redis_, tv) != REDIS_OK) {
    throw StoreFailure(where_ + ": cannot set a command timeout: " + std::string(redis_->errstr));
  }
}

void NamedRedisStore::Throw(const std::string& op, const std::string& key, const std::exception& e) const {
  std::string cause = GlooErrorText(e.what());
  if (cause.find("temporarily unavailable") != std::string::npos) {
    cause = "no answer within " + std::to_string(timeout_.count()) + " ms (server stopped or overloaded?)";
  } else if (cause.find("already set") != std::string::npos) {
    throw;  // a key set twice: the caller explains (a reused run id)
  } else if (redis_ && redis_->err != 0 && cause.find("closed") == std::string::npos) {
    cause += " (the server closed the connection or died?)";
  }
  throw StoreFailure("rendezvous store " + where_ + ": " + op + " '" + key + "' failed: " + cause);
}

void NamedRedisStore::set(const std::string& key, const std::vector<char>& data) {
  try {
    RedisStore::set(key, data);
  } catch (const std::exception& e) {
    Throw("set", key, e);
  }
}

std::vector<char> NamedRedisStore::get(const std::string& key) {
  try {
    return RedisStore::get(key);
  } catch (const std::exception& e) {
    Throw("get", key, e);
  }
}

void NamedRedisStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  try {
    RedisStore::wait(keys, timeout);
  } catch (const std::exception& e) {
    // Running out of time waiting for keys is the caller's to explain (a rank that never came); a broken
    // connection is the store's.
    if (IsGlooTimeout(GlooErrorText(e.what())) && (!redis_ || redis_->err == 0)) throw;
    Throw("wait for", keys.empty() ? "" : keys.front(), e);
  }
}

NamedFileStore::NamedFileStore(const std::string& path) : FileStore(path), path_(path) {}

void NamedFileStore::set(const std::string& key, const std::vector<char>& data) {
  try {
    FileStore::set(key, data);
  } catch (const std::exception& e) {
    const std::string cause = GlooErrorText(e.what());
    if (cause.find("exists") != std::string::npos) throw;  // a key set twice: a reused run id
    const std::string full = DiskFullCause(path_);
    throw StoreFailure("rendezvous store file://" + path_ + ": cannot write key '" + key +
                       "': " + (full.empty() ? cause : full + "; gloo said: " + cause));
  }
}

}  // namespace ddpcheck::sim
