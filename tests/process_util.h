// Helpers for tests that start real processes: free ports, a real redis-server, the ddpcheck binary in the
// background with its output in files, and the processes of one run found by their unique run id.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace ddpcheck::testing {

// A free loopback TCP port (bound, read, released).
int FreeLoopbackPort();

// redis-server on 127.0.0.1:<free port>, no persistence; killed by the destructor. url() is empty when it
// could not be started (no redis-server: the test skips).
class RedisServer {
 public:
  RedisServer();
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;
  const std::string& url() const { return url_; }
  pid_t pid() const { return pid_; }

 private:
  int port_ = 0;
  pid_t pid_ = -1;
  std::string url_;
};

// The ddpcheck binary run with `args` in the background (through `sh -c 'exec ...'`, so pid() is ddpcheck's),
// with `env` ("K=V ...") in front, stdout and stderr in files. The destructor SIGKILLs it if still running.
// `wrapper` is a command that runs the binary (e.g. "unshare --pid --kill-child --mount-proc"); pid() is then
// the wrapper's.
class Background {
 public:
  Background(const std::string& env, const std::string& args, const std::string& out, const std::string& err,
             const std::string& wrapper = "");
  ~Background();
  Background(const Background&) = delete;
  Background& operator=(const Background&) = delete;
  pid_t pid() const { return pid_; }
  // Waits up to `limit` for the exit; the exit code (128 + signal when killed), or -1 when still running.
  int Wait(std::chrono::milliseconds limit);
  // Seconds from the start to the exit seen by Wait.
  double seconds() const { return seconds_; }

 private:
  pid_t pid_ = -1;
  std::chrono::steady_clock::time_point start_;
  double seconds_ = 0;
};

// Live (not zombie) processes whose environment has DDPCHECK_RUN_ID=<run_id> (and RANK=<rank> when rank >= 0).
std::vector<pid_t> RunProcesses(const std::string& run_id, int rank = -1);
// Polls RunProcesses(run_id, rank) until it is non-empty; its first pid, or -1 after `limit`.
pid_t WaitForRank(const std::string& run_id, int rank, std::chrono::milliseconds limit);
// Polls until no process of `run_id` is alive; true when none is left within `limit`.
bool NoneLeft(const std::string& run_id, std::chrono::milliseconds limit);

// The line of `err` that rank `rank`'s `ddpcheck run` printed ("ddpcheck run: ... rank R of W (..."), or "".
std::string RankLine(const std::string& err, int rank);

}  // namespace ddpcheck::testing
