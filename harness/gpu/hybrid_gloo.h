// The hybrid world's host side: each rank's Gloo communicator (sim/'s, over one in-process store, exactly as
// sim::RunSim builds them), handed to real::RunReal, which stages device buffers through it. And a real::KvStore over
// any Gloo store, so ranks as processes share the FileStore the CPU world's launcher uses.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "real/kv_store.h"
#include "real/world.h"

namespace gloo::rendezvous {
class Store;
}

namespace ddpcheck::harness {

// Rank r's GlooCommunicator of a world of `world` ranks (all created through one shared store).
real::HostCommFn GlooHostComms(int world, const std::string& run_id, std::chrono::milliseconds timeout);

// `opts` set up for hybrid: comm "hybrid", host_comm = GlooHostComms(world, ...).
real::RealOptions WithGlooHybrid(real::RealOptions opts, int world);

class GlooKvStore final : public real::KvStore {
 public:
  explicit GlooKvStore(std::shared_ptr<gloo::rendezvous::Store> store) : store_(std::move(store)) {}
  void Set(const std::string& key, const std::vector<char>& value) override;
  bool TryGet(const std::string& key, std::vector<char>* value) override;

 private:
  std::shared_ptr<gloo::rendezvous::Store> store_;
};

}  // namespace ddpcheck::harness
