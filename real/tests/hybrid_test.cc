// Hybrid world (CUDA replicas, Gloo collectives, all ranks on one GPU) against the CPU world, W = 2..4: the same
// protocol over the same Gloo ring, so the traces agree within the derived fp32 tolerance (bitwise where the
// scenario is exact by construction), ranks stay bitwise identical, and runs repeat bit for bit.
#include <gtest/gtest.h>

#include "core/compare.h"
#include "core/train_loop.h"
#include "harness/gpu/hybrid_gloo.h"
#include "harness/gpu/rank_setup_ref.h"
#include "real/world.h"
#include "harness/check.h"
#include "sim/world.h"

namespace ddpcheck::real {
namespace {

class HybridWorld : public ::testing::TestWithParam<int> {};

core::Scenario Fp32Scenario(int world) {
  core::Scenario s = core::DefaultScenario();
  s.world = world;
  s.precision = core::DType::kFloat32;
  s.amp.enabled = false;
  s.steps = 4;
  EXPECT_TRUE(core::ValidateScenario(s).ok());
  EXPECT_TRUE(core::MaterializeData(&s).ok());
  return s;
}

TEST_P(HybridWorld, MatchesTheCpuWorldWithinTheDerivedTolerance) {
  const core::Scenario s = Fp32Scenario(GetParam());
  harness::CheckOptions o;  // the hybrid world against the CPU world, through the one harness
  o.got.kind = harness::SourceKind::kHybrid;
  o.want = harness::Source{harness::SourceKind::kSim, ""};
  o.run_id = "hybrid-test-" + std::to_string(s.world);
  core::RunReport report;
  ASSERT_TRUE(harness::Check(s, o, &report).ok());
  EXPECT_TRUE(report.pass()) << core::FormatTerminal(report);
}

TEST_P(HybridWorld, TwoRunsAreBitwiseIdentical) {
  const core::Scenario s = Fp32Scenario(GetParam());
  core::Trace a, b;
  RealOptions ro = harness::WithReferenceSetup(RealOptions{});
  ro.run_id = "hybrid-det-a";
  ASSERT_TRUE(RunReal(s, harness::WithGlooHybrid(ro, s.world), &a).ok());
  ro.run_id = "hybrid-det-b";
  ASSERT_TRUE(RunReal(s, harness::WithGlooHybrid(ro, s.world), &b).ok());
  ASSERT_EQ(a.records().size(), b.records().size());
  for (const auto& [key, t] : a.records()) {
    const core::Tensor* o = b.Find(key);
    ASSERT_NE(o, nullptr) << key.ToString();
    EXPECT_TRUE(core::BitwiseEqual(t, *o)) << key.ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(W, HybridWorld, ::testing::Values(2, 3, 4));

}  // namespace
}  // namespace ddpcheck::real
