#include "harness/gpu/hybrid_gloo.h"

#include "sim/communicator_gloo.h"
#include "sim/store.h"

namespace ddpcheck::harness {

real::HostCommFn GlooHostComms(int world, const std::string& run_id, std::chrono::milliseconds timeout) {
  auto store = std::make_shared<sim::MemoryStore>();
  return [store, world, run_id, timeout](int rank, std::unique_ptr<core::Communicator>* out) {
    std::unique_ptr<sim::GlooCommunicator> comm;
    DDPCHECK_RETURN_IF_ERROR(sim::GlooCommunicator::Create(store, run_id, rank, world, timeout, &comm));
    *out = std::move(comm);
    return core::Status::Ok();
  };
}

real::RealOptions WithGlooHybrid(real::RealOptions opts, int world) {
  opts.comm = "hybrid";
  opts.host_comm = GlooHostComms(world, opts.run_id + "-gloo", opts.timeout);
  return opts;
}

void GlooKvStore::Set(const std::string& key, const std::vector<char>& value) { store_->set(key, value); }

bool GlooKvStore::TryGet(const std::string& key, std::vector<char>* value) {
  std::vector<char> v;
  if (!sim::StoreTryGet(*store_, key, &v)) return false;
  if (value) *value = std::move(v);
  return true;
}

}  // namespace ddpcheck::harness
