// AMP end to end: the default scenario under fp16 / bf16 autocast passes against the reference; a huge init
// scale overflows on step 0 on every rank and the scale backs off identically everywhere; the recorded scaler
// sequence is what core::GradScaler gives for the recorded found_inf sequence; an inf on one rank's local
// gradient reaches every rank through Gloo's SUM.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include <gtest/gtest.h>

#include "core/faults.h"
#include "core/grad_scaler.h"
#include "core/scenario.h"
#include "core/train_loop.h"
#include "harness/check.h"
#include "harness/tolerance.h"
#include "reference/step_local.h"
#include "tests/amp_world.h"

namespace ddpcheck {
namespace {

using core::Checkpoint;
using core::kAllRanks;

core::Scenario AmpDefault(const std::string& dtype) {
  core::Scenario s = core::DefaultScenario();
  s.precision = core::DType::kFloat32;
  s.amp.enabled = true;
  s.amp.dtype = dtype;
  EXPECT_TRUE(core::ValidateScenario(s).ok());
  return s;
}

double Scalar(const core::Trace& t, int64_t step, Checkpoint c, const std::string& name, int rank) {
  const core::Tensor* v = t.Find({step, c, name, rank});
  EXPECT_NE(v, nullptr) << "step " << step << " " << name << " rank " << rank;
  return v ? v->data.at(0) : std::nan("");
}

int64_t Steps(const core::Trace& ref) {
  int64_t steps = 0;
  for (const auto& [key, v] : ref.records()) {
    if (key.checkpoint == Checkpoint::kScaler) steps = std::max(steps, key.step + 1);
  }
  return steps;
}

// The scaler state every rank and the reference recorded equals core::GradScaler fed with the reference's
// found_inf sequence, bitwise. Returns the found_inf sequence.
std::vector<bool> ExpectScalerSequence(const core::Scenario& s, const core::Trace& got, const core::Trace& ref) {
  core::GradScaler expect;
  EXPECT_TRUE(core::GradScaler::Create({s.amp.init_scale, s.amp.growth_factor, s.amp.backoff_factor,
                                        s.amp.growth_interval},
                                       &expect)
                  .ok());
  std::vector<bool> infs;
  const int64_t steps = Steps(ref);
  EXPECT_GT(steps, 0);
  for (int64_t k = 0; k < steps; ++k) {
    const bool inf = Scalar(ref, k, Checkpoint::kScaler, "found_inf", kAllRanks) != 0;
    infs.push_back(inf);
    expect.Update(inf);
    for (int r = -1; r < s.world; ++r) {
      const core::Trace& t = r < 0 ? ref : got;
      EXPECT_EQ(Scalar(t, k, Checkpoint::kScaler, "scale", r), static_cast<double>(expect.scale()))
          << "step " << k << " rank " << r;
      EXPECT_EQ(Scalar(t, k, Checkpoint::kScaler, "growth_tracker", r), expect.growth_tracker()) << k << " " << r;
      EXPECT_EQ(Scalar(t, k, Checkpoint::kScaler, "found_inf", r), inf ? 1 : 0) << k << " " << r;
      EXPECT_EQ(Scalar(t, k, Checkpoint::kScaler, "skipped", r), inf ? 1 : 0) << k << " " << r;
    }
  }
  return infs;
}

class AmpRun : public ::testing::TestWithParam<std::string> {};

TEST_P(AmpRun, DefaultScenarioPassesAgainstTheReference) {
  const core::Scenario s = AmpDefault(GetParam());
  harness::CheckOptions opts;
  core::RunReport report;
  core::Trace got, ref;
  ASSERT_TRUE(harness::Check(s, opts, &report, &got, &ref).ok());
  EXPECT_TRUE(report.pass()) << (report.result.first ? report.result.first->key.ToString() + " " +
                                                           report.result.first->message
                                                     : std::string("no first mismatch"));
  EXPECT_GT(report.result.stats["unscaled"].compared, 0);
  EXPECT_GT(report.result.stats["scaler"].compared, 0);
  // The CPU world computes its AMP steps as the reference does: bitwise equal, so no step needed the AMP rules'
  // bounds (harness/check.cc); the step-local replay with them is tested below.
  EXPECT_EQ(report.result.derivation.rfind("bitwise", 0), 0u) << report.result.derivation;
  ExpectScalerSequence(s, got, ref);
}

TEST_P(AmpRun, TheStepLocalReplayJudgesItWithTheAmpRules) {
  core::Scenario s = AmpDefault(GetParam());
  core::RunReport report;
  core::Trace got;
  ASSERT_TRUE(harness::Check(s, harness::CheckOptions(), &report, &got, nullptr).ok());
  ASSERT_TRUE(core::MaterializeData(&s).ok());
  core::CompareResult replayed;
  ASSERT_TRUE(ref::CheckStepLocal(core::OracleScenario(s), got, harness::PolicyFor(harness::SourceKind::kSim, s, false),
                                  &replayed).ok());
  EXPECT_TRUE(replayed.pass) << (replayed.first ? replayed.first->key.ToString() : std::string());
  EXPECT_NE(replayed.derivation.find("AMP"), std::string::npos) << replayed.derivation;
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AmpRun, ::testing::Values("fp16", "bf16"));

TEST(AmpRun, ClippingAfterUnscaleBoundsTheUnscaledGradNormAndPasses) {
  core::Scenario s = AmpDefault("fp16");
  s.amp.clip_grad_norm = 0.05;
  s.steps = 6;
  harness::CheckOptions opts;
  core::RunReport report;
  core::Trace got, ref;
  ASSERT_TRUE(harness::Check(s, opts, &report, &got, &ref).ok());
  EXPECT_TRUE(report.pass()) << (report.result.first ? report.result.first->key.ToString() : "");
  int clipped = 0;
  for (int64_t k = 0; k < 6; ++k) {
    double sq = 0;
    for (const auto& [key, v] : ref.records()) {
      if (key.step != k || key.checkpoint != Checkpoint::kUnscaled) continue;
      for (double x : v->data) sq += x * x;
    }
    // clip_grad_norm_ scales by max_norm / (norm + 1e-6) in fp32: the result is max_norm to fp32 accuracy.
    EXPECT_LE(std::sqrt(sq), 0.05 * (1 + 1e-5)) << "step " << k;
    clipped += std::sqrt(sq) > 0.05 * (1 - 1e-4);
  }
  EXPECT_GT(clipped, 0) << "max_norm 0.05 must be below the default scenario's gradient norm";
}

TEST(AmpRun, HugeInitScaleOverflowsOnStepZeroOnEveryRankAndBacksOffIdentically) {
  core::Scenario s = AmpDefault("fp16");
  s.amp.init_scale = std::ldexp(1.0, 40);
  s.steps = 4;
  harness::CheckOptions opts;
  core::RunReport report;
  core::Trace got, ref;
  ASSERT_TRUE(harness::Check(s, opts, &report, &got, &ref).ok());
  EXPECT_TRUE(report.pass()) << (report.result.first ? report.result.first->key.ToString() : "");
  for (int r = -1; r < s.world; ++r) {
    const core::Trace& t = r < 0 ? ref : got;
    EXPECT_EQ(Scalar(t, 0, Checkpoint::kScaler, "found_inf", r), 1) << r;
    EXPECT_EQ(Scalar(t, 0, Checkpoint::kScaler, "skipped", r), 1) << r;
    EXPECT_EQ(Scalar(t, 0, Checkpoint::kScaler, "scale", r), std::ldexp(1.0, 39)) << r;
  }
  // The skipped step left the parameters as they were initialised (after the initial broadcast).
  for (const auto& [key, v] : ref.records()) {
    if (key.checkpoint != Checkpoint::kInit || !ref.Find({0, Checkpoint::kParams, key.tensor, kAllRanks})) continue;
    EXPECT_TRUE(core::BitwiseEqual(*ref.Find({0, Checkpoint::kParams, key.tensor, kAllRanks}), v)) << key.tensor;
    EXPECT_TRUE(core::BitwiseEqual(*got.Find({0, Checkpoint::kParams, key.tensor, 0}), v)) << key.tensor;
  }
  const std::vector<bool> infs = ExpectScalerSequence(s, got, ref);
  EXPECT_EQ(infs, std::vector<bool>(4, true)) << "2^36 still overflows fp16";
}

TEST(AmpRun, ScalerSequenceBacksOffThenGrowsAsGradScalerSays) {
  // Init 2^24 overflows fp16 for a few steps, then clean steps grow it every 3rd step.
  core::Scenario s = AmpDefault("fp16");
  s.amp.init_scale = std::ldexp(1.0, 24);
  s.amp.growth_interval = 3;
  harness::CheckOptions opts;
  opts.comm = "local";
  core::RunReport report;
  core::Trace got, ref;
  ASSERT_TRUE(harness::Check(s, opts, &report, &got, &ref).ok());
  EXPECT_TRUE(report.pass()) << (report.result.first ? report.result.first->key.ToString() : "");
  const std::vector<bool> infs = ExpectScalerSequence(s, got, ref);
  ASSERT_FALSE(infs.empty());
  EXPECT_TRUE(infs.front()) << "2^24 must overflow fp16 on step 0";
  EXPECT_GE(std::count(infs.begin(), infs.end(), false), 3) << "the scale must come down far enough to grow again";
}

TEST(AmpRun, AnInfOnOneRanksLocalGradReachesEveryRankThroughGlooSum) {
  core::Scenario s = AmpDefault("fp16");
  s.steps = 3;
  ASSERT_TRUE(core::MaterializeData(&s).ok());
  core::Trace got;
  ASSERT_TRUE(testing::RunWorld(s, "gloo", /*inject_rank=*/2, /*inject_backward=*/1, &got).ok());
  for (int r = 0; r < s.world; ++r) {
    EXPECT_EQ(Scalar(got, 0, Checkpoint::kScaler, "found_inf", r), 0) << r;
    EXPECT_EQ(Scalar(got, 1, Checkpoint::kScaler, "found_inf", r), 1) << r;
    EXPECT_EQ(Scalar(got, 1, Checkpoint::kScaler, "skipped", r), 1) << r;
    EXPECT_EQ(Scalar(got, 1, Checkpoint::kScaler, "scale", r), 32768.0) << r;
    EXPECT_EQ(Scalar(got, 2, Checkpoint::kScaler, "found_inf", r), 0) << r;
    // The non-finite element is in every rank's reduced gradient.
    bool non_finite = false;
    for (const auto& [key, v] : got.records()) {
      if (key.step != 1 || key.checkpoint != Checkpoint::kReduced || key.rank != r) continue;
      for (double x : v->data) non_finite |= !std::isfinite(x);
    }
    EXPECT_TRUE(non_finite) << "rank " << r;
  }
  const core::CompareResult inv = core::CheckRankInvariants(got);
  EXPECT_TRUE(inv.pass) << (inv.first ? inv.first->key.ToString() : "");
}

}  // namespace
}  // namespace ddpcheck
