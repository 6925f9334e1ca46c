#include "sim/store_open.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#define HIREDIS_NESTED_INCLUDE 1
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/redis_store.h>

namespace ddpcheck::sim {

namespace {

const char kForms[] = "expected file:///shared/dir or redis://HOST[:PORT]";

// gloo's RedisStore connects with a fixed timeout and aborts the message on failure; probe the server first
// with our own timeout so "nobody listens there" is a clear Io status.
core::Status ProbeTcp(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const std::string where = "redis://" + host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return core::Status::Io(where + ": cannot resolve host: " + gai_strerror(rc));
  }
  std::string error = "no address";
  bool ok = false;
  for (addrinfo* a = res; a && !ok; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      ok = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      if (poll(&p, 1, static_cast<int>(timeout.count())) == 1 &&
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        ok = true;
      } else {
        error = err ? std::strerror(err) : "no answer within " + std::to_string(timeout.count()) + " ms";
      }
    } else {
      error = std::strerror(errno);
    }
    close(fd);
  }
  freeaddrinfo(res);
  if (!ok) return core::Status::Io(where + ": cannot connect to the Redis server: " + error);
  return core::Status::Ok();
}

}  // namespace

core::Status ParseStoreUrl(const std::string& url, StoreUrl* out) {
  *out = StoreUrl{};
  if (url.rfind("file://", 0) == 0) {
    out->scheme = "file";
    out->path = url.substr(7);
    if (out->path.empty() || out->path[0] != '/') {
      return core::Status::Invalid("rendezvous '" + url + "': file:// needs an absolute folder (file:///dir); " +
                                   kForms);
    }
    return core::Status::Ok();
  }
  if (url.rfind("redis://", 0) == 0) {
    out->scheme = "redis";
    std::string rest = url.substr(8);
    if (!rest.empty() && rest.back() == '/') rest.pop_back();
    std::string port;
    if (!rest.empty() && rest[0] == '[') {  // [v6]:port
      const size_t close = rest.find(']');
      if (close == std::string::npos) return core::Status::Invalid("rendezvous '" + url + "': unbalanced [");
      out->host = rest.substr(1, close - 1);
      if (close + 1 < rest.size() && rest[close + 1] == ':') port = rest.substr(close + 2);
    } else {
      const size_t colon = rest.rfind(':');
      out->host = rest.substr(0, colon);
      if (colon != std::string::npos) port = rest.substr(colon + 1);
    }
    if (out->host.empty()) return core::Status::Invalid("rendezvous '" + url + "': no host; " + kForms);
    if (!port.empty()) {
      char* end = nullptr;
      const long p = std::strtol(port.c_str(), &end, 10);
      if (*end != '\0' || p < 1 || p > 65535) {
        return core::Status::Invalid("rendezvous '" + url + "': port must be 1..65535, got '" + port + "'");
      }
      out->port = static_cast<int>(p);
    }
    return core::Status::Ok();
  }
  return core::Status::Invalid("rendezvous '" + url + "': unknown scheme; " + kForms);
}

core::Status OpenStore(const std::string& url, std::chrono::milliseconds connect_timeout,
                       std::shared_ptr<gloo::rendezvous::Store>* out) {
  StoreUrl u;
  DDPCHECK_RETURN_IF_ERROR(ParseStoreUrl(url, &u));
  if (u.scheme == "file") {
    std::error_code ec;
    std::filesystem::create_directories(u.path, ec);
    if (ec) return core::Status::Io(u.path + ": cannot create the FileStore folder: " + ec.message());
    try {
      *out = std::make_shared<gloo::rendezvous::FileStore>(u.path);
    } catch (const std::exception& e) {
      return core::Status::Io(u.path + ": cannot open the FileStore: " + e.what());
    }
    return core::Status::Ok();
  }
  DDPCHECK_RETURN_IF_ERROR(ProbeTcp(u.host, u.port, connect_timeout));
  try {
    *out = std::make_shared<gloo::rendezvous::RedisStore>(u.host, u.port);
  } catch (const std::exception& e) {
    return core::Status::Io(url + ": cannot open the Redis store: " + e.what());
  }
  return core::Status::Ok();
}

}  // namespace ddpcheck::sim
