// Over Gloo a bucket too large for the direct exchange is all-reduced on the rank's collective thread while
// its backward goes on (Communicator::StartAllReduceSum, sim/collective_queue.h). That must not change one
// recorded bit or what a faulty run reports: every shipped scenario and BUGS.md fault scenario runs over Gloo
// with every bucket started that way (direct exchange off) and over the in-memory communicator, which runs
// each all-reduce at once in the ring's order; the traces (every recorded value, bitwise) and the kinds of
// the events are the same.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/scenario.h"
#include "core/train_loop.h"
#include "core/trace.h"
#include "sim/world.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

core::Trace RunWorld(const core::Scenario& s, const std::string& comm) {
  sim::SimOptions opts;
  opts.comm = comm;
  opts.gloo_direct_allreduce_bytes = 0;  // every bucket through gloo::allreduce, started on the collective thread
  opts.timeout = std::chrono::milliseconds(1500);  // the hang scenarios' ranks give up soon
  opts.run_id = "started-" + comm;
  core::Trace trace;
  const core::Status st = sim::RunSim(s, opts, &trace);
  EXPECT_TRUE(st.ok()) << st.message();
  return trace;
}

TEST(StartedAllReduce, EveryScenarioRecordsTheSameOverGlooAsAllReducedAtOnce) {
  size_t runs = 0;
  for (const std::string& path : testing::ShippedScenarioPaths()) {
    core::Scenario s;
    ASSERT_TRUE(core::LoadScenario(path, &s).ok()) << path;
    ASSERT_TRUE(core::MaterializeData(&s).ok()) << path;
    s.steps = std::min<int64_t>(s.steps < 0 ? 5 : s.steps, 5);  // past the bucket rebuild (step 1)
    const std::string what = std::filesystem::path(path).filename().string();
    const core::Trace gloo = RunWorld(s, "gloo"), local = RunWorld(s, "local");
    std::vector<std::string> only;
    for (const auto& [key, value] : gloo.records()) {
      if (!local.records().count(key)) only.push_back("gloo: step " + std::to_string(key.step) + " " + key.tensor);
    }
    for (const auto& [key, value] : local.records()) {
      auto it = gloo.records().find(key);
      if (it == gloo.records().end()) {
        only.push_back("local: step " + std::to_string(key.step) + " " + key.tensor + " rank " + std::to_string(key.rank));
        continue;
      }
      EXPECT_TRUE(core::BitwiseEqual(*it->second, *value))
          << what << ": step " << key.step << " " << core::CheckpointName(key.checkpoint) << " " << key.tensor
          << " rank " << key.rank;
    }
    EXPECT_TRUE(only.empty()) << what << ": " << only.size() << " records in one trace only, first " << only.front();
    auto kinds = [](const core::Trace& t) {
      std::vector<std::string> k;
      for (const auto& e : t.events()) k.push_back(e.kind);
      std::sort(k.begin(), k.end());
      return k;
    };
    EXPECT_EQ(kinds(gloo), kinds(local)) << what;
    ++runs;
  }
  EXPECT_GE(runs, 25u);
}

}  // namespace
}  // namespace ddpcheck
