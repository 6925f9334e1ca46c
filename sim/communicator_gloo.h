// GlooCommunicator: core::Communicator over real Gloo, one per rank: TCP on 127.0.0.1 (or a chosen address), or,
// for ranks that are threads of one process, Gloo's messages copied from buffer to buffer (sim/gloo_inproc.h).
//
// Rendezvous goes through a gloo::rendezvous::Store: one shared sim::MemoryStore (or gloo HashStore) for
// ranks as threads, a FileStore(dir) per process for ranks as processes. All keys live under "<run_id>/",
// so several runs can share one store. Collectives are the ones PyTorch's ProcessGroupGloo uses:
// gloo::allreduce (ring, gloo::sum; see core/gloo_ring.h for its summation order), gloo::broadcast,
// gloo::allgather, gloo::barrier, each with this communicator's timeout, with one exception for speed: an
// all-reduce small enough (SetDirectAllReduceBytes) travels as one round of direct point-to-point messages
// over the same Gloo pairs and is summed locally in the ring's order, which gives gloo::allreduce's bits
// (tests/communicator_ring_test.cc) with one network round instead of 2(W-1) dependent ones.
//
// Before each collective the rank writes a flight-recorder record to the store, and (by default) the ranks
// exchange a fingerprint of the collective (in the same round as a direct all-reduce's data), so a rank that
// never arrives is reported as a Status::Timeout naming it and what it entered last, and ranks that enter
// different collectives get a Status::Mismatch naming both, instead of a hang or garbage. After a timeout or
// peer failure the Gloo context is unusable: every later call returns the same error code, saying so. Not
// thread-safe: one thread per rank. An all-reduce too large for the direct exchange, started with
// StartAllReduceSum, runs on the rank's collective thread (CollectiveQueue) while the rank goes on; every
// other call waits for it first, so the ranks' collectives keep their order.
#pragma once

#include <array>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/communicator.h"
#include "sim/collective_queue.h"
#include "sim/communicator_fingerprint.h"
#include "sim/flight_recorder.h"
#include "sim/peer_watch.h"

