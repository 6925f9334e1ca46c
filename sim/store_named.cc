#include "sim/store_named.h"

#include <sys/statvfs.h>

#include <filesystem>

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
    return RedisStore::get(key);  // waits for the key first
  } catch (const std::exception& e) {
    if (IsGlooTimeout(GlooErrorText(e.what())) && (!redis_ || redis_->err == 0)) throw;  // as in wait()
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

NamedFileStore::NamedFileStore(const std::string& path, std::chrono::milliseconds timeout)
    : FileStore(path), path_(path), timeout_(timeout) {}

void NamedFileStore::set(const std::string& key, const std::vector<char>& data) {
  // gloo's FileStore does not check its writes: on a full disk it publishes an empty or truncated file and
  // the reader fails with "n > 0. 0 vs 0". So check the space before and the size after.
  struct statvfs fs {};
  if (statvfs(path_.c_str(), &fs) == 0 && fs.f_bavail * fs.f_bsize < data.size() + fs.f_bsize) {
    throw StoreFailure("rendezvous store file://" + path_ + ": cannot write key '" + key + "' (" + std::to_string(data.size()) +
                       " bytes): disk full (" + std::to_string(fs.f_bavail * fs.f_bsize) + " bytes free)");
  }
  try {
    FileStore::set(key, data);
  } catch (const std::exception& e) {
    const std::string cause = GlooErrorText(e.what());
    if (cause.find("exists") != std::string::npos) throw;  // a key set twice: a reused run id
    const std::string full = DiskFullCause(path_);
    throw StoreFailure("rendezvous store file://" + path_ + ": cannot write key '" + key +
                       "': " + (full.empty() ? cause : full + "; gloo said: " + cause));
  }
  std::error_code ec;
  const std::string object = objectPath(key);
  if (std::filesystem::file_size(object, ec) != data.size() || ec) {
    std::filesystem::remove(object, ec);
    const std::string full = DiskFullCause(path_);
    throw StoreFailure("rendezvous store file://" + path_ + ": key '" + key + "' was written short: " +
                       (full.empty() ? "the write failed" : full));
  }
}

std::vector<char> NamedFileStore::get(const std::string& key) {
  try {
    return FileStore::get(key);  // waits for the key first
  } catch (const std::exception& e) {
    const std::string full = DiskFullCause(path_);
    if (IsGlooTimeout(GlooErrorText(e.what())) && full.empty()) throw;  // a key that never came: the caller's
    throw StoreFailure("rendezvous store file://" + path_ + ": cannot read key '" + key + "': " +
                       GlooErrorText(e.what()) + (full.empty() ? "" : " (" + full + ")"));
  }
}

}  // namespace ddpcheck::sim
