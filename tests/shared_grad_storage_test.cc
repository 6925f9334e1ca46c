// The CPU world keeps each grad in its DDP bucket slot (core/reducer.h, Replica::ShareGradStorage): two copies
// fewer per step, an implementation detail that must not change one bit. Every shipped scenario (the default
// ones and the 22 BUGS.md fault scenarios with their faults injected: a dropped bucket, a parameter unused on
// one rank, an unfinished reduction, no_sync accumulation, AMP with clipping...) and variants of them
// (gradient_as_bucket_view, find_unused_parameters, W = 1) run with the grads shared and with every grad in its
// own storage: the traces (every recorded value, bitwise) and the events are the same.
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

core::Trace RunWorld(const core::Scenario& s, bool share) {
  sim::SimOptions opts;
  opts.comm = "local";
  opts.share_grad_storage = share;
  opts.timeout = std::chrono::milliseconds(400);  // the hang scenarios' ranks give up soon
  core::Trace trace;
  const core::Status st = sim::RunSim(s, opts, &trace);
  EXPECT_TRUE(st.ok()) << st.message();
  return trace;
}

TEST(SharedGradStorage, EveryScenarioRecordsTheSameBitsWithTheGradsInTheirBuckets) {
  size_t runs = 0;
  for (const std::string& path : testing::ShippedScenarioPaths()) {
    core::Scenario base;
    ASSERT_TRUE(core::LoadScenario(path, &base).ok()) << path;
    ASSERT_TRUE(core::MaterializeData(&base).ok()) << path;
    base.steps = std::min<int64_t>(base.steps < 0 ? 6 : base.steps, 6);  // past the bucket rebuild (step 1)
    std::vector<std::pair<std::string, core::Scenario>> variants{{"as shipped", base}};
    core::Scenario view = base;
    view.ddp.gradient_as_bucket_view = !base.ddp.gradient_as_bucket_view;
    variants.emplace_back("gradient_as_bucket_view flipped", view);
    core::Scenario unused = base;
    unused.ddp.find_unused_parameters = !base.ddp.find_unused_parameters;
    variants.emplace_back("find_unused_parameters flipped", unused);
    if (base.world > 1 && base.faults.empty()) {
      core::Scenario one = base;
      one.world = 1;
      variants.emplace_back("W = 1", one);
    }
    for (const auto& [name, s] : variants) {
      const std::string what = std::filesystem::path(path).filename().string() + ", " + name;
      testing::ExpectSameTraces(RunWorld(s, true), RunWorld(s, false), what);
      ++runs;
    }
  }
  EXPECT_GE(runs, 80u);
}

}  // namespace
}  // namespace ddpcheck
