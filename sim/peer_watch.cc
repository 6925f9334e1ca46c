#include "sim/peer_watch.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <utility>

#include <gloo/common/error.h>
#include <gloo/rendezvous/store.h>

#include "sim/store.h"

namespace ddpcheck::sim {

char ProcessState(long pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!in || !std::getline(in, stat)) return 0;
  const size_t close = stat.rfind(')');  // "pid (comm) S ...": comm may hold spaces and parentheses
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

std::string HostKey() {
  std::string boot;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot);
  std::error_code ec;
  const auto ns = std::filesystem::read_symlink("/proc/self/ns/pid", ec);
  return boot + "/" + (ec ? std::string("?") : ns.string());
}

PeerWatch::PeerWatch(std::shared_ptr<gloo::rendezvous::Store> store, std::string run_id, int rank, int world)
    : store_(std::move(store)),
      run_id_(std::move(run_id)),
      prefix_(run_id_ + "/proc/"),
      rank_(rank),
      world_(world),
      pids_(static_cast<size_t>(world), 0),
      remote_pids_(static_cast<size_t>(world), 0),
      remote_hosts_(static_cast<size_t>(world)),
      beats_(static_cast<size_t>(world)) {}

PeerWatch::~PeerWatch() { StopHeartbeat(); }

namespace {

std::string HostName() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "?";
  return name;
}

std::string Seconds(std::chrono::steady_clock::duration d) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f s", std::chrono::duration<double>(d).count());
  return text;
}

constexpr char kEnded[] = "ended";

}  // namespace

void PeerWatch::Publish() {
  // "<host key>\n<pid>\n<host name>": the name is only for messages about a peer on another host.
  const std::string value = HostKey() + "\n" + std::to_string(getpid()) + "\n" + HostName();
  store_->set(prefix_ + std::to_string(rank_), std::vector<char>(value.begin(), value.end()));
}

