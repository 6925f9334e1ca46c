// Ranks as processes end to end: `ddpcheck launch` and `ddpcheck run` under launcher variables (torchrun,
// OpenMPI, Slurm), rendezvousing through a FileStore or a RedisStore on loopback, give bitwise the trace of the
// one-process threads run; a rank that dies or never comes makes the others fail within the timeout, naming it;
// run ids keep runs on one store apart. Plus the pieces: store URLs, trace shards.
#include <gloo/rendezvous/store.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>

#include "core/trace.h"
#include "sim/store_open.h"
#include "sim/trace_shard.h"
#include "tests/process_util.h"
#include "tests/test_util.h"

namespace ddpcheck::sim {
namespace {

using testing::CliResult;
using testing::FreeLoopbackPort;
using testing::RedisServer;
using ::testing::HasSubstr;
using testing::RunCli;
using testing::TempDir;

const char kScenario[] = "--world 6 --steps 3";

// Every record of `got` equals `want`'s bitwise, and both have the same keys and events.
void ExpectTracesBitwiseEqual(const std::string& got_dir, const std::string& want_dir) {
  core::Trace got, want;
  ASSERT_TRUE(core::Trace::Read(got_dir, &got).ok());
  ASSERT_TRUE(core::Trace::Read(want_dir, &want).ok());
  ASSERT_GT(want.records().size(), 0u);
  ASSERT_EQ(got.records().size(), want.records().size());
  for (const auto& [key, value] : want.records()) {
    const core::Tensor* g = got.Find(key);
    ASSERT_NE(g, nullptr) << key.ToString();
    EXPECT_TRUE(core::BitwiseEqual(*g, value)) << key.ToString();
  }
  EXPECT_EQ(got.events().size(), want.events().size());
  const auto diff = RunCli("diff '" + got_dir + "' '" + want_dir + "' -q");
  EXPECT_EQ(diff.exit_code, 0) << diff.out << diff.err;
}

// The one-process threads run of kScenario, dumped once.
const std::string& ThreadsTrace() {
  static TempDir dir;  // removed at exit
  static const std::string path = [] {
    const auto r = RunCli(std::string("run ") + kScenario + " -q --dump-trace " + dir.File("t"));
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    return dir.File("t");
  }();
  return path;
}

TEST(StoreUrl, ParsesFileAndRedisFormsAndRejectsOthers) {
  StoreUrl u;
  ASSERT_TRUE(ParseStoreUrl("file:///shared/dir", &u).ok());
  EXPECT_EQ(u.scheme, "file");
  EXPECT_EQ(u.path, "/shared/dir");
  ASSERT_TRUE(ParseStoreUrl("redis://10.1.2.3:7000", &u).ok());
  EXPECT_EQ(u.host, "10.1.2.3");
  EXPECT_EQ(u.port, 7000);
  ASSERT_TRUE(ParseStoreUrl("redis://head-node", &u).ok());
  EXPECT_EQ(u.port, 6379);
  ASSERT_TRUE(ParseStoreUrl("redis://[::1]:6380/", &u).ok());
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.port, 6380);
  EXPECT_FALSE(ParseStoreUrl("file://relative/dir", &u).ok());
  EXPECT_FALSE(ParseStoreUrl("redis://:6379", &u).ok());
  EXPECT_FALSE(ParseStoreUrl("redis://h:0", &u).ok());
  EXPECT_FALSE(ParseStoreUrl("redis://h:70000", &u).ok());
  EXPECT_FALSE(ParseStoreUrl("tcp://h:1", &u).ok());
}

TEST(StoreUrl, UnreachableRedisIsAnIoErrorNotAHang) {
  const int port = FreeLoopbackPort();  // nobody listens
  std::shared_ptr<gloo::rendezvous::Store> store;
  const auto start = std::chrono::steady_clock::now();
  core::Status st = OpenStore("redis://127.0.0.1:" + std::to_string(port), std::chrono::milliseconds(500), &store);
  EXPECT_EQ(st.code(), core::Code::kIo) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr(std::to_string(port)));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(TraceShard, PackThenUnpackGivesTheSameRecordsBitwise) {
  core::Trace t;
  t.meta["world"] = 3;
  t.Add({2, core::Checkpoint::kParams, "0.weight", 1},
        core::Tensor(core::DType::kFloat32, {100}, std::vector<double>(100, double{0.1f})));
  t.Add({0, core::Checkpoint::kInit, "0.bias", 0}, core::Tensor::Scalar(-0.0));
  t.AddEvent({1, 2, core::Checkpoint::kInit, "timeout", "rank 2 missing"});
  std::vector<char> blob;
  ASSERT_TRUE(PackTrace(t, &blob).ok());
  core::Trace back;
  ASSERT_TRUE(UnpackTrace(blob, &back).ok());
  ASSERT_EQ(back.records().size(), 2u);
  for (const auto& [key, value] : t.records())
    EXPECT_TRUE(core::BitwiseEqual(*back.Find(key), value)) << key.ToString();
  ASSERT_EQ(back.events().size(), 1u);
  EXPECT_EQ(back.events()[0].message, "rank 2 missing");
  blob.resize(blob.size() - 3);
  EXPECT_FALSE(UnpackTrace(blob, &back).ok());
}

// A command that cannot run is one line, exit 2, before any rank starts (QA round 16: a line per rank, then one per
// rank's exit 127).
TEST(Launch, AProgramThatCannotRunIsOneLineBeforeAnyRankStarts) {
  for (const std::string prog : {"/nonexistent/prog", "no-such-program-ddpcheck-test", "/tmp"}) {
    SCOPED_TRACE(prog);
    const auto r = RunCli("launch --nproc 2 -- " + prog);
    EXPECT_EQ(r.exit_code, 2) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(prog + ": no such program, or not executable"), std::string::npos) << r.err;
  }
}

