// The rank processes of one `ddpcheck launch` node: start them, watch them, end them, and the exit code.
//
// Every rank gets PR_SET_PDEATHSIG (SIGKILL), so a SIGKILLed launcher takes its ranks with it. SIGINT, SIGTERM
// and SIGHUP are forwarded to the ranks (with SIGCONT, so stopped ones get them too); ranks still there 5 s
// later are killed, all are reaped, and launch exits 128 + signal. A rank that is stopped (SIGSTOP) while every
// other rank has ended is killed and named. Once a rank has failed, the others get --kill-after-ms to end on
// their own (they fail within their collective timeout, naming it), then are killed.
// The exit code is rank 0's verdict when it is 1, 2 or 3; else 1 when a rank was lost (killed by a signal or
// stopped), else the first non-zero code, else 0: never 0 with a rank gone.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <utility>
#include <vector>

namespace ddpcheck::cli {

// One rank process of this node and what became of it.
struct Child {
  pid_t pid = -1;
  int rank = 0;
  int code = -1;      // exit code once ended (128 + signal when killed); -1 while running
  bool lost = false;  // killed by a signal, or stopped and then killed by launch
  bool stopped = false;
};

// Catches SIGINT, SIGTERM and SIGHUP for Supervise to forward.
void InstallSignalForwarding();
// Forks and execs `argv` with `env` set; "ddpcheck" means this binary. The child dies with the launcher
// (PR_SET_PDEATHSIG), also when the launcher died between fork and prctl.
pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env);
// Waits for every child (see above), printing what becomes of each on stderr.
void Supervise(std::vector<Child>& children, std::chrono::milliseconds kill_after);
// The launch's exit code (see above).
int ExitCode(const std::vector<Child>& children);

}  // namespace ddpcheck::cli