std::vector<LostRank> PeerWatch::Lost(bool read_store) {
  std::vector<LostRank> lost;
  const std::string here = read_store ? HostKey() : std::string();
  for (int r = 0; r < world_; ++r) {
    long pid;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pid = pids_[static_cast<size_t>(r)];
    }
    if (pid == 0) {
      if (!read_store) continue;
      std::vector<char> bytes;
      try {
        if (!StoreTryGet(*store_, prefix_ + std::to_string(r), &bytes)) continue;
      } catch (const std::exception&) {
        continue;
      }
      std::istringstream in(std::string(bytes.begin(), bytes.end()));
      std::string host, name;
      long value = 0;
      if (!std::getline(in, host) || !(in >> value) || value <= 0) continue;
      in >> name;  // absent in keys of older versions
      const bool remote = host != here;
      pid = (remote || value == static_cast<long>(getpid())) ? -1 : value;
      std::lock_guard<std::mutex> lock(mu_);
      pids_[static_cast<size_t>(r)] = pid;
      if (remote) {
        remote_pids_[static_cast<size_t>(r)] = value;
        remote_hosts_[static_cast<size_t>(r)] = name.empty() ? "?" : name;
      }
    }
    if (pid <= 0) continue;
    const char state = ProcessState(pid);
    const std::string p = "its process " + std::to_string(pid);
    if (state == 0 || state == 'Z' || state == 'X') {
      std::lock_guard<std::mutex> lock(mu_);
      if (beats_[static_cast<size_t>(r)].value == kEnded) continue;  // it ended its run, then exited
      lost.push_back({r, p + " is gone (killed or exited)"});
    } else if (state == 'T' || state == 't') {
      lost.push_back({r, p + " is stopped (SIGSTOP or a debugger)"});
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  HeartbeatLost(&lost);
  std::sort(lost.begin(), lost.end(), [](const LostRank& a, const LostRank& b) { return a.rank < b.rank; });
  return lost;
}

PeerWatch::Verdicts& PeerWatch::KnownLost() {
  static Verdicts* verdicts = new Verdicts;  // never destroyed: a rank's threads may still ask at exit
  return *verdicts;
}

void PeerWatch::StartHeartbeat(std::unique_ptr<StoreLine> line, HeartbeatTiming timing) {
  std::lock_guard<std::mutex> serial(stop_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  if (!line || beating_ || stop_) return;
  // A peer whose key could not be read may be remote too: beat for it (it watches this rank the same way).
  bool remote = false;
  for (size_t r = 0; r < pids_.size(); ++r) remote = remote || remote_pids_[r] > 0 || pids_[r] == 0;
  if (!remote) return;
  timing_ = timing;
  line_ = std::move(line);
  beating_ = true;
  heartbeat_ = std::thread(&PeerWatch::HeartbeatLoop, this);
}

void PeerWatch::StopHeartbeat() {
  std::lock_guard<std::mutex> serial(stop_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    beating_ = false;
  }
  wake_.notify_all();
  if (heartbeat_.joinable()) heartbeat_.join();
}

void PeerWatch::HeartbeatLoop() {
  const std::string mine = run_id_ + "/alive/" + std::to_string(rank_);
  std::vector<int> peers;
  std::vector<std::string> keys;
  std::unique_lock<std::mutex> lock(mu_);
  for (int r = 0; r < world_; ++r) {
    if (r == rank_) continue;  // peers on this host too: a gone process that wrote "ended" is not lost
    peers.push_back(r);
    keys.push_back(run_id_ + "/alive/" + std::to_string(r));
  }
  const HeartbeatTiming timing = timing_;
  uint64_t count = 0;
  bool written = false;
  while (!stop_) {
    lock.unlock();
    try {
      line_->Replace(mine, std::to_string(++count));
      written = true;
    } catch (const std::exception&) {
      written = false;  // the store's failure is named by the rank's own store operations
    }
    std::vector<std::optional<std::string>> values;
    bool read = false;
    try {
      values = line_->Read(keys);
      read = true;
    } catch (const std::exception&) {
      // Unread, a peer's heartbeat does not grow stale: staleness is measured up to the last good read.
    }
    const Clock::time_point now = Clock::now();
    lock.lock();
    for (size_t i = 0; read && i < peers.size(); ++i) {
      Beat& b = beats_[static_cast<size_t>(peers[i])];
      const std::string value = values[i].value_or("");
      if (!b.seen || value != b.value) {
        if (b.seen) b.advanced = b.read;  // written after the read that still saw the old value
        b.seen = true;
        b.value = value;
        b.since = now;
      }
      b.read = now;
    }
    wake_.wait_for(lock, timing.period, [&] { return stop_; });
  }
  lock.unlock();
  if (!written) return;  // a store that just failed would only hold the end up by its deadline
  try {
    line_->Replace(mine, kEnded);
  } catch (const std::exception&) {
  }
}

void PeerWatch::HeartbeatLost(std::vector<LostRank>* lost) const {
  Verdicts& known = KnownLost();
  std::lock_guard<std::mutex> lock(known.mu);
  std::map<int, std::string>& run = known.by_run[run_id_];
  for (int r = 0; beating_ && r < world_; ++r) {
    const Beat& b = beats_[static_cast<size_t>(r)];
    const bool stale = b.seen && b.value != kEnded && b.read - b.since >= timing_.stale;
    if (remote_pids_[static_cast<size_t>(r)] <= 0 || !stale) continue;
    const std::string key = run_id_ + "/alive/" + std::to_string(r);
    const std::string where = "process " + std::to_string(remote_pids_[static_cast<size_t>(r)]) + " on host " +
                              remote_hosts_[static_cast<size_t>(r)] + ", not visible from here";
    run.emplace(r, (b.value.empty() ? "it wrote no heartbeat '" + key + "' in " + Seconds(b.read - b.since)
                                    : "its heartbeat '" + key + "' has not advanced for " + Seconds(b.read - b.since)) +
                       " (" + where + "): killed, stopped or hung");
  }
  for (const auto& [r, why] : run) {
    const int rank = r;
    if (rank == rank_ || std::any_of(lost->begin(), lost->end(), [&](const LostRank& l) { return l.rank == rank; })) {
      continue;
    }
    lost->push_back({rank, why});
  }
}

bool PeerWatch::HeartbeatPending(Clock::time_point since) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!beating_) return false;
  for (int r = 0; r < world_; ++r) {
    if (remote_pids_[static_cast<size_t>(r)] <= 0) continue;
    const Beat& b = beats_[static_cast<size_t>(r)];
    const bool settled =
        b.seen && (b.value == kEnded || b.advanced > since || b.read - b.since >= timing_.stale);
    if (!settled) return true;
  }
  return false;
}

void PeerAwareStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto until = std::chrono::steady_clock::now() + std::min(timeout, timeout_);  // PrefixStore passes 30 s
  constexpr std::chrono::milliseconds kSlice(100);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
    try {
      inner_.wait(keys, std::max(std::chrono::milliseconds(1), std::min(left, kSlice)));
      return;
    } catch (const gloo::IoException&) {
      if (left <= kSlice) throw;
    }
    const std::string lost = DescribeLost(peers_->Lost());
    if (!lost.empty()) throw gloo::IoException("gave up waiting for " + keys.front() + lost.substr(1));
  }
}

std::vector<char> PeerAwareStore::get(const std::string& key) {
  wait({key}, timeout_);
  return inner_.get(key);
}

std::string DescribeLost(const std::vector<LostRank>& lost) {
  std::string out;
  for (const LostRank& l : lost) out += "; rank " + std::to_string(l.rank) + " lost: " + l.why;
  return out;
}

}  // namespace ddpcheck::sim
