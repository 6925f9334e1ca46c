#include "tests/process_util.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <sstream>
#include <thread>

#include "sim/peer_watch.h"
#include "sim/store_open.h"
#include "tests/test_util.h"

namespace ddpcheck::testing {

int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

RedisServer::RedisServer() {
  if (std::system("command -v redis-server >/dev/null 2>&1") != 0) return;
  port_ = FreeLoopbackPort();
  pid_ = fork();
  if (pid_ == 0) {
    const std::string port = std::to_string(port_);
    execlp("redis-server", "redis-server", "--port", port.c_str(), "--bind", "127.0.0.1", "--save", "",
           "--appendonly", "no", "--loglevel", "warning", static_cast<char*>(nullptr));
    _exit(127);
  }
  const std::string url = "redis://127.0.0.1:" + std::to_string(port_);
  for (int i = 0; i < 100; ++i) {
    std::shared_ptr<gloo::rendezvous::Store> store;
    if (sim::OpenStore(url, std::chrono::milliseconds(100), &store).ok()) {
      url_ = url;
      return;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

RedisServer::~RedisServer() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

Background::Background(const std::string& env, const std::string& args, const std::string& out,
                       const std::string& err, const std::string& wrapper)
    : start_(std::chrono::steady_clock::now()) {
  const std::string cmd =
      "exec env " + env + " " + wrapper + " '" + BinaryPath() + "' " + args + " >'" + out + "' 2>'" + err + "'";
  pid_ = fork();
  if (pid_ == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
}

Background::~Background() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

int Background::Wait(std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    int status = 0;
    if (pid_ > 0 && waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

std::vector<pid_t> RunProcesses(const std::string& run_id, int rank) {
  std::vector<pid_t> out;
  const std::string want_id = "DDPCHECK_RUN_ID=" + run_id;
  const std::string want_rank = "RANK=" + std::to_string(rank);
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc", ec)) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::ifstream in(entry.path() / "environ", std::ios::binary);
    const std::string env((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    bool id = false, r = rank < 0;
    for (size_t pos = 0; pos < env.size();) {
      const size_t end = env.find('\0', pos);
      const std::string var = env.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
      id = id || var == want_id;
      r = r || var == want_rank;
      if (end == std::string::npos) break;
      pos = end + 1;
    }
    const pid_t pid = static_cast<pid_t>(std::stol(name));
    const char state = sim::ProcessState(pid);
    if (id && r && state != 0 && state != 'Z' && state != 'X') out.push_back(pid);
  }
  return out;
}

pid_t WaitForRank(const std::string& run_id, int rank, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    const auto pids = RunProcesses(run_id, rank);
    if (!pids.empty()) return pids.front();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

std::string RankLine(const std::string& err, int rank) {
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) {
    if (line.find("ddpcheck run:") == 0 && line.find(": rank " + std::to_string(rank) + " of ") != std::string::npos)
      return line;
  }
  return "";
}

bool NoneLeft(const std::string& run_id, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (RunProcesses(run_id).empty()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return RunProcesses(run_id).empty();
}

}  // namespace ddpcheck::testing
