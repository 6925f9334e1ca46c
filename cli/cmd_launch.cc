// `ddpcheck launch --nproc W -- ddpcheck run ...`: starts this node's ranks as processes, like torchrun: each
// child gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK plus DDPCHECK_RENDEZVOUS and
// DDPCHECK_RUN_ID, so `ddpcheck run` takes its one-rank branch (cli/rank_env.h). On one node the default store
// is a FileStore in a fresh temporary folder (removed afterwards); across nodes pass --rendezvous and --run-id
// (the same on every node). The exit code is rank 0's (the verdict) when rank 0 runs here, else the first
// non-zero one; a rank killed by a signal counts as 128 + signal. Once a rank has failed, the others get
// --kill-after-ms to end on their own (they fail within their collective timeout, naming it), then are killed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <thread>
#include <vector>

#include "cli/command.h"

namespace ddpcheck::cli {
namespace {

struct LaunchArgs {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string rendezvous, run_id;
  int64_t kill_after_ms = 120000;
  std::vector<std::string> command;
};

std::atomic<int> g_signal{0};
void OnSignal(int sig) { g_signal = sig; }

// Forks and execs `argv` with the rank variables set; "ddpcheck" means this binary.
pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env) {
  pid_t pid = fork();
  if (pid != 0) return pid;
  for (const auto& [k, v] : env) setenv(k.c_str(), v.c_str(), 1);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  if (argv[0] == "ddpcheck")
    execv("/proc/self/exe", args.data());
  else
    execvp(args[0], args.data());
  std::cerr << "ddpcheck launch: cannot run " << argv[0] << ": " << std::strerror(errno) << "\n";
  _exit(127);
}

int CodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

int Run(const LaunchArgs& a) {
  if (a.command.empty())
    return Fail("launch", core::Status::Invalid("no command: ddpcheck launch --nproc W -- ddpcheck run ..."));
  if (a.node_rank < 0 || a.node_rank >= a.nnodes) {
    return Fail("launch", core::Status::Invalid("--node-rank " + std::to_string(a.node_rank) + " is not in [0, " +
                                                std::to_string(a.nnodes) + ")"));
  }
  if (a.nnodes > 1 && (a.rendezvous.empty() || a.run_id.empty())) {
    return Fail("launch", core::Status::Invalid("--nnodes > 1 needs --rendezvous (redis://HOST:PORT or "
                                                "file:///shared/dir) and --run-id, the same on every node"));
  }
  std::string rendezvous = a.rendezvous, temp_dir;
  if (rendezvous.empty()) {
    std::string tmpl = (std::filesystem::temp_directory_path() / "ddpcheck-launch-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) return Fail("launch", core::Status::Io("cannot make a temporary store folder"));
    temp_dir = tmpl;
    rendezvous = "file://" + temp_dir;
  }
  std::string run_id = a.run_id;
  if (run_id.empty()) {
    run_id = "launch-" + std::to_string(getpid()) + "-" + std::to_string(std::time(nullptr));
  }
  const int world = a.nnodes * a.nproc_per_node;
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  std::vector<pid_t> pids;
  std::vector<int> ranks;
  for (int local = 0; local < a.nproc_per_node; ++local) {
    const int rank = a.node_rank * a.nproc_per_node + local;
    pids.push_back(Spawn(a.command, {{"RANK", std::to_string(rank)},
                                     {"WORLD_SIZE", std::to_string(world)},
                                     {"LOCAL_RANK", std::to_string(local)},
                                     {"LOCAL_WORLD_SIZE", std::to_string(a.nproc_per_node)},
                                     {"GROUP_RANK", std::to_string(a.node_rank)},
                                     {"DDPCHECK_RENDEZVOUS", rendezvous},
                                     {"DDPCHECK_RUN_ID", run_id}}));
    ranks.push_back(rank);
  }
  std::vector<int> codes(pids.size(), -1);
  size_t running = pids.size();
  std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  bool killed = false;
  while (running > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      int status = 0;
      if (codes[i] != -1 || waitpid(pids[i], &status, WNOHANG) != pids[i]) continue;
      codes[i] = CodeOf(status);
      --running;
      if (codes[i] != 0) {
        std::cerr << "ddpcheck launch: rank " << ranks[i] << " exited with code " << codes[i] << "\n";
        if (deadline == std::chrono::steady_clock::time_point::max()) {
          deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(a.kill_after_ms);
        }
      }
    }
    const bool late = std::chrono::steady_clock::now() > deadline;
    if (running > 0 && (g_signal != 0 || late) && !killed) {
      killed = true;
      for (size_t i = 0; i < pids.size(); ++i) {
        if (codes[i] != -1) continue;
        if (late) std::cerr << "ddpcheck launch: rank " << ranks[i] << " still running; killing it\n";
        kill(pids[i], g_signal != 0 ? g_signal.load() : SIGKILL);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (!temp_dir.empty()) {
    std::error_code ec;
    std::filesystem::remove_all(temp_dir, ec);
  }
  for (size_t i = 0; i < pids.size(); ++i) {
    if (ranks[i] == 0 && codes[i] != 0) return codes[i];
  }
  for (int c : codes) {
    if (c != 0) return c;
  }
  return 0;
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "launch",
      "Start this node's ranks as processes (like torchrun) and run a command in each.\n"
      "  example: ddpcheck launch --nproc 6 -- ddpcheck run --timeout-ms 5000\n"
      "  example: ddpcheck launch --nnodes 2 --node-rank 0 --nproc-per-node 4 --rendezvous redis://10.0.0.1:6379 \\\n"
      "             --run-id job42 -- ddpcheck run --gloo-host 10.0.0.1     (see docs/multi-host.md)");
  auto args = std::make_shared<LaunchArgs>();
  sub->add_option("--nproc,--nproc-per-node", args->nproc_per_node, "Ranks (processes) on this node")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--nnodes", args->nnodes, "Nodes in the world (world = nnodes * nproc-per-node)")
      ->check(CLI::Range(1, 4096));
  sub->add_option("--node-rank", args->node_rank, "This node's index: ranks node-rank*P .. node-rank*P+P-1");
  sub->add_option(
      "--rendezvous", args->rendezvous,
      "redis://HOST:PORT or file:///shared/dir (default: a FileStore in a fresh temp folder; one node only)");
  sub->add_option("--run-id", args->run_id, "Namespace of this run's store keys (default: launch-<pid>-<time>)");
  sub->add_option("--kill-after-ms", args->kill_after_ms,
                  "After a rank fails, how long the others may take to end on their own before being killed")
      ->check(CLI::PositiveNumber);
  sub->add_option("command", args->command, "The command each rank runs, after --")->required();
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("launch", Setup);

}  // namespace
}  // namespace ddpcheck::cli
