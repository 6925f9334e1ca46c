// `ddpcheck launch --nproc W -- ddpcheck run ...`: starts this node's ranks as processes, like torchrun: each
// child gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, GROUP_WORLD_SIZE, MASTER_ADDR,
// MASTER_PORT and TORCHELASTIC_RUN_ID (so a torch script under `launch` can init_process_group("env://")), plus
// DDPCHECK_RENDEZVOUS and DDPCHECK_RUN_ID, so `ddpcheck run` takes its one-rank branch (cli/rank_env.h). On one
// node the default store is a FileStore in a fresh temporary folder, which is also the ranks' TMPDIR (removed
// afterwards, whatever happens); across nodes pass --rendezvous and --run-id (the same on every node).
//
// Faults and exit codes: cli/launch_ranks.h.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

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
#include "cli/launch_ranks.h"
#include "core/file.h"
#include "core/scenario.h"
#include "harness/run_id.h"

namespace ddpcheck::cli {
namespace {

struct LaunchArgs {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string rendezvous, run_id;
  int64_t kill_after_ms = 120000;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::vector<std::string> command;
};

// Forks a janitor that removes `dir` once the launcher is gone, however it ends (even SIGKILL): it waits for
// EOF on a pipe whose only write end the launcher holds.
void StartJanitor(const std::string& dir) {
  int fds[2];
  if (pipe(fds) != 0) return;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[1]);
    const int null = open("/dev/null", O_RDWR);
    for (int fd : {0, 1, 2}) dup2(null, fd);  // never keeps the launcher's output pipes open
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) signal(sig, SIG_IGN);
    char c;
    while (read(fds[0], &c, 1) != 0 && errno == EINTR) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the ranks die with the launcher first
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
    _exit(0);
  }
  close(fds[0]);
  if (pid > 0) fcntl(fds[1], F_SETFD, FD_CLOEXEC);  // the ranks must not hold it open
}

// A loopback port free right now, for MASTER_PORT on one node; 29500 (torchrun's default) if none.
int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 29500;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) close(fd);
  return port;
}

int Run(const LaunchArgs& a) {
  if (a.command.empty())
    return Fail("launch", core::Status::Invalid("no command: ddpcheck launch --nproc W -- ddpcheck run ..."));
  // A program that cannot run is one line before any rank starts (QA round 16: each rank printed "cannot run",
  // then the launcher one line per rank, exit 127). `ddpcheck` is this binary; a name without '/' is looked up in
  // PATH as execvp does.
  if (a.command[0] != "ddpcheck") {
    const std::string& prog = a.command[0];
    const bool found = prog.find('/') != std::string::npos
                           ? core::IsExecutable(prog)
                           : !core::FindInPath(prog, "/usr/local/bin:/usr/bin:/bin").empty();
    if (!found) {
      return Fail("launch", core::Status::Invalid(prog + ": no such program, or not executable" +
                                                  (prog.find('/') == std::string::npos ? std::string(" (looked in PATH)")
                                                                                      : std::string()) +
                                                  ": the command after -- runs on every rank"));
    }
  }
  if (a.node_rank < 0 || a.node_rank >= a.nnodes) {
    return Fail("launch", core::Status::Invalid("--node-rank " + std::to_string(a.node_rank) + " is not in [0, " +
                                                std::to_string(a.nnodes) + ")"));
  }
  if (a.nnodes > 1 && (a.rendezvous.empty() || a.run_id.empty())) {
    return Fail("launch", core::Status::Invalid("--nnodes > 1 needs --rendezvous (redis://HOST:PORT or "
                                                "file:///shared/dir) and --run-id, the same on every node"));
  }
  // One temporary folder for the whole launch, removed however it ends: the ranks' TMPDIR (what a SIGKILLed
  // rank leaves there goes with it) and, on one node without --rendezvous, the FileStore.
  std::string tmpl = (std::filesystem::temp_directory_path() / "ddpcheck-launch-XXXXXX").string();
  if (!mkdtemp(tmpl.data()))
    return Fail("launch", core::Status::Io("cannot make a temporary folder: " + std::string(strerror(errno))));
  const std::string temp_dir = tmpl;
  StartJanitor(temp_dir);
  std::error_code mkdir_ec;
  std::filesystem::create_directories(temp_dir + "/tmp", mkdir_ec);
  std::string rendezvous = a.rendezvous;
  if (rendezvous.empty()) rendezvous = "file://" + temp_dir + "/store";
  std::string run_id = a.run_id;
  if (run_id.empty()) {
    run_id = "launch-" + std::to_string(getpid()) + "-" + std::to_string(std::time(nullptr));
  }
  if (const core::Status st = harness::ClaimRunId(rendezvous, run_id, a.node_rank); !st.ok()) {
    std::error_code ec;
    std::filesystem::remove_all(temp_dir, ec);
    return Fail("launch", st);
  }
  const int world = a.nnodes * a.nproc_per_node;
  const int master_port = a.master_port > 0 ? a.master_port : (a.nnodes > 1 ? 29500 : FreePort());
  InstallSignalForwarding();
  std::vector<Child> children;
  for (int local = 0; local < a.nproc_per_node; ++local) {
    Child c;
    c.rank = a.node_rank * a.nproc_per_node + local;
    c.pid = Spawn(a.command, {{"RANK", std::to_string(c.rank)},
                              {"WORLD_SIZE", std::to_string(world)},
                              {"LOCAL_RANK", std::to_string(local)},
                              {"LOCAL_WORLD_SIZE", std::to_string(a.nproc_per_node)},
                              {"GROUP_RANK", std::to_string(a.node_rank)},
                              {"GROUP_WORLD_SIZE", std::to_string(a.nnodes)},
                              {"MASTER_ADDR", a.master_addr},
                              {"MASTER_PORT", std::to_string(master_port)},
                              {"TORCHELASTIC_RUN_ID", run_id},
                              {"TMPDIR", temp_dir + "/tmp"},
                              {"DDPCHECK_RENDEZVOUS", rendezvous},
                              {"DDPCHECK_RUN_ID", run_id}});
    if (c.pid < 0) {
      ErrLine("ddpcheck launch: cannot fork rank " + std::to_string(c.rank) + ": " + std::string(strerror(errno)) +
              "\n");
      c.code = 127;
    }
    children.push_back(c);
  }
  Supervise(children, std::chrono::milliseconds(a.kill_after_ms));
  std::error_code ec;
  std::filesystem::remove_all(temp_dir, ec);
  return ExitCode(children);
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
      ->check(CLI::Range(int64_t{1}, core::kMaxTimeoutMs));
  sub->add_option("--master-addr", args->master_addr,
                  "MASTER_ADDR given to the ranks, for torch scripts under launch (default 127.0.0.1)");
  sub->add_option("--master-port", args->master_port,
                  "MASTER_PORT given to the ranks (default: a free port on one node, 29500 across nodes)")
      ->check(CLI::Range(1, 65535));
  sub->add_option("command", args->command, "The command each rank runs, after --")->required();
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("launch", Setup);

}  // namespace
}  // namespace ddpcheck::cli
