// PeerWatch: tells which ranks of a world of processes are lost (their process is gone, or stopped), so a
// failed collective names the rank instead of "connection reset by peer" or "every rank entered it".
//
// At rendezvous every rank publishes "<run_id>/proc/<rank>" = "<host key>\n<pid>" in the store, where the host
// key is the kernel's boot id plus the pid namespace (two containers on one machine differ). A rank on the same
// host key can be checked directly in /proc: gone (no such process, or a zombie) or stopped (state T, e.g.
// SIGSTOP). Ranks on another host cannot be checked this way: they are never reported lost by PeerWatch.
// Ranks as threads (one process) never lose one another; Lost() returns nothing for them.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <gloo/rendezvous/store.h>

namespace ddpcheck::sim {

struct LostRank {
  int rank = -1;
  std::string why;  // "its process 1234 is gone (killed or exited)", "its process 1234 is stopped (SIGSTOP?)"
};

class PeerWatch {
 public:
  PeerWatch(std::shared_ptr<gloo::rendezvous::Store> store, std::string run_id, int rank, int world);
  // Writes this rank's key. Throws what the store throws.
  void Publish();
  // The ranks other than this one whose process is gone or stopped, lowest first. Never throws; a peer whose
  // key cannot be read is skipped. read_store = false checks only the peers whose key an earlier call read
  // (no store access: safe while another thread uses the store). Thread-safe.
  std::vector<LostRank> Lost(bool read_store = true);

 private:
  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::string prefix_;  // "<run_id>/proc/"
  int rank_;
  int world_;
  std::mutex mu_;            // guards pids_
  std::vector<long> pids_;  // per rank: the peer's pid on this host, 0 unknown, -1 elsewhere or this process
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
