// Run-time faults on ranks as processes (issue 17), each through the real thing: `ddpcheck launch` starting real
// rank processes over Gloo/TCP, a real redis-server on a free port, a real full tmpfs. A rank SIGKILLed or
// SIGSTOPped at rendezvous, mid-run or late; the launcher SIGKILLed or SIGTERMed; ranks of another launcher
// that dies; Redis silent, speaking garbage, killed or stopped mid-run; a reused run id; a full disk. Every case
// ends within the collective timeout + 5 s, names the lost rank or the store (with its address), leaves no
// process of its run (found by its unique run id in /proc/*/environ) and no temporary folder, and never exits
// 0 with a rank gone.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include <gloo/rendezvous/store.h>

#include "sim/peer_watch.h"
#include "sim/store.h"
#include "sim/store_named.h"
#include "sim/store_open.h"
#include "tests/process_util.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing::Background;
using testing::NoneLeft;
using testing::RankLine;
using testing::RedisServer;
using testing::TempDir;
using testing::WaitForRank;
using Clock = std::chrono::steady_clock;

constexpr int kTimeoutMs = 2000;
// The bound: timeout + 5 s. A sanitizer build (the tsan/asan presets) runs every rank several times
// slower, so there the slack is 15 s: the bound is the product's, the sanitizer checks the threads and memory.
constexpr std::chrono::milliseconds kLimit(kTimeoutMs + (testing::kSanitizerBuild ? 15000 : 5000));

std::string UniqueRunId(const std::string& what) {
  static int n = 0;
  return "rtf-" + what + "-" + std::to_string(getpid()) + "-" + std::to_string(++n);
}

// Which ranks a Launch starts: all four on one node (the default), or one node of several (`nodes`, e.g.
// "--nnodes 2 --node-rank 1 --nproc-per-node 2", joining the run `run_id` of the first node's Launch), started
// through `wrapper` (e.g. in a pid namespace of its own).
struct LaunchSpec {
  std::string nodes = "--nproc 4";
  std::string run_id;  // "": a fresh unique one
  std::string wrapper;
};

// `ddpcheck launch --nproc 4 --run-id <unique> <launch_flags> -- ddpcheck run -q --timeout-ms 2000 <run_flags>`
// in the background, with TMPDIR a private folder (so a temporary store left behind is seen).
class Launch {
 public:
  Launch(const std::string& what, const std::string& launch_flags, const std::string& run_flags,
         const LaunchSpec& spec = {})
      : run_id_(spec.run_id.empty() ? UniqueRunId(what) : spec.run_id) {
    std::filesystem::create_directories(dir_.File("tmp"));
    proc_ = std::make_unique<Background>(
        "TMPDIR=" + dir_.File("tmp"),
        "launch " + spec.nodes + " --run-id " + run_id_ + " " + launch_flags + " -- ddpcheck run -q --timeout-ms " +
            std::to_string(kTimeoutMs) + " " + run_flags,
        dir_.File("out"), dir_.File("err"), spec.wrapper);
  }
  const std::string& run_id() const { return run_id_; }
  pid_t pid() const { return proc_->pid(); }
  std::string out() const { return testing::ReadFile(dir_.File("out")); }
  std::string err() const { return testing::ReadFile(dir_.File("err")); }
  // The pid of rank `rank` once it runs (-1 after 10 s).
  pid_t Rank(int rank) const { return WaitForRank(run_id_, rank, std::chrono::seconds(10)); }

  // Waits for the launcher and checks what every case must hold: it ended within kLimit of `fault`, no process
  // of the run is left, the temporary folder is gone. Returns the exit code.
  int Finish(Clock::time_point fault) {
    const int code = proc_->Wait(kLimit + std::chrono::seconds(10));
    const double secs = std::chrono::duration<double>(Clock::now() - fault).count();
    EXPECT_NE(code, -1) << "launch still running " << secs << " s after the fault\n" << err();
    EXPECT_LT(secs, std::chrono::duration<double>(kLimit).count()) << err();
    std::printf("[ measured ] %s: launch ended %.2f s after the fault, exit %d\n", run_id_.c_str(), secs, code);
    ExpectNothingLeft();
    return code;
  }
  void ExpectNothingLeft() const {
    EXPECT_TRUE(NoneLeft(run_id_, std::chrono::seconds(3))) << "processes of run " << run_id_ << " left";
    bool empty = false;
    for (int i = 0; i < 100 && !empty; ++i) {  // the janitor removes it just after the launcher ends
      empty = std::filesystem::is_empty(dir_.File("tmp"));
      if (!empty) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    }
    EXPECT_TRUE(empty) << "a temporary folder was left in " << dir_.File("tmp");
  }

