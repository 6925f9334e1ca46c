#include "sim/peer_watch.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
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
      prefix_(std::move(run_id) + "/proc/"),
      rank_(rank),
      world_(world),
      pids_(static_cast<size_t>(world), 0) {}

void PeerWatch::Publish() {
  const std::string value = HostKey() + "\n" + std::to_string(getpid());
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
      std::string host;
      long value = 0;
      if (!std::getline(in, host) || !(in >> value) || value <= 0) continue;
      pid = (host != here || value == static_cast<long>(getpid())) ? -1 : value;
      std::lock_guard<std::mutex> lock(mu_);
      pids_[static_cast<size_t>(r)] = pid;
    }
    if (pid <= 0) continue;
    const char state = ProcessState(pid);
    const std::string p = "its process " + std::to_string(pid);
    if (state == 0 || state == 'Z' || state == 'X') {
      lost.push_back({r, p + " is gone (killed or exited)"});
    } else if (state == 'T' || state == 't') {
      lost.push_back({r, p + " is stopped (SIGSTOP or a debugger)"});
    }
  }
  return lost;
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