namespace gloo {
class Context;
namespace transport {
class Device;
class UnboundBuffer;
}
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace ddpcheck::sim {

// How the ranks' Gloo pairs carry their messages. Either way Gloo's own collectives run on top, unchanged.
enum class GlooTransport {
  kTcp,        // Gloo's TCP transport: ranks in any processes, on any hosts
  kInProcess,  // sim/gloo_inproc.h: every rank a thread of this process; one copy per message, no sockets
};

class GlooCommunicator final : public core::Communicator {
 public:
  // Joins run `run_id` as `rank` of `world` and connects the full mesh. Every rank of the run must call it
  // with the same store contents, run_id and world. Fails with Timeout naming the ranks that never joined
  // when they have not all joined within `timeout` (the mesh connection is bounded by gloo's connect
  // timeout too), Invalid for bad arguments or a run_id already used on this store, Internal for other
  // Gloo errors. Ranks in one process share one TCP device (one event-loop thread) per `hostname`: the
  // address the device binds and advertises to peers; "" means $DDPCHECK_GLOO_HOST, else 127.0.0.1.
  // kInProcess: every rank of the run must be a thread of this process (a peer in another process is refused
  // when the mesh connects); `hostname` is not used.
  static core::Status Create(std::shared_ptr<gloo::rendezvous::Store> store, const std::string& run_id, int rank,
                             int world, std::chrono::milliseconds timeout, std::unique_ptr<GlooCommunicator>* out,
                             const std::string& hostname = "", GlooTransport transport = GlooTransport::kTcp);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world() const override { return world_; }
  // float32, float64, int32, int64. numel 0 is a collective with no data (still recorded and checked).
  core::Status AllReduceSum(core::Span buf, const std::string& what) override;
  core::Status Broadcast(core::Span buf, int root, const std::string& what) override;
  core::Status AllGather(core::ConstSpan in, core::Span out, const std::string& what) override;
  core::Status Barrier(const std::string& what) override;
  core::Status StartAllReduceSum(core::Span buf, const std::string& what) override;
  core::Status WaitPending() override;

  // The end of this rank's run, before the communicator closes: marks it in the store and, with
  // wait_for_peers (a rank that ran to its end), waits up to the timeout, ending early when a peer is lost,
  // until every rank has marked its end. Gloo resets a pair's connection when it closes, which would discard
  // what a slower rank has not yet read of the last collective. Never fails: the run's collectives are over.
  void FinishRun(bool wait_for_peers);

  void SetTimeout(std::chrono::milliseconds timeout) override {
    queue_.WaitIdle();  // the started all-reduces keep the timeout they started with; a failure stays for WaitPending
    timeout_ = timeout;
  }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  std::string name() const override { return "gloo"; }

  // Allgather a 48-byte fingerprint before each collective and return Mismatch when ranks disagree.
  // Default on; every rank of a run must use the same setting.
  void SetVerifyFingerprints(bool on) { verify_fingerprints_ = on; }
  // Write a flight-recorder record before each collective. Default on; off only to measure its cost
  // (timeouts then cannot name what the missing ranks entered).
  void SetFlightRecorder(bool on) { record_ = on; }
  // All-reduces of at most this many bytes per rank (capped so the staging memory stays within 1 MiB per rank:
  // 256 KiB at W <= 4, about 16 KiB at W = 64) travel with the fingerprint in one round of direct messages (every
  // rank sends its buffer to every other) and are summed here in the ring's order (core/gloo_ring.h):
  // the same bits as gloo::allreduce's ring, in one network round instead of 2(W-1) dependent ones. Larger
  // ones run gloo::allreduce. 0 sends every all-reduce through gloo::allreduce. Every rank of a run must use
  // the same value.
  void SetDirectAllReduceBytes(int64_t bytes) { direct_allreduce_bytes_ = bytes; }
  static constexpr int64_t kDefaultDirectAllReduceBytes = 256 * 1024;
  // Collectives issued so far (the sequence number of the last one); started all-reduces count once they run:
  // read it after WaitPending.
  int64_t sequence() const { return seq_; }

 private:
  GlooCommunicator(std::shared_ptr<gloo::rendezvous::Store> store, std::shared_ptr<FlightRecorder> recorder,
                   std::shared_ptr<PeerWatch> peers, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::Context> context, int rank, int world, std::chrono::milliseconds timeout,
                   std::string run_id);
  // A direct all-reduce's buffer: sent with the fingerprint; `finish` gets every rank's copy, indexed by rank.
  struct DirectPayload {
    const void* data;
    size_t bytes;
    std::function<void(const std::vector<const void*>&)> finish;
  };
  // Records, exchanges fingerprints (with `direct`'s payload) and verifies them, then runs `body` (the Gloo
  // calls); turns every exception into a Status.
  // The all-reduce itself, on the calling thread (AllReduceSum waits for the started ones first).
  core::Status AllReduceSumNow(core::Span buf, const std::string& what);
  core::Status Run(CollectiveRecord record, const std::function<void()>& body, const DirectPayload* direct = nullptr);
  // A direct exchange's message size at most: the fingerprint and up to ~1 MiB / W of payload (the same on
  // every rank, so every rank posts receives of this size).
  size_t DirectBlock() const;
  // Whether an all-reduce of `bytes` per rank takes the direct exchange.
  bool FitsDirect(int64_t bytes) const;
  // Posts this rank's receives for the next direct exchange, one per peer.
  void PostDirectReceives();
  // One round of messages from every rank to every other: `mine` followed by `bytes` of payload.
  void DirectExchange(const Fingerprint& mine, const void* payload, size_t bytes);
  // Rank r's message of the last DirectExchange: its fingerprint, and a pointer to its payload.
  const uint8_t* Received(int rank, Fingerprint* fingerprint) const;
  // Explains a failed collective. A rank is only called missing once the collective's timeout has passed
  // since `start`: a peer's failure can end the collective early while slow ranks are still on their way.
  // A rank whose process is gone or stopped (PeerWatch) is named at once as lost: "rank 2 lost during
  // collective #40 allreduce 'allreduce bucket 1 (step 5)' (seen from rank 0): its process 1234 is gone".
  // Lost, missing, or a broken connection is a Timeout (a finding); only anything else is Internal.
  core::Status Failure(const CollectiveRecord& record, std::chrono::steady_clock::time_point start,
                       const std::string& cause);

  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::shared_ptr<FlightRecorder> recorder_;
  std::shared_ptr<PeerWatch> peers_;
  // The TCP device (event loop) shared by the ranks of this process. Held here, declared before context_ so it
  // goes after it: a context's pairs unregister from the device's loop as they close, and without this
  // reference another rank's teardown could drop the device's last reference in the middle of that.
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  int rank_;
  int world_;
  std::chrono::milliseconds timeout_;
  std::string run_id_;  // the keys of FinishRun
  int64_t seq_ = 0;
  int64_t direct_allreduce_bytes_ = kDefaultDirectAllReduceBytes;
  // Direct exchanges: W blocks of DirectBlock() bytes receiving rank r's message at block r (receives for
  // the next exchange stay posted between collectives), and this rank's outgoing message.
  // Two receive sides alternate (see PostDirectReceives); current_ is the one the next exchange uses.
  std::array<std::vector<uint8_t>, 2> incoming_;
  std::vector<uint8_t> outgoing_;
  std::array<std::unique_ptr<gloo::transport::UnboundBuffer>, 2> recv_buffers_;
  std::unique_ptr<gloo::transport::UnboundBuffer> send_buffer_;
  int current_ = 0;
  std::exception_ptr post_failure_;  // posting the next exchange's receives failed: raised by that exchange
  bool verify_fingerprints_ = true;
  bool record_ = true;
  core::Status broken_;  // the first failure; OK while usable
  // The started all-reduces. The destructor waits for them before it closes anything they use.
  CollectiveQueue queue_;
};

}  // namespace ddpcheck::sim
