// GlooCommunicator::Create: join the run through the store, then connect gloo's full mesh.
#include <algorithm>
#include <condition_variable>
#include <csignal>
#include <cstdlib>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/tcp/device.h>

#include "sim/communicator_gloo.h"
#include "sim/communicator_gloo_errors.h"
#include "sim/flight_recorder_store.h"
#include "sim/gloo_inproc.h"
#include "sim/store.h"
#include "sim/store_named.h"

namespace ddpcheck::sim {

using core::Status;

namespace {

// One TCP device (one epoll thread) per hostname shared by every rank of this process; gloo devices may
// serve many contexts. Kept while some communicator holds it.
std::shared_ptr<gloo::transport::Device> TcpDevice(const std::string& hostname) {
  static std::mutex mu;
  static std::map<std::string, std::weak_ptr<gloo::transport::Device>> cached;
  std::lock_guard<std::mutex> lock(mu);
  if (auto device = cached[hostname].lock()) return device;
  gloo::transport::tcp::attr attr;
  attr.hostname = hostname;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  cached[hostname] = device;
  return device;
}

std::string GlooHost(const std::string& hostname) {
  if (!hostname.empty()) return hostname;
  const char* env = std::getenv("DDPCHECK_GLOO_HOST");
  return env && *env ? env : "127.0.0.1";
}

// Each heartbeat operation's deadline (at most the run's timeout): short, so that a rank's end, which waits
// for the heartbeat thread, is never held up long by a store that has stopped answering.
constexpr std::chrono::milliseconds kHeartbeatDeadline(1000);

std::string JoinedKey(const std::string& run_id, int rank) { return run_id + "/joined/" + std::to_string(rank); }

// What the thread connecting gloo's full mesh shares with the rank that waits for it.
struct MeshConnect {
  std::shared_ptr<gloo::rendezvous::Context> context;
  std::shared_ptr<gloo::transport::Device> device;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

}  // namespace

Status GlooCommunicator::Create(std::shared_ptr<gloo::rendezvous::Store> store, const std::string& run_id, int rank,
                                int world, std::chrono::milliseconds timeout, std::unique_ptr<GlooCommunicator>* out,
                                const std::string& hostname, GlooTransport transport) {
  // A peer that dies closes its sockets; gloo's next write must fail with EPIPE (reported as a status naming
  // the rank), not kill this process with SIGPIPE.
  static const bool kSigpipeIgnored = [] {
    std::signal(SIGPIPE, SIG_IGN);
    return true;
  }();
  (void)kSigpipeIgnored;
  const std::string where = "gloo rendezvous of run '" + run_id + "' on rank " + std::to_string(rank) + " of " +
                            std::to_string(world);
  if (!store) return Status::Invalid(where + ": no store");
  if (world < 1 || rank < 0 || rank >= world) return Status::Invalid(where + ": need 0 <= rank < world");
  if (run_id.empty()) return Status::Invalid(where + ": empty run id");
  if (timeout.count() <= 0) return Status::Invalid(where + ": timeout must be > 0 ms");

  auto recorder = std::make_shared<StoreFlightRecorder>(store, run_id, world);
  auto peers = std::make_shared<PeerWatch>(store, run_id, rank, world);
  try {
    // Gloo's own stores refuse a second set() of the key (caught below); ours would replace it.
    if (dynamic_cast<OverwritableStore*>(store.get()) && StoreHas(*store, JoinedKey(run_id, rank))) {
      return Status::Invalid(where + ": this store already has rank " + std::to_string(rank) +
                             " of this run id; use a fresh run id for every run");
    }
    peers->Publish();  // before joining: every rank that joined can be watched
    store->set(JoinedKey(run_id, rank), {'1'});
    recorder->Record(rank, CollectiveRecord{});  // "#0 rendezvous"
  } catch (const StoreFailure& e) {
    return Status::Io(where + ": " + e.what());
  } catch (const std::exception& e) {
    return Status::Invalid(where + ": cannot register in the store; if this run id was used on it before, use "
                           "a fresh run id for every run: --run-id or DDPCHECK_RUN_ID (torchrun: a new --rdzv-id; "
                           "Slurm: a new job or step) (" + GlooErrorText(e.what()) + ")");
  }

  std::vector<std::string> keys;
  for (int r = 0; r < world; ++r) keys.push_back(JoinedKey(run_id, r));
  try {
    store->wait(keys, timeout);
  } catch (const StoreFailure& e) {
    return Status::Io(where + ": " + e.what());
  } catch (const std::exception& e) {
    std::vector<int> missing;
    for (int r = 0; r < world; ++r) {
      if (!StoreHas(*store, keys[static_cast<size_t>(r)])) missing.push_back(r);
    }
    if (!missing.empty()) {
      return Status::Timeout(where + " timed out after " + std::to_string(timeout.count()) + " ms: " +
                             RankList(missing) + " never joined (" + std::to_string(world - static_cast<int>(missing.size())) +
                             " of " + std::to_string(world) + " joined)");
    }
    // Everyone joined just as the wait gave up: go on.
  }

  try {
    auto mesh = std::make_shared<MeshConnect>();
    mesh->context = std::make_shared<gloo::rendezvous::Context>(rank, world);
    mesh->context->setTimeout(timeout);
    mesh->device = transport == GlooTransport::kInProcess ? InProcessGlooDevice() : TcpDevice(GlooHost(hostname));
    // Every rank joined, so every peer's process key is in the store: learn them now, and the watch below
    // checks the peers' processes without touching the store (which the connecting thread is using). Peers on
    // another host are watched through their heartbeats (sim/peer_watch.h), on a line of their own to the store;
    // the heartbeat ends with the communicator, or below when this rank gives up.
    peers->Lost();
    peers->StartHeartbeat(OpenStoreLine(store, std::min(timeout, kHeartbeatDeadline)));
    // gloo connects the pairs one after the other and waits up to the timeout for each; a rank that dies
    // after publishing its address would be named only when those waits run out, one after another (~10 s
    // at --timeout-ms 2000). The mesh is connected on its own thread while this one watches the peers: a
    // lost one ends the wait at once, and the thread (holding all it uses) is left to gloo's own timeouts.
    std::thread([mesh, store, peers, run_id, timeout] {
      try {
        PeerAwareStore aware(*store, peers, timeout);  // a rank that dies before publishing is named at once
        gloo::rendezvous::PrefixStore prefixed(run_id + "/mesh", aware);
        mesh->context->connectFullMesh(prefixed, mesh->device);
      } catch (...) {
        mesh->error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mesh->mu);
      mesh->done = true;
      mesh->cv.notify_all();
    }).detach();
    std::unique_lock<std::mutex> lock(mesh->mu);
    while (!mesh->cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return mesh->done; })) {
      lock.unlock();
      const std::string lost = DescribeLost(peers->Lost(/*read_store=*/false));
      lock.lock();
      if (!lost.empty() && !mesh->done) {
        peers->StopHeartbeat();
        return Status::Timeout(where + ": connecting the full mesh failed" + lost);
      }
    }
    if (mesh->error) std::rethrow_exception(mesh->error);
    out->reset(new GlooCommunicator(store, recorder, peers, mesh->device, mesh->context, rank, world, timeout, run_id));
    return Status::Ok();
  } catch (const StoreFailure& e) {
    peers->StopHeartbeat();
    return Status::Io(where + ": connecting the full mesh failed: " + e.what());
  } catch (const std::exception& e) {
    const std::string text = GlooErrorText(e.what());
    const std::string lost = DescribeLost(peers->Lost());
    peers->StopHeartbeat();
    const bool finding = !lost.empty() || IsGlooTimeout(text) || IsPeerGone(text);
    return Status(finding ? core::Code::kTimeout : core::Code::kInternal,
                  where + ": connecting the full mesh failed" + lost + ": " + text);
  }
}

void GlooCommunicator::FinishRun(bool wait_for_peers) {
  queue_.WaitIdle();  // this rank's last collective has run before it says it is done
  try {
    store_->set(run_id_ + "/finished/" + std::to_string(rank_), {'1'});
    if (!wait_for_peers) return;
    std::vector<std::string> keys;
    for (int r = 0; r < world_; ++r) keys.push_back(run_id_ + "/finished/" + std::to_string(r));
    PeerAwareStore aware(*store_, peers_, timeout_);  // ends early, throwing, when a peer is lost
    aware.wait(keys, timeout_);
  } catch (const std::exception&) {
    // A peer that never finished (lost, or still failing) cannot read anything more of this rank.
  }
}

}  // namespace ddpcheck::sim
