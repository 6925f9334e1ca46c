// Ranks as processes: fork W children before any Gloo thread exists; they rendezvous through a FileStore
// in a temporary folder and allreduce. Each child's exit code is its verdict.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gloo/rendezvous/file_store.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sim/communicator_gloo.h"
#include "tests/test_util.h"

namespace ddpcheck::sim {
namespace {

using core::Status;
using std::chrono::milliseconds;

// One child: join, allreduce (rank+1) over 1000 float32, check the closed form W(W+1)/2, write the status
// message to <dir>/rank<r>.txt. Exit code: 0 ok, 1 for a wrong sum, 10 + the status code, 99 on exception.
int ChildMain(const std::string& dir, int rank, int world, milliseconds timeout) {
  auto store = std::make_shared<gloo::rendezvous::FileStore>(dir + "/store");
  std::unique_ptr<GlooCommunicator> comm;
  Status s = GlooCommunicator::Create(store, "procs", rank, world, timeout, &comm);
  std::vector<float> buf(1000, static_cast<float>(rank + 1));
  if (s.ok()) s = comm->AllReduceSum(core::Span{buf.data(), 1000, core::DType::kFloat32}, "bucket 0");
  std::ofstream(dir + "/rank" + std::to_string(rank) + ".txt") << s.ToString();
  if (!s.ok()) return 10 + static_cast<int>(s.code());
  for (float v : buf) {
    if (v != static_cast<float>(world * (world + 1) / 2)) return 1;
  }
  return 0;
}

// Forks one child per rank in `ranks`; returns their exit codes (-1 for killed after `limit`).
std::vector<int> RunChildren(const std::string& dir, const std::vector<int>& ranks, int world, milliseconds timeout,
                             milliseconds limit) {
  std::filesystem::create_directory(dir + "/store");
  std::vector<pid_t> pids;
  for (int r : ranks) {
    pid_t pid = fork();
    if (pid == 0) {  // never return into gtest from a child
      int code = 99;
      try {
        code = ChildMain(dir, r, world, timeout);
      } catch (const std::exception& e) {
        std::ofstream(dir + "/rank" + std::to_string(r) + ".txt") << "exception: " << e.what();
      }
      _exit(code);
    }
    pids.push_back(pid);
  }
  std::vector<int> codes(pids.size(), -1);
  const auto deadline = std::chrono::steady_clock::now() + limit;
  for (size_t i = 0; i < pids.size(); ++i) {
    int status = 0;
    while (waitpid(pids[i], &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pids[i], SIGKILL);
        waitpid(pids[i], &status, 0);
        status = -1;
        break;
      }
      std::this_thread::sleep_for(milliseconds(10));
    }
    if (status != -1 && WIFEXITED(status)) codes[i] = WEXITSTATUS(status);
  }
  return codes;
}

TEST(GlooProcesses, ThreeProcessesRendezvousThroughAFileStoreAndAllReduce) {
  testing::TempDir dir;
  std::vector<int> codes = RunChildren(dir.path(), {0, 1, 2}, 3, milliseconds(10000), milliseconds(60000));
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(codes[static_cast<size_t>(r)], 0) << "rank " << r << ": " << testing::ReadFile(dir.File("rank" + std::to_string(r) + ".txt"));
  }
}

TEST(GlooProcesses, AProcessThatNeverStartsIsNamedByTheOthers) {
  testing::TempDir dir;
  std::vector<int> codes = RunChildren(dir.path(), {0, 1}, 3, milliseconds(500), milliseconds(30000));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(codes[static_cast<size_t>(r)], 10 + static_cast<int>(core::Code::kTimeout)) << "rank " << r;
    EXPECT_THAT(testing::ReadFile(dir.File("rank" + std::to_string(r) + ".txt")),
                ::testing::HasSubstr("rank 2 never joined (2 of 3 joined)"));
  }
}

}  // namespace
}  // namespace ddpcheck::sim
