// Beyond one machine, on one machine: three network namespaces stand in for three hosts, joined by veth pairs
// to a bridge in a fourth, with link-local addresses (169.254.77.x/24) that exist only inside them. Redis runs
// in the first; each "host" runs `ddpcheck launch --nnodes 3 --node-rank K --nproc-per-node 2` under
// `ip netns exec`, its Gloo device bound to its own address (--gloo-host). The W=6 world must give bitwise the
// trace of the one-process threads run; and a rank killed or stopped on one host must be named by every rank on
// the others, which see neither its process (each host also has a pid namespace of its own) nor its sockets
// close (SIGSTOP): only its heartbeat in the store. Needs root and iproute2 (else SKIP); label `netns`.
#include <gloo/rendezvous/store.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/trace.h"
#include "tests/process_util.h"
#include "tests/test_util.h"

namespace ddpcheck::sim {
namespace {

using testing::RunCli;
using testing::TempDir;

int Sh(const std::string& cmd) {
  const int status = std::system((cmd + " >/dev/null 2>&1").c_str());
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

std::string Address(int host) { return "169.254.77." + std::to_string(host + 1); }

// The namespaces (hub + hosts) and what runs in them; everything is removed by the destructor, also when an
// assertion fails half-way.
class Namespaces {
 public:
  explicit Namespaces(int hosts) : prefix_("ddpck" + std::to_string(getpid()) + "n") {
    ok_ = Add(Hub()) && Sh("ip -n " + Hub() + " link add br0 type bridge") == 0 &&
          Sh("ip -n " + Hub() + " link set br0 up") == 0;
    for (int h = 0; ok_ && h < hosts; ++h) {
      const std::string ns = Host(h), port = "p" + std::to_string(h);
      ok_ = Add(ns) && Sh("ip -n " + ns + " link set lo up") == 0 &&
            Sh("ip -n " + ns + " link add eth0 type veth peer name " + port + " netns " + Hub()) == 0 &&
            Sh("ip -n " + Hub() + " link set " + port + " master br0") == 0 &&
            Sh("ip -n " + Hub() + " link set " + port + " up") == 0 &&
            Sh("ip -n " + ns + " addr add " + Address(h) + "/24 dev eth0") == 0 &&
            Sh("ip -n " + ns + " link set eth0 up") == 0;
    }
  }
  ~Namespaces() {
    for (pid_t pid : pids_) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    for (const auto& ns : made_) Sh("ip netns del " + ns);
  }
  bool ok() const { return ok_; }
  std::string Host(int h) const { return prefix_ + std::to_string(h); }

  // Starts `argv` inside host h's namespace in the background; killed by the destructor.
  void Start(int h, std::vector<std::string> argv) {
    argv.insert(argv.begin(), {"ip", "netns", "exec", Host(h)});
    pid_t pid = fork();
    if (pid == 0) {
      std::vector<char*> args;
      for (auto& a : argv) args.push_back(a.data());
      args.push_back(nullptr);
      execvp("ip", args.data());
      _exit(127);
    }
    pids_.push_back(pid);
  }

 private:
  std::string Hub() const { return prefix_ + "hub"; }
  bool Add(const std::string& ns) {
    if (Sh("ip netns add " + ns) != 0) return false;
    made_.push_back(ns);
    return true;
  }

  std::string prefix_;
  bool ok_ = false;
  std::vector<std::string> made_;
  std::vector<pid_t> pids_;
};

constexpr int kHosts = 3;

// Redis in host 0's namespace, reachable from the others at Address(0); "" when it did not come up.
std::string StartRedis(Namespaces& net) {
  net.Start(0, {"redis-server", "--bind", Address(0), "--port", "6379", "--save", "", "--appendonly", "no",
                "--protected-mode", "no", "--loglevel", "warning"});
  for (int i = 0; i < 100; ++i) {
    if (Sh("ip netns exec " + net.Host(1) + " redis-cli -h " + Address(0) + " ping") == 0 ||
        Sh("ip netns exec " + net.Host(1) + " bash -c 'exec 3<>/dev/tcp/" + Address(0) + "/6379'") == 0) {
      return "redis://" + Address(0) + ":6379";
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return "";
}

// Three hosts with Redis on the first, or SKIP where they cannot be made.
class MultiHostNetns : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces";
    if (Sh("command -v ip") != 0) GTEST_SKIP() << "no `ip` (iproute2)";
    if (Sh("command -v redis-server") != 0) GTEST_SKIP() << "no redis-server (apt-get install redis-server)";
    net_ = std::make_unique<Namespaces>(kHosts);
    if (!net_->ok()) GTEST_SKIP() << "cannot make network namespaces / veth pairs / a bridge here";
    url_ = StartRedis(*net_);
    ASSERT_FALSE(url_.empty()) << "redis-server did not come up in " << net_->Host(0);
  }
  std::unique_ptr<Namespaces> net_;
  std::string url_;
};

TEST_F(MultiHostNetns, SixRanksOnThreeNamespacedHostsOverRedisGiveTheThreadsTraceBitwise) {
  const Namespaces& net = *net_;
  const std::string& url = url_;

  TempDir dir;
  const auto threads = RunCli("run --world 6 --steps 3 -q --dump-trace " + dir.File("threads"));
  ASSERT_EQ(threads.exit_code, 0) << threads.out << threads.err;

  std::vector<std::thread> nodes;
  std::vector<int> codes(kHosts, -1);
  for (int h = 0; h < kHosts; ++h) {
    nodes.emplace_back([&, h] {
      const std::string cmd =
          "ip netns exec " + net.Host(h) + " '" + DDPCHECK_BINARY + "' launch --nnodes 3 --node-rank " +
          std::to_string(h) + " --nproc-per-node 2 --kill-after-ms 60000 --rendezvous " + url +
          " --run-id netns -- ddpcheck run --world 6 --steps 3 -q --timeout-ms 30000 --gloo-host " + Address(h) +
          " --dump-trace " + dir.File("procs") + " >" + dir.File("out" + std::to_string(h)) + " 2>&1";
      const int status = std::system(cmd.c_str());
      codes[static_cast<size_t>(h)] = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
    });
  }
  for (auto& t : nodes) t.join();
  for (int h = 0; h < kHosts; ++h) {
    EXPECT_EQ(codes[static_cast<size_t>(h)], 0) << testing::ReadFile(dir.File("out" + std::to_string(h)));
  }
  EXPECT_THAT(testing::ReadFile(dir.File("out0")), ::testing::HasSubstr("PASS"));

  core::Trace got, want;
  ASSERT_TRUE(core::Trace::Read(dir.File("procs"), &got).ok());
  ASSERT_TRUE(core::Trace::Read(dir.File("threads"), &want).ok());
  ASSERT_EQ(got.records().size(), want.records().size());
  for (const auto& [key, value] : want.records()) {
    const core::Tensor* g = got.Find(key);
    ASSERT_NE(g, nullptr) << key.ToString();
    EXPECT_TRUE(core::BitwiseEqual(*g, value)) << key.ToString();
  }
  const auto diff = RunCli("diff " + dir.File("procs") + " " + dir.File("threads") + " -q");
  EXPECT_EQ(diff.exit_code, 0) << diff.out << diff.err;
}

TEST_F(MultiHostNetns, ARankKilledOrStoppedOnAnotherHostIsNamedByEveryRankWithinTheTimeout) {
  if (Sh("unshare --pid --kill-child --mount-proc true") != 0) GTEST_SKIP() << "cannot make a pid namespace here";
  const Namespaces& net = *net_;
  const std::string& url = url_;
  constexpr int kTimeoutMs = 2000;
  // The timeout plus the launchers' teardown: a stopped rank measured 2.7-7.2 s on 2 cores while the rest of the
  // suite ran beside it (7.19 s once, against the 7 s this bound was), against the 2000 steps a hang would run.
  const double limit = (kTimeoutMs + (testing::kSanitizerBuild ? 15000 : 8000)) / 1000.0;
  for (int signal : {SIGKILL, SIGSTOP}) {
    TempDir dir;
    const std::string id = "netns-lost-" + std::to_string(signal) + "-" + std::to_string(getpid());
    std::vector<std::thread> nodes;
    std::vector<int> codes(kHosts, -1);
    for (int h = 0; h < kHosts; ++h) {
      nodes.emplace_back([&, h] {
        const std::string cmd = "ip netns exec " + net.Host(h) + " unshare --pid --kill-child --mount-proc '" +
                                DDPCHECK_BINARY + "' launch --nnodes 3 --node-rank " + std::to_string(h) +
                                " --nproc-per-node 2 --rendezvous " + url + " --run-id " + id +
                                " -- ddpcheck run --world 6 --epochs 1000 --steps 2000 -q --timeout-ms " +
                                std::to_string(kTimeoutMs) + " --gloo-host " + Address(h) + " >" +
                                dir.File("out" + std::to_string(h)) + " 2>&1";
        const int status = std::system(cmd.c_str());
        codes[static_cast<size_t>(h)] = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
      });
    }
    const pid_t victim = testing::WaitForRank(id, 4, std::chrono::seconds(20));  // on host 2
    const bool started = victim > 0 && testing::WaitForRank(id, 0, std::chrono::seconds(20)) > 0;
    if (started) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // into the training steps
      EXPECT_EQ(kill(victim, signal), 0);
    }
    const auto fault = std::chrono::steady_clock::now();
    for (auto& t : nodes) t.join();
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - fault).count();
    ASSERT_TRUE(started) << "rank 4 or rank 0 never started\n" << testing::ReadFile(dir.File("out2"));
    std::printf("[ measured ] %s of rank 4 (host 2): every host's launch ended %.2f s after it\n", strsignal(signal),
                secs);
    EXPECT_LT(secs, limit);
    std::string all;
    for (int h = 0; h < kHosts; ++h) {
      const std::string out = testing::ReadFile(dir.File("out" + std::to_string(h)));
      all += out;
      EXPECT_EQ(codes[static_cast<size_t>(h)], 1) << out;
      EXPECT_THAT(out, ::testing::Not(::testing::HasSubstr("PASS")));
    }
    for (int r : {0, 1, 2, 3}) {
      EXPECT_THAT(testing::RankLine(all, r), ::testing::HasSubstr("rank 4 lost: its heartbeat")) << all;
    }
    EXPECT_THAT(testing::RankLine(all, 5), ::testing::HasSubstr("rank 4 lost")) << all;
    EXPECT_THAT(all, ::testing::HasSubstr("ddpcheck launch: rank 4 lost")) << all;
    EXPECT_TRUE(testing::NoneLeft(id, std::chrono::seconds(3)));
  }
}

}  // namespace
}  // namespace ddpcheck::sim
