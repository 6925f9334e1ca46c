#include "sim/store_named.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "sim/communicator_gloo_errors.h"
#include "sim/store.h"

namespace ddpcheck::sim {

namespace {

timeval Timeval(std::chrono::milliseconds t) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(t.count() / 1000);
  tv.tv_usec = static_cast<suseconds_t>(t.count() % 1000 * 1000);
  return tv;
}

// Its own hiredis connection (gloo's RedisStore connects with no deadline, and one connection must not be used
// by two threads): made on first use with redisConnectWithTimeout, dropped after a failure and made again by
// the next operation.
class RedisLine final : public StoreLine {
 public:
  RedisLine(std::string host, int port, std::chrono::milliseconds deadline)
      : host_(std::move(host)),
        port_(port),
        where_("redis://" + host_ + ":" + std::to_string(port)),
        deadline_(deadline) {}
  ~RedisLine() override {
    if (c_) redisFree(c_);
  }
  void Replace(const std::string& key, const std::string& value) override {
    std::vector<std::string> args = {"SET", key, value};
    Reply reply = Command(args, key);
    if (reply->type == REDIS_REPLY_ERROR) Fail("SET", key, std::string(reply->str, reply->len));
  }
  std::vector<std::optional<std::string>> Read(const std::vector<std::string>& keys) override {
    std::vector<std::optional<std::string>> out(keys.size());
    if (keys.empty()) return out;
    std::vector<std::string> args = {"MGET"};
    args.insert(args.end(), keys.begin(), keys.end());
    Reply reply = Command(args, keys.front());
    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != keys.size()) {
      Fail("MGET", keys.front(), "unexpected reply type " + std::to_string(reply->type));
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      const redisReply* e = reply->element[i];
      if (e->type == REDIS_REPLY_STRING) out[i] = std::string(e->str, e->len);
    }
    return out;
  }

 private:
  using Reply = std::unique_ptr<redisReply, void (*)(void*)>;
  [[noreturn]] void Fail(const std::string& op, const std::string& key, const std::string& why) {
    throw StoreFailure("rendezvous store " + where_ + ": " + op + " '" + key + "' failed: " + why);
  }
  Reply Command(const std::vector<std::string>& args, const std::string& key) {
    if (!c_) {
      c_ = redisConnectWithTimeout(host_.c_str(), port_, Timeval(deadline_));
      if (!c_ || c_->err || redisSetTimeout(c_, Timeval(deadline_)) != REDIS_OK) {
        const std::string why = c_ ? c_->errstr : "out of memory";
        if (c_) redisFree(c_);
        c_ = nullptr;
        Fail("connect for", key, why);
      }
    }
    std::vector<const char*> argv;
    std::vector<size_t> lens;
    for (const std::string& a : args) {
      argv.push_back(a.data());
      lens.push_back(a.size());
    }
    void* reply = redisCommandArgv(c_, static_cast<int>(args.size()), argv.data(), lens.data());
    if (!reply) {
      std::string why = c_->errstr;
      if (c_->err == REDIS_ERR_IO && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        why = "no answer within " + std::to_string(deadline_.count()) + " ms";
      }
      redisFree(c_);
      c_ = nullptr;
      Fail(args.front(), key, why);
    }
    return Reply(static_cast<redisReply*>(reply), freeReplyObject);
  }

  std::string host_;
  int port_;
  std::string where_;
  std::chrono::milliseconds deadline_;
  redisContext* c_ = nullptr;
};

// The FileStore's own files (gloo's names for the keys): replaced by writing a temporary file and renaming it
// over the key's, so a reader opens either the old value or the new one, never half of one.
class FileLine final : public StoreLine {
 public:
  explicit FileLine(std::shared_ptr<NamedFileStore> store) : store_(std::move(store)) {}
  void Replace(const std::string& key, const std::string& value) override {
    const std::string path = store_->KeyPath(key);
    const std::string tmp = path + ".line";
    bool ok = false;
    if (FILE* f = std::fopen(tmp.c_str(), "wb")) {
      ok = std::fwrite(value.data(), 1, value.size(), f) == value.size();
      ok = std::fclose(f) == 0 && ok;
    }
    if (ok && std::rename(tmp.c_str(), path.c_str()) == 0) return;
    const std::string cause = std::strerror(errno);
    std::remove(tmp.c_str());
    const std::string full = DiskFullCause(store_->path());
    throw StoreFailure("rendezvous store file://" + store_->path() + ": cannot replace key '" + key +
                       "': " + (full.empty() ? cause : full));
  }
  std::vector<std::optional<std::string>> Read(const std::vector<std::string>& keys) override {
    std::vector<std::optional<std::string>> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      std::ifstream in(store_->KeyPath(keys[i]), std::ios::binary);
      if (in) out[i] = std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return out;
  }

 private:
  std::shared_ptr<NamedFileStore> store_;
};

// sim::MemoryStore and the like: one map shared by threads, already safe to use from several.
class OverwritableLine final : public StoreLine {
 public:
  explicit OverwritableLine(std::shared_ptr<gloo::rendezvous::Store> store) : store_(std::move(store)) {}
  void Replace(const std::string& key, const std::string& value) override {
    static_cast<OverwritableStore&>(*store_).Put(key, std::vector<char>(value.begin(), value.end()));
  }
  std::vector<std::optional<std::string>> Read(const std::vector<std::string>& keys) override {
    std::vector<std::optional<std::string>> out(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      std::vector<char> bytes;
      if (static_cast<OverwritableStore&>(*store_).TryGet(keys[i], &bytes)) {
        out[i] = std::string(bytes.begin(), bytes.end());
      }
    }
    return out;
  }

 private:
  std::shared_ptr<gloo::rendezvous::Store> store_;
};

}  // namespace

std::unique_ptr<StoreLine> OpenStoreLine(const std::shared_ptr<gloo::rendezvous::Store>& store,
                                         std::chrono::milliseconds deadline) {
  if (auto* redis = dynamic_cast<NamedRedisStore*>(store.get())) {
    return std::make_unique<RedisLine>(redis->host(), redis->port(), deadline);
  }
  if (auto file = std::dynamic_pointer_cast<NamedFileStore>(store)) return std::make_unique<FileLine>(file);
  if (dynamic_cast<OverwritableStore*>(store.get())) return std::make_unique<OverwritableLine>(store);
  return nullptr;
}

std::string DiskFullCause(const std::string& path) {
  struct statvfs fs {};
  if (statvfs(path.c_str(), &fs) != 0 || fs.f_bavail > 0) return "";
  return "disk full (no space left on the filesystem of " + path + ")";
}

NamedRedisStore::NamedRedisStore(const std::string& host, int port, std::chrono::milliseconds timeout)
    : RedisStore(host, port),
      host_(host),
      port_(port),
      where_("redis://" + host + ":" + std::to_string(port)),
      timeout_(timeout) {
  if (redisSetTimeout(redis_, Timeval(timeout)) != REDIS_OK) {
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
