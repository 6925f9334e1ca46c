#include "sim/store_open.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "sim/store_named.h"

namespace ddpcheck::sim {

namespace {

const char kForms[] = "expected file:///shared/dir or redis://HOST[:PORT]";

// Printable text of a reply, for messages: at most 40 bytes, others as \xNN.
std::string Printable(const char* data, size_t n) {
  std::string out;
  for (size_t i = 0; i < n && i < 40; ++i) {
    const unsigned char c = static_cast<unsigned char>(data[i]);
    if (c >= 32 && c < 127) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

// Sends PING on connected `fd` and expects +PONG within `deadline`; "" when it came, else why not.
std::string Ping(int fd, std::chrono::steady_clock::time_point deadline) {
  const char ping[] = "*1\r\n$4\r\nPING\r\n";
  if (send(fd, ping, sizeof(ping) - 1, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(ping) - 1))
    return std::string("cannot send PING: ") + std::strerror(errno);
  std::string reply;
  while (reply.find("\r\n") == std::string::npos) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{fd, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) != 1) {
      return reply.empty() ? "accepts connections but did not answer PING within the timeout (is it a Redis "
                             "server? is it stopped?)"
                           : "sent '" + Printable(reply.data(), reply.size()) + "' and then nothing";
    }
    char buf[64];
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return n == 0 ? "closed the connection on PING" : std::string("read error: ") + std::strerror(errno);
    reply.append(buf, static_cast<size_t>(n));
    if (reply.size() > 256) break;
  }
  if (reply.rfind("+PONG\r\n", 0) == 0) return "";
  return "answered PING with '" + Printable(reply.data(), reply.size()) +
         "' instead of +PONG (not a Redis server, or it needs a password)";
}

// gloo's RedisStore connects and sends commands with no deadline of ours: probe the server first, connecting
// and sending PING with `timeout` in all, so "nobody listens", "a listener that never answers" and "something
// that is not Redis" are each a clear Io status naming the address.
core::Status ProbeRedis(const std::string& host, int port, std::chrono::milliseconds timeout) {
  const std::string where = "redis://" + host + ":" + std::to_string(port);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res); rc != 0) {
    return core::Status::Io(where + ": cannot resolve host: " + gai_strerror(rc));
  }
  std::string error = "no address";
  bool connected = false;
  for (addrinfo* a = res; a && !connected; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
      connected = true;
    } else if (errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      int err = 0;
      socklen_t len = sizeof(err);
      if (poll(&p, 1, static_cast<int>(timeout.count())) == 1 &&
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0) {
        connected = true;
      } else {
        error = err ? std::strerror(err) : "no answer within " + std::to_string(timeout.count()) + " ms";
      }
    } else {
      error = std::strerror(errno);
    }
    if (connected) {
      const std::string why = Ping(fd, deadline);
      close(fd);
      freeaddrinfo(res);
      if (!why.empty()) {
        return core::Status::Io(where + ": the rendezvous store " + why + " (" + std::to_string(timeout.count()) +
                                " ms)");
      }
      return core::Status::Ok();
    }
    close(fd);
  }
  freeaddrinfo(res);
  return core::Status::Io(where + ": cannot connect to the Redis server: " + error);
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
      *out = std::make_shared<NamedFileStore>(u.path, connect_timeout);
    } catch (const std::exception& e) {
      return core::Status::Io(u.path + ": cannot open the FileStore: " + e.what());
    }
    return core::Status::Ok();
  }
  DDPCHECK_RETURN_IF_ERROR(ProbeRedis(u.host, u.port, connect_timeout));
  try {
    *out = std::make_shared<NamedRedisStore>(u.host, u.port, connect_timeout);
  } catch (const std::exception& e) {
    return core::Status::Io(url + ": cannot open the Redis store: " + e.what());
  }
  return core::Status::Ok();
}

}  // namespace ddpcheck::sim