TEST(Launch, SixProcessesOverAFileStoreGiveTheThreadsTraceBitwise) {
  TempDir dir;
  const auto r =
      RunCli(std::string("launch --nproc 6 -- ddpcheck run ") + kScenario + " -q --dump-trace " + dir.File("p"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.out, HasSubstr("PASS"));
  ExpectTracesBitwiseEqual(dir.File("p"), ThreadsTrace());
}

TEST(Launch, SixProcessesOverRedisGiveTheThreadsTraceBitwise) {
  RedisServer redis;
  if (redis.url().empty()) GTEST_SKIP() << "redis-server not installed or did not start (apt-get install redis-server)";
  TempDir dir;
  const auto r = RunCli("launch --nproc 6 --rendezvous " + redis.url() + " -- ddpcheck run " + kScenario +
                        " -q --dump-trace " + dir.File("p"));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  ExpectTracesBitwiseEqual(dir.File("p"), ThreadsTrace());
}

TEST(Launch, TwoRunsOnOneStoreWithDifferentRunIdsNeverMixAndAReusedRunIdIsRefused) {
  RedisServer redis;
  if (redis.url().empty()) GTEST_SKIP() << "redis-server not installed or did not start";
  TempDir dir;
  const std::string base = "launch --nproc 2 --rendezvous " + redis.url();
  // Run concurrently: both use the same store at once.
  std::string cmd_a = base + " --run-id A -- ddpcheck run --world 2 --steps 2 -q";
  CliResult a, b;
  std::thread ta([&] { a = RunCli(cmd_a); });
  b = RunCli(base + " --run-id B -- ddpcheck run --world 2 --steps 2 -q");
  ta.join();
  EXPECT_EQ(a.exit_code, 0) << a.out << a.err;
  EXPECT_EQ(b.exit_code, 0) << b.out << b.err;
  const auto again = RunCli(base + " --run-id A -- ddpcheck run --world 2 --steps 2 -q --timeout-ms 2000");
  EXPECT_EQ(again.exit_code, 2) << again.err;  // refused by launch before any rank starts
  EXPECT_THAT(again.err, HasSubstr("run id 'A'"));
  EXPECT_THAT(again.err, HasSubstr("already used"));
}

TEST(Launch, ARankThatDiesMidRunMakesTheOthersFailNamingItWithinTheTimeout) {
  setenv("DDPCHECK_TEST_DIE_AT_STEP", "1", 1);  // inherited by launch and its ranks
  setenv("DDPCHECK_TEST_DIE_RANK", "3", 1);
  const auto start = std::chrono::steady_clock::now();
  const auto r = RunCli("launch --nproc 6 -- ddpcheck run --world 6 --steps 4 -q --timeout-ms 2000");
  unsetenv("DDPCHECK_TEST_DIE_AT_STEP");
  unsetenv("DDPCHECK_TEST_DIE_RANK");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("rank 3 exited with code 86"));
  EXPECT_THAT(r.err, HasSubstr("rank 0 of 6"));
  EXPECT_THAT(r.err, HasSubstr("rank 3"));
  EXPECT_LT(secs, 60) << r.err;
  // Every surviving rank exits non-zero on its own (launch never had to kill one).
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("killing it")));
  for (int rank : {0, 1, 2, 4, 5}) EXPECT_THAT(r.err, HasSubstr("rank " + std::to_string(rank) + " exited with code"));
}

// The ranks share the launcher's stderr: each rank's message is one whole line, never cut into by another rank's
// (written piece by piece, eight ranks failing at once printed "ddpcheck ddpcheck run: run: not found: ..." in
// most launches, and a test looking for rank 0's line missed it).
TEST(Launch, EveryRanksMessageIsOneWholeLineOnTheSharedStderr) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    for (const std::string& args : {std::string("/no/such/scenario.json --world 8"), std::string("--no-such-flag")}) {
      const auto r = RunCli("launch --nproc 8 -- ddpcheck run " + args);
      EXPECT_EQ(r.exit_code, 2) << r.err;
      std::istringstream lines(r.err);
      int rank_lines = 0;
      for (std::string line; std::getline(lines, line);) {
        if (line.rfind("ddpcheck launch: ", 0) == 0) continue;
        const bool whole = line == "ddpcheck run: not found: /no/such/scenario.json: no such file" ||
                           line.rfind("ddpcheck: unknown option '--no-such-flag' for 'ddpcheck run'", 0) == 0;
        EXPECT_TRUE(whole) << "a line cut into by another rank's: '" << line << "'\n" << r.err;
        rank_lines += whole ? 1 : 0;
      }
      EXPECT_EQ(rank_lines, 8) << r.err;
    }
  }
}

