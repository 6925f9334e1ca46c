// Rendezvous stores named by a URL, for ranks as processes (cli `launch`, torchrun, mpirun, srun):
//   file:///shared/dir     gloo FileStore in that folder (created if missing); one host, or a filesystem that
//                          every host mounts (NFS, Lustre, ...) with close-to-open consistency
//   redis://HOST[:PORT]    gloo RedisStore (libgloo built with hiredis); PORT defaults to 6379
// Every key a run writes lives under "<run_id>/", so runs with different run ids never mix on one store, and
// gloo's stores refuse to set a key twice, so a reused run id fails at rendezvous instead of mixing.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/status.h"

namespace gloo::rendezvous {
class Store;
}

namespace ddpcheck::sim {

struct StoreUrl {
  std::string scheme;  // "file" | "redis"
  std::string path;    // file: the folder
  std::string host;    // redis
  int port = 6379;     // redis
};

// Parses a store URL; Invalid with the accepted forms on anything else.
core::Status ParseStoreUrl(const std::string& url, StoreUrl* out);

// Opens (connects to) the store named by `url`. Io when the folder cannot be made or the server cannot be
// reached within `connect_timeout`.
core::Status OpenStore(const std::string& url, std::chrono::milliseconds connect_timeout,
                       std::shared_ptr<gloo::rendezvous::Store>* out);

}  // namespace ddpcheck::sim
