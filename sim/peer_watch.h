// PeerWatch: tells which ranks of a world of processes are lost (their process is gone, or stopped), so a
// failed collective names the rank instead of "connection reset by peer" or "every rank entered it".
//
// At rendezvous every rank publishes "<run_id>/proc/<rank>" = "<host key>\n<pid>" in the store, where the host
// key is the kernel's boot id plus the pid namespace (two containers on one machine differ). A rank on the same
// host key can be checked directly in /proc: gone (no such process, or a zombie) or stopped (state T, e.g.
// SIGSTOP). Ranks on another host (or in another pid namespace) cannot be checked this way; for them there is a
// heartbeat in the store: once every rank has joined, a rank with peers on another host starts a background
// thread that, about every HeartbeatTiming::period, replaces "<run_id>/alive/<rank>" with a counter and reads
// those peers' counters, each over a StoreLine of its own (sim/store_named.h: its own connection, every
// operation under a deadline). A peer whose counter has not advanced for HeartbeatTiming::stale (killed,
// stopped, hung, or cut off from the store) is lost: "its heartbeat '<run>/alive/2' has not advanced for 2.6 s
// (process 77 on host b07, not visible from here: killed, stopped or hung)". A rank that ends writes "ended"
// (StopHeartbeat), so its silence is never taken for a loss. Nothing of this runs in a collective's path: a
// failed collective reads what the thread last saw, in memory. A world on one host starts no thread.
// Ranks as threads (one process) never lose one another; Lost() returns nothing for them.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/store.h>

#include "sim/store_named.h"

namespace ddpcheck::sim {

struct LostRank {
  int rank = -1;
  std::string why;  // "its process 1234 is gone (killed or exited)", "its process 1234 is stopped (SIGSTOP?)"
};

struct HeartbeatTiming {
  std::chrono::milliseconds period{250};  // how often a rank replaces its key and reads its remote peers'
  std::chrono::milliseconds stale{1500};  // a remote peer whose counter did not advance for this long is lost
  // The longest a caller waits for the heartbeats' verdict on a failure: `stale` plus two rounds of reading.
  std::chrono::milliseconds verdict() const { return stale + 2 * period; }
};

class PeerWatch {
 public:
  PeerWatch(std::shared_ptr<gloo::rendezvous::Store> store, std::string run_id, int rank, int world);
  ~PeerWatch();  // StopHeartbeat()
  // Writes this rank's key. Throws what the store throws.
  void Publish();
  // The ranks other than this one whose process is gone or stopped (same host, /proc) or whose heartbeat has
  // stopped (another host), lowest first. Never throws; a peer whose key cannot be read is skipped.
  // read_store = false checks only the peers whose key an earlier call read (no store access: safe while
  // another thread uses the store). Thread-safe.
  std::vector<LostRank> Lost(bool read_store = true);

  // Starts the heartbeat thread over `line` when some peer is on another host (or its key could not be read
  // by an earlier Lost()); otherwise drops `line` and does nothing. Call once, after every rank has joined.
  // Thread-safe.
  void StartHeartbeat(std::unique_ptr<StoreLine> line, HeartbeatTiming timing = {});
  // Ends the heartbeat thread, writing "ended" first (unless the store failed just before): within about one
  // store deadline. Idempotent; also run by the destructor.
  void StopHeartbeat();
  // Whether the heartbeats may yet name a peer lost for a failure seen at `since`: true while some remote peer
  // is neither lost, nor ended, nor seen to advance after `since`. False without a heartbeat thread.
  bool HeartbeatPending(std::chrono::steady_clock::time_point since);
  // The heartbeat's timing (what StartHeartbeat got; the default when not started).
  HeartbeatTiming heartbeat_timing() const {
    std::lock_guard<std::mutex> lock(mu_);
    return timing_;
  }

 private:
  using Clock = std::chrono::steady_clock;
  // What this rank last saw of a remote peer's heartbeat.
  struct Beat {
    bool seen = false;         // read at least once (an absent key reads as "")
    std::string value;         // the counter, "" absent, "ended"
    Clock::time_point since;   // when `value` was first read (a stale counter: since then, unchanged)
    Clock::time_point read;    // the last successful read: staleness is measured up to it, never beyond
    Clock::time_point advanced;  // the peer was alive after this: the read before the latest change
  };
  // What this process has learned of each run's lost peers: a verdict of the heartbeats stays, so a later
  // PeerWatch of the same run (rank 0 gathering the trace shards) knows it at once.
  struct Verdicts {
    std::mutex mu;
    std::map<std::string, std::map<int, std::string>> by_run;  // run id -> rank -> why
  };
  static Verdicts& KnownLost();
  void HeartbeatLoop();
  // Adds to *lost the peers lost by their heartbeat (recording them in KnownLost()) and those KnownLost() has
  // for this run; mu_ held.
  void HeartbeatLost(std::vector<LostRank>* lost) const;

  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::string run_id_;
  std::string prefix_;  // "<run_id>/proc/"
  int rank_;
  int world_;
  mutable std::mutex mu_;     // guards everything below but line_ (the heartbeat thread's alone) and heartbeat_
  std::vector<long> pids_;    // per rank: the peer's pid on this host, 0 unknown, -1 elsewhere or this process
  std::vector<long> remote_pids_;          // per rank: the pid a peer on another host published, else 0
  std::vector<std::string> remote_hosts_;  // per rank: the host name a peer on another host published
  std::vector<Beat> beats_;   // per rank: what the heartbeat thread read
  bool beating_ = false;  // the heartbeat thread runs (its verdicts count)
  bool stop_ = false;
  std::condition_variable wake_;
  HeartbeatTiming timing_;
  std::unique_ptr<StoreLine> line_;
  std::thread heartbeat_;
  std::mutex stop_mu_;        // serialises StartHeartbeat and StopHeartbeat (which start and join heartbeat_)
};

// A store that delegates to `inner`, except that waits (and the waits inside get) run in slices and end early,
// throwing "rank 2 lost: its process 1234 is gone ...", when a rank that a missing key waits for is lost. Gloo's
// connectFullMesh runs over it, so a rank that dies at rendezvous is named at once, not after the timeout.
class PeerAwareStore final : public gloo::rendezvous::Store {
 public:
  PeerAwareStore(gloo::rendezvous::Store& inner, std::shared_ptr<PeerWatch> peers, std::chrono::milliseconds timeout)
      : inner_(inner), peers_(std::move(peers)), timeout_(timeout) {}
  void set(const std::string& key, const std::vector<char>& data) override { inner_.set(key, data); }
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override;

 private:
  gloo::rendezvous::Store& inner_;
  std::shared_ptr<PeerWatch> peers_;
  std::chrono::milliseconds timeout_;
};

// The process state of `pid` in /proc ('R', 'S', 'T', 'Z', ...), or 0 when there is no such process.
char ProcessState(long pid);
// "<boot id>/<pid namespace>": equal for two processes that can see each other's pids.
std::string HostKey();
// "; rank 2 lost: its process 1234 is gone (killed or exited)" for each lost rank, or "" when none.
std::string DescribeLost(const std::vector<LostRank>& lost);

}  // namespace ddpcheck::sim