// A torch script under `launch` finds what init_process_group("env://") reads: RANK, WORLD_SIZE, MASTER_ADDR and
// one MASTER_PORT shared by every rank (a free port on one node).
TEST(Launch, ExportsTorchrunsVariablesToEveryRank) {
  testing::TempDir dir;
  const auto r = RunCli("launch --nproc 3 -- sh -c 'echo \"$RANK $WORLD_SIZE $LOCAL_RANK $MASTER_ADDR $MASTER_PORT\" > " +
                        dir.path() + "/rank$RANK'");
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  std::string port;
  for (int rank = 0; rank < 3; ++rank) {
    std::istringstream in(testing::ReadFile(dir.File("rank" + std::to_string(rank))));
    std::string got_rank, world, local, addr, p;
    in >> got_rank >> world >> local >> addr >> p;
    EXPECT_EQ(got_rank, std::to_string(rank));
    EXPECT_EQ(world, "3");
    EXPECT_EQ(local, std::to_string(rank));
    EXPECT_EQ(addr, "127.0.0.1");
    EXPECT_GT(std::stoi(p), 0);
    if (rank == 0) port = p;
    EXPECT_EQ(p, port) << "every rank must see the same MASTER_PORT";
  }
}

TEST(RunAsRank, ARankThatNeverComesIsNamedByTheOthersWithinTheTimeout) {
  TempDir dir;
  std::string script;
  for (int rank = 0; rank < 5; ++rank) {  // rank 5 of 6 never starts
    script += "RANK=" + std::to_string(rank) + " WORLD_SIZE=6 DDPCHECK_STORE=" + dir.File("store") +
              " DDPCHECK_RUN_ID=never '" + DDPCHECK_BINARY + "' run --world 6 --steps 2 -q --timeout-ms 2000 2>" +
              dir.File("err" + std::to_string(rank)) + " & ";
  }
  script += "rc=0; for j in $(jobs -p); do wait $j; c=$?; [ $c -ne 0 ] && rc=$c; done; exit $rc";
  testing::WriteFile(dir.File("s.sh"), script);
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(("bash " + dir.File("s.sh") + " >/dev/null").c_str());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
  EXPECT_NE(WEXITSTATUS(status), 0);
  for (int rank = 0; rank < 5; ++rank) {
    EXPECT_THAT(testing::ReadFile(dir.File("err" + std::to_string(rank))), HasSubstr("rank 5")) << "rank " << rank;
  }
}

// Launcher variables of OpenMPI and Slurm (and torchrun's) select the one-rank branch with the same result.
void ExpectTwoRanksPassUnder(const std::string& rank_var, const std::string& world_var) {
  TempDir dir;
  std::string script;
  for (int rank = 0; rank < 2; ++rank) {
    script += rank_var + "=" + std::to_string(rank) + " " + world_var + "=2 DDPCHECK_STORE=" + dir.File("store") +
              " '" + DDPCHECK_BINARY + "' run --steps 2 -q --timeout-ms 20000 >" +
              dir.File("out" + std::to_string(rank)) + " 2>&1 & ";
  }
  script += "rc=0; for j in $(jobs -p); do wait $j || rc=$?; done; exit $rc";
  testing::WriteFile(dir.File("s.sh"), script);
  const int status = std::system(("bash " + dir.File("s.sh")).c_str());
  EXPECT_EQ(WEXITSTATUS(status), 0) << testing::ReadFile(dir.File("out0")) << testing::ReadFile(dir.File("out1"));
  EXPECT_THAT(testing::ReadFile(dir.File("out0")), HasSubstr("PASS"));
  EXPECT_EQ(testing::ReadFile(dir.File("out1")), "");  // only rank 0 reports
}

TEST(RunAsRank, OpenMpiVariablesMakeTheProcessOneRank) {
  ExpectTwoRanksPassUnder("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
}
TEST(RunAsRank, SlurmVariablesMakeTheProcessOneRank) { ExpectTwoRanksPassUnder("SLURM_PROCID", "SLURM_NTASKS"); }
TEST(RunAsRank, TorchrunVariablesMakeTheProcessOneRank) { ExpectTwoRanksPassUnder("RANK", "WORLD_SIZE"); }

TEST(RunAsRank, IncompleteLauncherVariablesAreBadInput) {
  const int status = std::system(("RANK=1 '" + std::string(DDPCHECK_BINARY) + "' run -q >/dev/null 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(status), 2);
}

}  // namespace
}  // namespace ddpcheck::sim
