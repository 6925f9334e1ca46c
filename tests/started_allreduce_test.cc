// Over Gloo a bucket too large for the direct exchange is all-reduced on the rank's collective thread while
// its backward goes on (Communicator::StartAllReduceSum, sim/collective_queue.h). That must not change one
// recorded bit or what a faulty run reports: every shipped scenario and BUGS.md fault scenario runs over Gloo
// with every bucket started that way (direct exchange off) and over the in-memory communicator, which runs
// each all-reduce at once in the ring's order; the traces (every recorded value, bitwise) and the kinds of
// the events are the same.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "core/fault_spec.h"
#include "core/scenario.h"
#include "core/train_loop.h"
#include "core/trace.h"
#include "sim/world.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

core::Trace RunWorld(const core::Scenario& s, const std::string& comm, const std::string& transport = "inproc",
                     int64_t direct_bytes = 0) {
  sim::SimOptions opts;
  opts.comm = comm;
  opts.gloo_transport = transport;
  opts.gloo_direct_allreduce_bytes = direct_bytes;  // 0: every bucket through gloo::allreduce, started on the collective thread
  opts.timeout = std::chrono::milliseconds(1500);  // the hang scenarios' ranks give up soon
  opts.run_id = "started-" + comm + "-" + transport;
  core::Trace trace;
  const core::Status st = sim::RunSim(s, opts, &trace);
  EXPECT_TRUE(st.ok()) << st.message();
  return trace;
}

// Runs compare(scenario, name) on every shipped and fault scenario, cut to 5 steps (past the bucket rebuild at
// step 1); returns how many ran.
size_t ForEachShortScenario(const std::function<void(const core::Scenario&, size_t index, const std::string&)>& compare) {
  size_t runs = 0;
  for (const std::string& path : testing::ShippedScenarioPaths()) {
    core::Scenario s;
    EXPECT_TRUE(core::LoadScenario(path, &s).ok()) << path;
    EXPECT_TRUE(core::MaterializeData(&s).ok()) << path;
    s.steps = std::min<int64_t>(s.steps < 0 ? 5 : s.steps, 5);
    compare(s, runs++, std::filesystem::path(path).filename().string());
  }
  return runs;
}

TEST(StartedAllReduce, EveryScenarioRecordsTheSameOverGlooAsAllReducedAtOnce) {
  const size_t runs = ForEachShortScenario([](const core::Scenario& s, size_t, const std::string& what) {
    testing::ExpectSameTraces(RunWorld(s, "gloo"), RunWorld(s, "local"), what);
  });
  EXPECT_GE(runs, 25u);
}

// Gloo's collectives over its TCP transport and over the in-process one (sim/gloo_inproc.h, the threads world's
// default) send the same messages: every shipped and fault scenario records the same bits and event kinds, with
// the direct exchange at its default size (odd scenarios) and with every bucket through gloo::allreduce's ring.
TEST(StartedAllReduce, EveryScenarioRecordsTheSameOverGloosTcpAndInProcessTransports) {
  const size_t runs = ForEachShortScenario([](const core::Scenario& s, size_t index, const std::string& what) {
    const int64_t direct = index % 2 == 0 ? 0 : sim::SimOptions().gloo_direct_allreduce_bytes;
    testing::ExpectSameTraces(RunWorld(s, "gloo", "tcp", direct), RunWorld(s, "gloo", "inproc", direct), what);
  });
  EXPECT_GE(runs, 25u);
}

// A rank that skips a bucket's all-reduce and goes on to its SyncBatchNorm's collective (drop-bucket at step 2,
// QA round 18): the other ranks' bucket all-reduce meets that collective and every rank sees the mismatch at
// the same collective. A rank whose started all-reduce failed then issues nothing more in that backward, so no
// rank waits out the timeout in the next collective, over Gloo (the bucket started on the collective thread, or
// a small one run at once) as over the in-memory communicator; and the diagnosis names drop-bucket, though the
// dropping rank's next collective is an all-reduce too.
TEST(StartedAllReduce, AFailedBucketAllReduceEndsTheBackwardOnEveryCommunicatorAlike) {
  for (int width : {512, 32}) {  // 1 MiB buckets (started), 4 KiB ones (the direct exchange, at once)
    nlohmann::json j = {
        {"name", "drop-bucket-syncbn"},
        {"model", nlohmann::json::array({{{"type", "linear"}, {"in", 64}, {"out", width}},
                                         {{"type", "syncbatchnorm1d"}, {"features", width}},
                                         {{"type", "relu"}},
                                         {{"type", "linear"}, {"in", width}, {"out", width}},
                                         {{"type", "relu"}},
                                         {{"type", "linear"}, {"in", width}, {"out", 8}}})},
        {"loss", "mse"},
        {"init", {{"kind", "seed"}, {"seeds", {0, 1, 2, 3}}}},
        {"data", {{"kind", "regression"}, {"samples", 160}, {"in_features", 64}, {"out_features", 8}, {"seed", 5}}},
        {"world", 4},
        {"batch_size", 8},
        {"ddp", {{"bucket_cap_mb", 1}, {"timeout_ms", 20000}}},
        {"optimizer", {{"type", "sgd"}, {"lr", 0.01}, {"momentum", 0.9}}},
        {"precision", "fp32"},
        {"epochs", 1},
        {"steps", 4}};
    core::Scenario s;
    ASSERT_TRUE(core::ParseScenario(j, "drop-bucket-syncbn", "", &s).ok());
    core::FaultSpec fault;
    ASSERT_TRUE(core::ParseFaultSpec("drop-bucket@2:2", &fault).ok());
    s.faults.push_back(fault);
    ASSERT_TRUE(core::MaterializeData(&s).ok());
    for (const std::string how : {"gloo/inproc", "gloo/tcp", "local"}) {
      const std::string comm = how.substr(0, how.find('/'));
      const std::string transport = how == "gloo/tcp" ? "tcp" : "inproc";
      sim::SimOptions opts;
      opts.comm = comm;
      opts.gloo_transport = transport;
      opts.timeout = std::chrono::milliseconds(20000);  // a rank that waited it out would take 20 s
      opts.run_id = "drop-bucket-syncbn-" + comm + transport + std::to_string(width);
      core::Trace trace;
      const auto start = std::chrono::steady_clock::now();
      ASSERT_TRUE(sim::RunSim(s, opts, &trace).ok());
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      EXPECT_LT(seconds, 10.0) << how << " width " << width << ": some rank waited for a timeout";
      std::vector<int> ranks;
      for (const auto& e : trace.events()) {
        EXPECT_EQ(e.kind, "ddp_error") << how << " width " << width << ": " << e.message;
        EXPECT_NE(e.message.find("collective #33 "), std::string::npos) << how << " width " << width << ": " << e.message;
        ranks.push_back(e.rank);
      }
      std::sort(ranks.begin(), ranks.end());
      EXPECT_EQ(ranks, (std::vector<int>{0, 1, 2, 3})) << how << " width " << width;
      // The pattern is named though the dropping rank's next collective is an all-reduce too (the SyncBN's).
      testing::TempDir dir;
      std::ofstream(dir.File("s.json")) << j.dump();
      const testing::CliResult r =
          testing::RunCli("run " + dir.File("s.json") + " --fault drop-bucket@2:2 -q --comm " + comm +
                          (comm == "gloo" ? " --gloo-transport " + transport : ""));
      EXPECT_EQ(r.exit_code, 1) << r.err;
      EXPECT_NE(r.out.find("matches 'drop-bucket'"), std::string::npos) << how << " width " << width << ": " << r.out;
    }
  }
}

}  // namespace
}  // namespace ddpcheck
