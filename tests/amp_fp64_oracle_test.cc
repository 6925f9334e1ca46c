// The float64 oracle of an AMP run (CheckOptions::oracle_precision, AmpSpec::range_only), what gpu-report's
// "vs fp64" column compares every fp16-amp / bf16-amp row with, checked here with the CPU world as the run (the
// GPU world's rows compare the same way; reports/gpu/ has them): the oracle keeps the run's GradScaler, so the
// scaled local and reduced gradients, the unscaled ones and the scaler's state are all compared; a step that
// overflows in the run's low type overflows in the oracle too (the same skips, the same back-off); the run then
// passes within the low type's budget, and an AMP bug still fails.
#include <algorithm>
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "core/faults.h"
#include "core/scenario.h"
#include "harness/check.h"
#include "reference/autocast.h"

namespace ddpcheck {
namespace {

using core::Checkpoint;
using core::kAllRanks;

core::Scenario Amp(core::Scenario s, const std::string& dtype) {
  s.precision = core::DType::kFloat32;
  s.amp.enabled = true;
  s.amp.dtype = dtype;
  EXPECT_TRUE(core::ValidateScenario(s).ok());
  return s;
}

harness::CheckOptions Fp64Oracle() {
  harness::CheckOptions o;
  o.oracle_precision = core::DType::kFloat64;
  return o;
}

std::string First(const core::RunReport& r) {
  return r.result.first ? core::DescribeMismatch(*r.result.first) : std::string("no first mismatch");
}

TEST(OverflowLikeLow, KeepsTheValueAndOverflowsWhereTheCastDoes) {
  using core::DType;
  EXPECT_EQ(ref::OverflowLikeLow(1.0 / 3.0, DType::kFloat16), 1.0 / 3.0);
  EXPECT_EQ(ref::OverflowLikeLow(65519.0, DType::kFloat16), 65519.0);  // rounds to 65504: finite
  EXPECT_EQ(ref::OverflowLikeLow(65520.0, DType::kFloat16), INFINITY);  // rounds to inf
  EXPECT_EQ(ref::OverflowLikeLow(-114688.0, DType::kFloat16), -INFINITY);
  EXPECT_EQ(ref::OverflowLikeLow(1e30, DType::kBFloat16), 1e30);
  EXPECT_TRUE(std::isnan(ref::OverflowLikeLow(NAN, DType::kFloat16)));
  EXPECT_EQ(ref::OverflowLikeLow(INFINITY, DType::kFloat16), INFINITY);
}

class AmpFp64Oracle : public ::testing::TestWithParam<std::string> {};

TEST_P(AmpFp64Oracle, TheDefaultScenarioPassesWithItsScaledGradientsCompared) {
  const core::Scenario s = Amp(core::DefaultScenario(), GetParam());
  core::RunReport report;
  core::Trace got, want;
  ASSERT_TRUE(harness::Check(s, Fp64Oracle(), &report, &got, &want).ok());
  EXPECT_TRUE(report.pass()) << First(report);
  EXPECT_GT(report.result.stats["local_grad"].compared, 0);
  EXPECT_GT(report.result.stats["unscaled"].compared, 0);
  EXPECT_GT(report.result.stats["scaler"].compared, 0);
  EXPECT_EQ(report.result.stats["scaler"].max_abs, 0);
  // The oracle is float64 arithmetic, not the run's: some value differs (the roundings this compares).
  EXPECT_GT(report.result.stats["local_grad"].max_abs, 0);
  // What gpu-report's row prints (harness/gpu/gpu_matrix.cc): per checkpoint the error relative to the reference's
  // scale there, not the 65536x scaled gradients' absolute error nor a near-zero element's relative one, and the
  // fraction of the budget used (within 1: the row passes). The parameters after 48 steps are within 1 % of the
  // fp64 trajectory's scale; a gradient late in training can be off by more than 10 % of its largest element (an
  // MSE gradient is output - target, small once fitted, from an output rounded to the low type), well within
  // its budget.
  ASSERT_FALSE(report.checkpoint_summary.empty());
  double scaled = 0;
  for (const auto& [name, sum] : report.checkpoint_summary) {
    EXPECT_LE(sum.max_budget_used, 1.0) << name;
    scaled = std::max(scaled, sum.max_scaled_err);
  }
  EXPECT_GT(scaled, 0);
  EXPECT_LT(report.checkpoint_summary["params"].max_scaled_err, 0.01);
  EXPECT_GT(report.checkpoint_summary["params"].max_scaled_err, 0);
}

// (fp16: bf16 has float32's range, which a scaled loss in float32 reaches first.)
TEST(AmpFp64OracleFp16, AStepThatOverflowsInTheRunOverflowsInTheOracle) {
  core::Scenario s = Amp(core::DefaultScenario(), "fp16");
  s.amp.init_scale = std::ldexp(1.0, 24);
  s.steps = 4;
  core::RunReport report;
  core::Trace got, want;
  ASSERT_TRUE(harness::Check(s, Fp64Oracle(), &report, &got, &want).ok());
  EXPECT_TRUE(report.pass()) << First(report);
  for (const core::Trace* t : {&got, &want}) {
    const core::Tensor* inf = t->Find({0, Checkpoint::kScaler, "found_inf", t == &got ? 0 : kAllRanks});
    ASSERT_NE(inf, nullptr);
    EXPECT_EQ(inf->data.at(0), 1) << "step 0 must overflow at this scale";
  }
}

TEST_P(AmpFp64Oracle, AnAmpBugStillFails) {
  core::Scenario s = Amp(core::DefaultScenario(), GetParam());
  s.faults.push_back({"clip-before-unscale", -1, -1});
  s.amp.clip_grad_norm = 0.05;
  core::RunReport report;
  ASSERT_TRUE(harness::Check(s, Fp64Oracle(), &report).ok());
  EXPECT_FALSE(report.pass());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, AmpFp64Oracle, ::testing::Values("fp16", "bf16"));

}  // namespace
}  // namespace ddpcheck
