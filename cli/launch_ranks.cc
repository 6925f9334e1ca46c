#include "cli/launch_ranks.h"

#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

#include "cli/command.h"

namespace ddpcheck::cli {

namespace {
std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }
}  // namespace

void InstallSignalForwarding() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, OnSignal);
}

pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env) {
  const pid_t launcher = getpid();
  pid_t pid = fork();
  if (pid != 0) return pid;
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != launcher) _exit(128 + SIGKILL);
  signal(SIGINT, SIG_DFL);
  signal(SIGTERM, SIG_DFL);
  signal(SIGHUP, SIG_DFL);
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  if (argv[0] == "ddpcheck")
    execv("/proc/self/exe", args.data());
  else
    execvp(args[0], args.data());
  ErrLine("ddpcheck launch: cannot run " + std::string(argv[0]) + ": " + std::string(std::strerror(errno)) + "\n");
  _exit(127);
}

namespace {
// Reaps `c` if it ended or changed state; returns true when it just ended.
bool Poll(Child& c) {
  int status = 0;
  if (c.code != -1 || waitpid(c.pid, &status, WNOHANG | WUNTRACED | WCONTINUED) != c.pid) return false;
  if (WIFSTOPPED(status)) {
    c.stopped = true;
    ErrLine("ddpcheck launch: rank " + std::to_string(c.rank) + " stopped by signal " +
            std::to_string(WSTOPSIG(status)) + " (" + std::string(strsignal(WSTOPSIG(status))) + ")\n");
    return false;
  }
  if (WIFCONTINUED(status)) {
    c.stopped = false;
    return false;
  }
  c.stopped = false;
  if (WIFSIGNALED(status)) {
    c.code = 128 + WTERMSIG(status);
    c.lost = c.lost || g_signal == 0;  // not a signal launch forwarded
    ErrLine("ddpcheck launch: rank " + std::to_string(c.rank) + std::string(c.lost ? " lost: killed" : " ended") +
            " by signal " + std::to_string(WTERMSIG(status)) + " (" + std::string(strsignal(WTERMSIG(status))) +
            "), exit code " + std::to_string(c.code) + "\n");
  } else {
    c.code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (c.code != 0)
      ErrLine("ddpcheck launch: rank " + std::to_string(c.rank) + " exited with code " + std::to_string(c.code) + "\n");
  }
  return true;
}

}  // namespace

void Supervise(std::vector<Child>& children, std::chrono::milliseconds kill_after) {
  using Clock = std::chrono::steady_clock;
  size_t running = children.size();
  Clock::time_point deadline = Clock::time_point::max();
  bool forwarded = false, killed = false;
  while (running > 0) {
    for (Child& c : children) {
      if (!Poll(c)) continue;
      --running;
      if (c.code != 0 && deadline == Clock::time_point::max()) deadline = Clock::now() + kill_after;
    }
    if (running == 0) break;
    if (g_signal != 0 && !forwarded) {
      forwarded = true;
      ErrLine("ddpcheck launch: got signal " + std::to_string(g_signal) + " (" + std::string(strsignal(g_signal)) +
              "): forwarding it to the ranks\n");
      for (Child& c : children) {
        if (c.code != -1) continue;
        kill(c.pid, g_signal);
        kill(c.pid, SIGCONT);
      }
      deadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
    }
    size_t stopped = 0;
    for (const Child& c : children) stopped += (c.code == -1 && c.stopped) ? 1 : 0;
    const bool late = Clock::now() > deadline;
    if ((late && !killed) || stopped == running) {
      killed = killed || late;
      for (Child& c : children) {
        if (c.code != -1 || (c.lost && !late) || (!late && !c.stopped)) continue;
        ErrLine("ddpcheck launch: rank " + std::to_string(c.rank) +
                std::string(c.stopped ? " is stopped while every other rank has ended" : " still running") +
                "; killing it\n");
        c.lost = true;
        kill(c.pid, SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int ExitCode(const std::vector<Child>& children) {
  if (g_signal != 0) return 128 + g_signal;
  for (const Child& c : children) {
    if (c.rank == 0 && c.code >= 1 && c.code <= 3) return c.code;
  }
  std::string lost;
  for (const Child& c : children) {
    if (c.lost) lost += (lost.empty() ? "" : ", ") + std::to_string(c.rank);
  }
  if (!lost.empty()) {
    ErrLine("ddpcheck launch: FAIL: rank(s) " + std::string(lost) +
            " lost (killed or stopped): the world did not finish\n");
    return 1;
  }
  for (const Child& c : children) {
    if (c.code != 0) return c.code;
  }
  return 0;
}

}  // namespace ddpcheck::cli
