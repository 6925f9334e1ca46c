#include "harness/run_id.h"

#include <unistd.h>

#include <chrono>
#include <memory>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "sim/store_named.h"
#include "sim/store_open.h"

namespace ddpcheck::harness {

core::Status ClaimRunId(const std::string& url, const std::string& run_id, int node_rank) {
  std::shared_ptr<gloo::rendezvous::Store> store;
  DDPCHECK_RETURN_IF_ERROR(sim::OpenStore(url, std::chrono::milliseconds(5000), &store));
  const std::string key = run_id + "/launch/" + std::to_string(node_rank);
  try {
    const std::string me = std::to_string(getpid());
    store->set(key, std::vector<char>(me.begin(), me.end()));
  } catch (const sim::StoreFailure& e) {
    return core::Status::Io(e.what());
  } catch (const std::exception&) {
    return core::Status::Invalid("run id '" + run_id + "' (node rank " + std::to_string(node_rank) +
                                 ") is already used on " + url + " by another launch, running or finished: pick "
                                 "another with --run-id (or leave it out on one node: each launch then gets its "
                                 "own)");
  }
  return core::Status::Ok();
}

}  // namespace ddpcheck::harness
