// The reference computes each step as the CPU world does, down to DDP's average: each rank's gradient scaled into
// its bucket slot and the bucket summed in Gloo's ring order (core/gloo_ring.h) over the layout DDP uses at that
// step (the initial one, then the one rebuilt from rank 0's gradient-ready order). So a correct CPU world is
// bitwise equal to its reference at every checkpoint, and `ddpcheck run` judges it so without the step-local
// replay (harness/check.cc); a world that differs anywhere is replayed as before.
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/compare.h"
#include "core/faults.h"
#include "core/scenario.h"
#include "core/train_loop.h"
#include "core/trace.h"
#include "harness/check.h"
#include "reference/trainer.h"
#include "sim/world.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

core::Trace RunWorld(const core::Scenario& s, const std::string& comm) {
  sim::SimOptions opts;
  opts.comm = comm;
  core::Trace trace;
  const core::Status st = sim::RunSim(s, opts, &trace);
  EXPECT_TRUE(st.ok()) << st.message();
  return trace;
}

void ExpectBitwise(const core::Scenario& s, const std::string& what, const std::string& comm = "local") {
  const core::Trace world = RunWorld(s, comm);
  core::Trace ref;
  ASSERT_TRUE(ref::RunReference(core::OracleScenario(s), &ref).ok()) << what;
  std::string why;
  EXPECT_TRUE(core::BitwiseAgrees(world, ref, &why)) << what << ": " << why;
}

core::Scenario Shipped(const std::string& name) {
  core::Scenario s;
  EXPECT_TRUE(core::LoadScenario(std::string(testing::SourceDir()) + "/scenarios/" + name, &s).ok()) << name;
  EXPECT_TRUE(core::MaterializeData(&s).ok()) << name;
  s.steps = std::min<int64_t>(s.steps < 0 ? 6 : s.steps, 6);  // past the bucket rebuild (step 1)
  return s;
}

TEST(ReferenceRing, EveryShippedScenarioAndItsDdpVariantsAreBitwiseTheCpuWorld) {
  size_t runs = 0;
  for (const char* name : {"default.json", "exact_mlp.json", "tutorial_linear.json", "tutorial_toymodel.json"}) {
    const core::Scenario base = Shipped(name);
    std::vector<std::pair<std::string, core::Scenario>> variants{{"as shipped", base}};
    for (int world : {1, 2, 3, 5}) {
      core::Scenario w = base;
      w.world = world;
      variants.emplace_back("W = " + std::to_string(world), w);
    }
    core::Scenario small = base;  // many buckets, chunk boundaries inside parameters
    small.ddp.bucket_cap_mb = 0.0005;
    small.ddp.first_bucket_bytes = 300;
    small.world = 3;
    variants.emplace_back("buckets of ~500 bytes, W = 3", small);
    core::Scenario view = base;
    view.ddp.gradient_as_bucket_view = !base.ddp.gradient_as_bucket_view;
    variants.emplace_back("gradient_as_bucket_view flipped", view);
    core::Scenario unused = base;
    unused.ddp.find_unused_parameters = !base.ddp.find_unused_parameters;
    variants.emplace_back("find_unused_parameters flipped", unused);
    core::Scenario accum = base;
    accum.ddp.no_sync_steps = 2;
    variants.emplace_back("no_sync window of 2", accum);
    core::Scenario adam = base;
    adam.optimizer.type = "adam";
    adam.optimizer.lr = 1e-3;
    variants.emplace_back("Adam", adam);
    core::Scenario f64 = base;
    f64.precision = f64.precision == core::DType::kFloat64 ? core::DType::kFloat32 : core::DType::kFloat64;
    variants.emplace_back("the other precision", f64);
    for (const auto& [variant, s] : variants) {
      ExpectBitwise(s, std::string(name) + ", " + variant);
      ++runs;
    }
  }
  EXPECT_GE(runs, 40u);
}

TEST(ReferenceRing, HoldsOverGlooWhereItCapsItsSegmentsAtOneMiB) {
  // Buckets of more than 2W MiB: Gloo caps its segments at 1 MiB, so a rank's chunk is several segments.
  core::Scenario s = Shipped("default.json");
  ASSERT_EQ(s.data.x.shape.size(), 2u);
  ASSERT_EQ(s.data.y.shape.size(), 2u);
  const int64_t in = s.data.x.shape[1], out = s.data.y.shape[1];
  auto layer = [](const char* type, int64_t in_features = 0, int64_t out_features = 0) {
    core::LayerSpec l;
    l.type = type;
    l.in_features = in_features;
    l.out_features = out_features;
    return l;
  };
  s.model = {layer("linear", in, 2000), layer("relu"), layer("linear", 2000, 1500), layer("relu"),
             layer("linear", 1500, out)};
  s.steps = 3;
  s.world = 4;
  ExpectBitwise(s, "a 12 MB layer in a bucket of more than 8 MiB, over Gloo, W = 4", "gloo");
}

TEST(ReferenceRing, ABitwiseRunIsJudgedWithoutTheReplayAndADifferingOneWithIt) {
  core::Scenario s = Shipped("default.json");
  core::RunReport clean;
  ASSERT_TRUE(harness::Check(s, harness::CheckOptions(), &clean).ok());
  EXPECT_TRUE(clean.pass());
  EXPECT_EQ(clean.against, "reference, bitwise");
  EXPECT_EQ(clean.result.derivation.rfind("bitwise", 0), 0u) << clean.result.derivation;

  core::Scenario faulted;
  ASSERT_TRUE(core::LoadScenario(std::string(testing::SourceDir()) + "/scenarios/faults/loss-times-world.json", &faulted).ok());
  core::RunReport report;
  ASSERT_TRUE(harness::Check(faulted, harness::CheckOptions(), &report).ok());
  EXPECT_FALSE(report.pass());
  EXPECT_EQ(report.against, "reference, step-local");
  ASSERT_TRUE(report.diagnosis.has_value());
  EXPECT_EQ(report.diagnosis->pattern, "loss-times-world");
}

}  // namespace
}  // namespace ddpcheck