 private:
  TempDir dir_;
  std::string run_id_;
  std::unique_ptr<Background> proc_;
};

// Every survivor and the launcher name the lost rank; the verdict is a finding (1), never PASS.
void ExpectLostRankNamed(const Launch& run, int code, int lost, const std::vector<int>& survivors_naming_it) {
  const std::string err = run.err();
  EXPECT_EQ(code, 1) << err;
  EXPECT_THAT(run.out(), Not(HasSubstr("PASS")));
  EXPECT_THAT(err, HasSubstr("ddpcheck launch: rank " + std::to_string(lost) + " lost")) << err;
  EXPECT_THAT(err, Not(HasSubstr("internal error"))) << err;
  for (int r : survivors_naming_it) {
    EXPECT_THAT(RankLine(err, r), HasSubstr("rank " + std::to_string(lost) + " lost")) << "rank " << r << "\n" << err;
  }
}

TEST(RankLost, ASigkilledRankMidRunIsNamedByEverySurvivorAndTheLauncherWithinTheTimeout) {
  Launch run("kill-mid", "", "--epochs 1000 --steps 2000");
  const pid_t victim = run.Rank(2);
  ASSERT_GT(victim, 0);
  ASSERT_GT(run.Rank(0), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // well into the training steps
  ASSERT_EQ(kill(victim, SIGKILL), 0) << "rank 2 already ended\n" << run.err() << run.out();
  const int code = run.Finish(Clock::now());
  ExpectLostRankNamed(run, code, 2, {0, 1, 3});
}

// A moment in a run over Redis, told by a key the ranks write: "<run>/fr/2/<seq>" (rank 2 entering collective
// #seq; "<run>/joined/2" for seq 0; "<run>/mesh/2" for kMeshAddress: rank 2 published its Gloo pairs' addresses
// and is connecting the full mesh).
constexpr int kMeshAddress = -1000;
struct Moment {
  const char* name;
  int signal;
  int seq;  // 0: at rendezvous; > 0: collective #seq; < 0: collective #(last + 1 + seq), from a clean run
};

// The number of collectives rank 2 runs in `run_flags` over Redis, from a clean run's flight-recorder keys.
int CollectivesOfACleanRun(const RedisServer& redis, const std::string& run_flags) {
  Launch clean("clean", "--rendezvous " + redis.url(), run_flags);
  EXPECT_EQ(clean.Finish(Clock::now()), 0) << clean.err();
  std::shared_ptr<gloo::rendezvous::Store> store;
  EXPECT_TRUE(sim::OpenStore(redis.url(), std::chrono::milliseconds(2000), &store).ok());
  int seq = 1;
  while (sim::StoreHas(*store, clean.run_id() + "/fr/2/" + std::to_string(seq))) ++seq;
  return seq - 1;
}

class RankLostAt : public ::testing::TestWithParam<Moment> {};

TEST_P(RankLostAt, IsNamedByTheSurvivorsAndTheLauncherWithinTheTimeout) {
  const Moment m = GetParam();
  RedisServer redis;
  if (redis.url().empty()) GTEST_SKIP() << "redis-server not installed or did not start (apt-get install redis-server)";
  const std::string flags = "--steps 30";
  int seq = m.seq;
  if (seq < 0 && seq != kMeshAddress) seq = CollectivesOfACleanRun(redis, flags) + 1 + seq;
  Launch run(m.name, "--rendezvous " + redis.url(), flags);
  const std::string key = seq == kMeshAddress ? run.run_id() + "/mesh/2"
                          : seq == 0          ? run.run_id() + "/joined/2"
                                              : run.run_id() + "/fr/2/" + std::to_string(seq);
  std::shared_ptr<gloo::rendezvous::Store> store;
  ASSERT_TRUE(sim::OpenStore(redis.url(), std::chrono::milliseconds(2000), &store).ok());
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  while (!sim::StoreHas(*store, key) && Clock::now() < give_up) {
  }
  const pid_t victim = testing::RunProcesses(run.run_id(), 2).empty() ? -1 : testing::RunProcesses(run.run_id(), 2)[0];
  ASSERT_GT(victim, 0) << "rank 2 never reached " << key << "\n" << run.err();
  ASSERT_EQ(kill(victim, m.signal), 0);
  std::printf("[ moment   ] %s at %s\n", strsignal(m.signal), key.c_str());
  const int code = run.Finish(Clock::now());
  // Rank 0 reports; the others may have ended before the loss showed (rank 2 stopped after they finished).
  ExpectLostRankNamed(run, code, 2, {0});
}

INSTANTIATE_TEST_SUITE_P(Moments, RankLostAt,
                         ::testing::Values(Moment{"KilledWhileConnectingTheMesh", SIGKILL, kMeshAddress},
                                           Moment{"StoppedWhileConnectingTheMesh", SIGSTOP, kMeshAddress},
                                           Moment{"KilledAtItsFirstCollective", SIGKILL, 1},
                                           Moment{"KilledMidRun", SIGKILL, 60},
                                           Moment{"StoppedMidRun", SIGSTOP, 60},
                                           Moment{"KilledInItsLastCollectives", SIGKILL, -2},
                                           Moment{"StoppedInItsLastCollectives", SIGSTOP, -2}),
                         [](const auto& p) { return std::string(p.param.name); });

// Another host, on this machine: node 1 of a two-node launch runs in a pid namespace of its own, so no rank of
// one node can see a process of the other in /proc, which is what a rank on another machine is to PeerWatch
// (its host key, boot id + pid namespace, differs). Ranks 0 and 1 (node 0) can then tell that rank 2 (node 1)
// is lost only by its heartbeat in the store; rank 3, beside it, sees its process; node 1's launcher reaps it.
constexpr char kOtherHost[] = "unshare --pid --kill-child --mount-proc";

bool CanMakePidNamespaces() {
  return std::system((std::string(kOtherHost) + " true >/dev/null 2>&1").c_str()) == 0;
}

struct RemoteFault {
  const char* name;
  int signal;
  bool redis;  // else a FileStore in a folder both nodes see
};

class RemoteRankLost : public ::testing::TestWithParam<RemoteFault> {};

TEST_P(RemoteRankLost, IsNamedByItsHeartbeatOnEverySurvivorWithinTheTimeout) {
  const RemoteFault f = GetParam();
  if (!CanMakePidNamespaces()) GTEST_SKIP() << "cannot make a pid namespace here (`" << kOtherHost << "` needs root)";
  RedisServer redis;
  TempDir shared;
  if (f.redis && redis.url().empty()) GTEST_SKIP() << "redis-server not installed or did not start";
  const std::string url = f.redis ? redis.url() : "file://" + shared.File("store");
  const std::string flags = "--epochs 1000 --steps 2000";
  Launch host0(f.name, "--rendezvous " + url, flags, {"--nnodes 2 --node-rank 0 --nproc-per-node 2", "", ""});
  Launch host1(f.name, "--rendezvous " + url, flags,
               {"--nnodes 2 --node-rank 1 --nproc-per-node 2", host0.run_id(), kOtherHost});
  // Well into the training steps, early enough for small trace shards: rank 2 entering collective #60.
  std::shared_ptr<gloo::rendezvous::Store> store;
  ASSERT_TRUE(sim::OpenStore(url, std::chrono::milliseconds(2000), &store).ok());
  const std::string key = host0.run_id() + "/fr/2/60";
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  while (!sim::StoreHas(*store, key) && Clock::now() < give_up) {
  }
  const std::vector<pid_t> victim = testing::RunProcesses(host0.run_id(), 2);
  ASSERT_EQ(victim.size(), 1u) << "rank 2 never reached " << key << "\n" << host1.err();
  ASSERT_EQ(kill(victim[0], f.signal), 0);
  const auto fault = Clock::now();

  // When each survivor's verdict line names rank 2 (a rank prints it as it ends).
  const std::vector<std::pair<int, const Launch*>> survivors = {{0, &host0}, {1, &host0}, {3, &host1}};
  std::vector<double> named(survivors.size(), -1);
  for (size_t left = survivors.size(); left > 0 && Clock::now() < fault + kLimit + std::chrono::seconds(10);) {
    for (size_t i = 0; i < survivors.size(); ++i) {
      const std::string line = RankLine(survivors[i].second->err(), survivors[i].first);
      if (named[i] >= 0 || line.find("rank 2 lost") == std::string::npos) continue;
      named[i] = std::chrono::duration<double>(Clock::now() - fault).count();
      --left;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (size_t i = 0; i < survivors.size(); ++i) {
    std::printf("[ measured ] %s: rank %d named rank 2 %.2f s after its %s\n", f.name, survivors[i].first, named[i],
                strsignal(f.signal));
    EXPECT_GE(named[i], 0) << "rank " << survivors[i].first << " never named rank 2\n" << host0.err() << host1.err();
    EXPECT_LT(named[i], std::chrono::duration<double>(kLimit).count());
  }
  const int code0 = host0.Finish(fault);
  const int code1 = host1.Finish(fault);
  EXPECT_EQ(code0, 1) << host0.err();
  EXPECT_EQ(code1, 1) << host1.err();
  EXPECT_THAT(host0.out() + host1.out(), Not(HasSubstr("PASS")));
  for (int r : {0, 1}) EXPECT_THAT(RankLine(host0.err(), r), HasSubstr("rank 2 lost: its heartbeat")) << host0.err();
  EXPECT_THAT(host1.err(), HasSubstr("ddpcheck launch: rank 2 lost")) << host1.err();
  EXPECT_THAT(host0.err() + host1.err(), Not(HasSubstr("internal error")));
}

INSTANTIATE_TEST_SUITE_P(OnAnotherHost, RemoteRankLost,
                         ::testing::Values(RemoteFault{"KilledMidRunOverRedis", SIGKILL, true},
                                           RemoteFault{"StoppedMidRunOverRedis", SIGSTOP, true},
                                           RemoteFault{"KilledMidRunOverAFileStore", SIGKILL, false},
                                           RemoteFault{"StoppedMidRunOverAFileStore", SIGSTOP, false}),
                         [](const auto& p) { return std::string(p.param.name); });

// The heartbeat itself, in one process: rank 0 of a world of 3 whose ranks 1 and 2 published keys of another
// host (so PeerWatch cannot see them in /proc) and beat by hand.
TEST(Heartbeat, ARemotePeerWhoseCounterStopsIsLostOneThatEndedIsNotAndTheEndIsWritten) {
  auto store = std::make_shared<sim::MemoryStore>();
  const std::string run = UniqueRunId("heartbeat");
  auto put = [&](const std::string& key, const std::string& value) {
    store->Put(run + "/" + key, std::vector<char>(value.begin(), value.end()));
  };
  auto watch = std::make_shared<sim::PeerWatch>(store, run, 0, 3);
  watch->Publish();
  put("proc/1", "another-boot-id/pid:[1]\n77\nhost-b");
  put("proc/2", "another-boot-id/pid:[1]\n78\nhost-b");
  EXPECT_TRUE(watch->Lost().empty());
  sim::HeartbeatTiming timing;
  timing.period = std::chrono::milliseconds(50);
  timing.stale = std::chrono::milliseconds(500);
  watch->StartHeartbeat(sim::OpenStoreLine(store, std::chrono::milliseconds(1000)), timing);
  const auto start = Clock::now();
  put("alive/2", "1");  // rank 2 beats once, then never again
  for (int n = 1; Clock::now() < start + std::chrono::milliseconds(900); ++n) {  // rank 1 beats on
    put("alive/1", std::to_string(n));
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_FALSE(watch->HeartbeatPending(start));  // 1 advanced after `start`, 2 is stale
  const std::vector<sim::LostRank> lost = watch->Lost(/*read_store=*/false);
  ASSERT_EQ(lost.size(), 1u);
  EXPECT_EQ(lost[0].rank, 2);
  EXPECT_THAT(lost[0].why, HasSubstr("its heartbeat '" + run + "/alive/2' has not advanced for"));
  EXPECT_THAT(lost[0].why, HasSubstr("process 78 on host host-b"));
  put("alive/1", "ended");  // rank 1 ends its run: its silence from now on is no loss
  std::this_thread::sleep_for(std::chrono::milliseconds(900));
  ASSERT_EQ(watch->Lost(false).size(), 1u);
  // A later PeerWatch of the run in this process (rank 0 gathering shards) knows the verdict at once.
  sim::PeerWatch later(store, run, 0, 3);
  ASSERT_EQ(later.Lost().size(), 1u);
  EXPECT_EQ(later.Lost()[0].rank, 2);
  watch->StopHeartbeat();
  std::vector<char> mine;
  ASSERT_TRUE(store->TryGet(run + "/alive/0", &mine));
  EXPECT_EQ(std::string(mine.begin(), mine.end()), "ended");
}

TEST(Heartbeat, AWorldOnOneHostStartsNone) {
  auto store = std::make_shared<sim::MemoryStore>();
  const std::string run = UniqueRunId("one-host");
  sim::PeerWatch a(store, run, 0, 2), b(store, run, 1, 2);
  a.Publish();
  b.Publish();
  EXPECT_TRUE(a.Lost().empty());
  a.StartHeartbeat(sim::OpenStoreLine(store, std::chrono::milliseconds(1000)));
  EXPECT_FALSE(a.HeartbeatPending(Clock::now()));
  a.StopHeartbeat();
  std::vector<char> none;
  EXPECT_FALSE(store->TryGet(run + "/alive/0", &none));
}

TEST(LauncherLost, SigkillOfTheLauncherEndsItsRanksWithinSecondsAndRemovesItsTemporaryStore) {
  Launch run("launcher-kill", "", "--epochs 1000 --steps 4000");
  for (int r = 0; r < 4; ++r) ASSERT_GT(run.Rank(r), 0);
  ASSERT_EQ(kill(run.pid(), SIGKILL), 0);
  const auto start = Clock::now();
  EXPECT_TRUE(NoneLeft(run.run_id(), std::chrono::seconds(5)));
  std::printf("[ measured ] ranks gone %.2f s after the launcher's SIGKILL\n",
              std::chrono::duration<double>(Clock::now() - start).count());
  run.ExpectNothingLeft();
}

TEST(LauncherLost, SigtermIsForwardedToEveryRankWhichIsReapedBeforeTheLauncherExits) {
  Launch run("launcher-term", "", "--epochs 1000 --steps 4000");
  for (int r = 0; r < 4; ++r) ASSERT_GT(run.Rank(r), 0);
  ASSERT_EQ(kill(run.pid(), SIGTERM), 0);
  const int code = run.Finish(Clock::now());
  EXPECT_EQ(code, 128 + SIGTERM) << run.err();
  EXPECT_THAT(run.err(), HasSubstr("forwarding it to the ranks"));
  EXPECT_TRUE(testing::RunProcesses(run.run_id()).empty());  // reaped before the launcher exited
}

TEST(LauncherLost, RanksStartedByAnotherLauncherEndWhenItDies) {
  TempDir dir;
  const std::string id = UniqueRunId("other-launcher");
  std::string script;
  for (int r = 0; r < 2; ++r) {
    script += "RANK=" + std::to_string(r) + " WORLD_SIZE=2 DDPCHECK_STORE=" + dir.File("store") + " DDPCHECK_RUN_ID=" +
              id + " '" + DDPCHECK_BINARY + "' run --epochs 1000 --steps 4000 -q --timeout-ms 2000 2>>" + dir.File("err") + " & ";
  }
  script += "wait";
  const pid_t shell = fork();
  if (shell == 0) {
    execl("/bin/bash", "bash", "-c", script.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  ASSERT_GT(WaitForRank(id, 0, std::chrono::seconds(10)), 0);
  ASSERT_GT(WaitForRank(id, 1, std::chrono::seconds(10)), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(shell, SIGKILL);
  waitpid(shell, nullptr, 0);
  EXPECT_TRUE(NoneLeft(id, std::chrono::seconds(5)));
  EXPECT_THAT(testing::ReadFile(dir.File("err")), HasSubstr("its launcher"));
}

// A loopback listener on a free port: silent (never accepts), or answering every connection with `reply`.
class FakeServer {
 public:
  explicit FakeServer(std::string reply) : reply_(std::move(reply)) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
    listen(fd_, 64);
    socklen_t len = sizeof(addr);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    if (!reply_.empty()) {
      thread_ = std::thread([this] {
        while (true) {
          const int c = accept(fd_, nullptr, nullptr);
          if (c < 0) return;
          (void)!write(c, reply_.data(), reply_.size());
          conns_.push_back(c);
        }
      });
    }
  }
  ~FakeServer() {
    shutdown(fd_, SHUT_RDWR);
    close(fd_);
    if (thread_.joinable()) thread_.join();
    for (int c : conns_) close(c);
  }
  std::string url() const { return "redis://127.0.0.1:" + std::to_string(port_); }

 private:
  std::string reply_;
  int fd_ = -1;
  int port_ = 0;
  std::thread thread_;
  std::vector<int> conns_;
};

TEST(StoreLost, AListenerThatNeverAnswersOrSpeaksGarbageIsNamedWithItsAddressWithinTheTimeout) {
  for (const std::string& reply : {std::string(), std::string("HTTP/1.1 400 Bad Request\r\n\r\n")}) {
    FakeServer fake(reply);
    Launch run(reply.empty() ? "silent" : "garbage", "--rendezvous " + fake.url(), "--steps 2");
    const int code = run.Finish(Clock::now());
    EXPECT_EQ(code, 2) << run.err();
    EXPECT_THAT(run.err(), HasSubstr(fake.url()));
    EXPECT_THAT(run.err(), HasSubstr(reply.empty() ? "did not answer PING" : "instead of +PONG"));
  }
}

// Redis killed or stopped once the ranks are well into the run: the ranks name the store and end.
void ExpectStoreLossNamed(int signal) {
  RedisServer redis;
  if (redis.url().empty()) GTEST_SKIP() << "redis-server not installed or did not start";
  Launch run(signal == SIGKILL ? "redis-kill" : "redis-stop", "--rendezvous " + redis.url(), "--epochs 1000 --steps 2000");
  std::shared_ptr<gloo::rendezvous::Store> store;
  ASSERT_TRUE(sim::OpenStore(redis.url(), std::chrono::milliseconds(2000), &store).ok());
  const auto give_up = Clock::now() + std::chrono::seconds(20);
  while (!sim::StoreHas(*store, run.run_id() + "/fr/0/40") && Clock::now() < give_up) {
  }
  store.reset();
  ASSERT_EQ(kill(redis.pid(), signal), 0);
  const int code = run.Finish(Clock::now());
  EXPECT_NE(code, 0);
  EXPECT_NE(code, 3) << run.err();
  EXPECT_THAT(run.out(), Not(HasSubstr("PASS")));
  EXPECT_THAT(RankLine(run.err(), 0), HasSubstr(redis.url())) << run.err();
}

TEST(StoreLost, RedisKilledMidRunIsNamedWithItsAddress) { ExpectStoreLossNamed(SIGKILL); }
TEST(StoreLost, RedisStoppedMidRunIsNamedWithItsAddressWithinTheTimeout) { ExpectStoreLossNamed(SIGSTOP); }

TEST(RunIdReuse, ASecondLaunchWithTheSameRunIdIsRefusedAndTheFirstWorldIsUntouched) {
  RedisServer redis;
  if (redis.url().empty()) GTEST_SKIP() << "redis-server not installed or did not start";
  Launch first("reuse", "--rendezvous " + redis.url(), "--steps 40");
  ASSERT_GT(first.Rank(0), 0);
  const auto second =
      testing::RunCli("launch --nproc 4 --rendezvous " + redis.url() + " --run-id " + first.run_id() +
                      " -- ddpcheck run -q --steps 40 --timeout-ms 2000");
  EXPECT_EQ(second.exit_code, 2) << second.err;
  EXPECT_THAT(second.err, HasSubstr("run id '" + first.run_id() + "'"));
  EXPECT_THAT(second.err, HasSubstr("--run-id"));
  EXPECT_EQ(first.Finish(Clock::now()), 0) << first.err();
  EXPECT_THAT(first.out(), HasSubstr("PASS"));
}

// A 64 KiB tmpfs at a fresh folder, filled up; skipped where it cannot be mounted (not root, no CAP_SYS_ADMIN).
class FullDisk {
 public:
  FullDisk() {
    std::filesystem::create_directories(dir_.File("mnt"));
    mounted_ = mount("tmpfs", dir_.File("mnt").c_str(), "tmpfs", 0, "size=64k") == 0;
  }
  ~FullDisk() {
    if (mounted_) umount2(dir_.File("mnt").c_str(), MNT_DETACH);
  }
  bool mounted() const { return mounted_; }
  std::string path() const { return dir_.File("mnt"); }
  void Fill() const {
    FILE* f = std::fopen((path() + "/fill").c_str(), "wb");
    const std::string block(4096, 'x');
    while (f && std::fwrite(block.data(), 1, block.size(), f) == block.size() && std::fflush(f) == 0) {
    }
    if (f) std::fclose(f);
  }
  void Empty() const { std::filesystem::remove_all(path() + "/fill"); }

 private:
  TempDir dir_;
  bool mounted_ = false;
};

TEST(DiskFull, TheReportWriteNamesTheFullDiskAndLeavesNoPartialFile) {
  FullDisk disk;
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a 64 KiB tmpfs here (needs root / CAP_SYS_ADMIN)";
  disk.Fill();
  const auto r = testing::RunCli("run --world 2 --steps 2 -q --report-json " + disk.path() + "/report.json");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("disk full writing report.json"));
  EXPECT_FALSE(std::filesystem::exists(disk.path() + "/report.json"));
}

// A report to a device that refuses it (/dev/full: ENOSPC) exits 2 naming it, and the device is left alone: the
// partial-file cleanup removed only what it wrote, never the path itself (QA round 16: run as root it unlinked
// /dev/full, and later writes there made a regular file).
TEST(DiskFull, AReportToDevFullExits2AndLeavesTheDeviceInPlace) {
  struct stat before {};
  if (::stat("/dev/full", &before) != 0 || !S_ISCHR(before.st_mode)) GTEST_SKIP() << "no /dev/full device here";
  const auto r = testing::RunCli("run --world 2 --steps 2 -q --report-json /dev/full");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("/dev/full"));
  struct stat after {};
  ASSERT_EQ(::stat("/dev/full", &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode)) << "/dev/full is no longer a device";
}

TEST(DiskFull, DumpTraceNamesTheFlagAndTheFullDisk) {
  FullDisk disk;
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a 64 KiB tmpfs here (needs root / CAP_SYS_ADMIN)";
  disk.Fill();
  const auto r = testing::RunCli("run --world 2 --steps 2 -q --dump-trace " + disk.path() + "/trace");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--dump-trace: disk full writing "));
}

TEST(DiskFull, AFileStoreOnAFullDiskOrOneThatFillsUpMidRunNamesTheFullDisk) {
  FullDisk disk;
  if (!disk.mounted()) GTEST_SKIP() << "cannot mount a 64 KiB tmpfs here (needs root / CAP_SYS_ADMIN)";
  for (bool full_from_the_start : {true, false}) {
    if (full_from_the_start) disk.Fill();
    Launch run(full_from_the_start ? "disk-full" : "disk-fills",
               "--rendezvous file://" + disk.path() + "/store" + std::to_string(full_from_the_start), "--steps 200");
    const int code = run.Finish(Clock::now());
    EXPECT_EQ(code, 2) << run.err();
    EXPECT_THAT(run.err(), HasSubstr("disk full"));
    EXPECT_THAT(run.err(), Not(HasSubstr("internal error")));
    EXPECT_THAT(run.out(), Not(HasSubstr("PASS")));
    disk.Empty();
  }
}

}  // namespace
}  // namespace ddpcheck
