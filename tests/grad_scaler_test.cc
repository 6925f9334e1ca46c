// GradScaler against torch 1.13's update rule: tests/golden/scaler.json (golden README section 5), the table
// and facts of SEMANTICS.md 5.1, torch's state_dict names and stage errors, and clip_grad_norm_'s coefficient.
#include "core/grad_scaler.h"

#include <bit>
#include <cmath>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck::core {
namespace {

GradScaler Make(double init, double growth, double backoff, int64_t interval) {
  GradScaler s;
  Status st = GradScaler::Create({init, growth, backoff, interval}, &s);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return s;
}

// One training iteration through the stage machine: step() (implicit unscale_) then update().
bool Iterate(GradScaler& s, bool found_inf) {
  bool skipped = false;
  EXPECT_TRUE(s.StepOptimizer([found_inf] { return found_inf; }, &skipped).ok());
  EXPECT_TRUE(s.UpdateAfterStep().ok());
  return skipped;
}

TEST(GradScaler, ReproducesEveryGoldenRunBitwise) {
  const nlohmann::json g = testing::LoadGolden("scaler.json");
  ASSERT_FALSE(g["runs"].empty());
  for (const auto& run : g["runs"]) {
    SCOPED_TRACE(run["config"].get<std::string>() + " seed " + run["seq_seed"].dump());
    GradScaler s = Make(run["init_scale"].get<double>(), run["growth_factor"].get<double>(),
                        run["backoff_factor"].get<double>(), run["growth_interval"].get<int64_t>());
    const std::string found_inf = run["found_inf"].get<std::string>();
    const auto& scales = run["scale_after_update"];
    const auto& trackers = run["growth_tracker_after_update"];
    ASSERT_EQ(scales.size(), found_inf.size());
    std::vector<int> skipped;
    for (size_t i = 0; i < found_inf.size(); ++i) {
      if (Iterate(s, found_inf[i] == '1')) skipped.push_back(static_cast<int>(i));
      const float want = static_cast<float>(scales[i].get<double>());
      ASSERT_EQ(std::bit_cast<uint32_t>(s.scale()), std::bit_cast<uint32_t>(want)) << "step " << i;
      ASSERT_EQ(static_cast<double>(s.scale()), scales[i].get<double>()) << "step " << i;
      ASSERT_EQ(s.growth_tracker(), trackers[i].get<int>()) << "step " << i;
    }
    EXPECT_EQ(skipped, run["skipped_steps"].get<std::vector<int>>());
    EXPECT_EQ(static_cast<int>(skipped.size()), run["n_skipped"].get<int>());
    EXPECT_EQ(static_cast<double>(s.scale()), run["final_scale"].get<double>());
  }
}

TEST(GradScaler, FollowsTheSemanticsTableWithGrowthIntervalThree) {
  // SEMANTICS.md 5.1: init 65536, growth 2, backoff 0.5, interval 3.
  const std::string inf = "001000110000";
  const float scale[] = {65536, 65536, 32768, 32768, 32768, 65536, 32768, 16384, 16384, 16384, 32768, 32768};
  const int tracker[] = {1, 2, 0, 1, 2, 0, 0, 0, 1, 2, 0, 1};
  GradScaler s = Make(65536, 2.0, 0.5, 3);
  for (size_t k = 0; k < inf.size(); ++k) {
    EXPECT_EQ(Iterate(s, inf[k] == '1'), inf[k] == '1') << k;
    EXPECT_EQ(s.scale(), scale[k]) << k;
    EXPECT_EQ(s.growth_tracker(), tracker[k]) << k;
  }
}

TEST(GradScaler, DefaultsGrowOnlyOnTheTwoThousandthCleanStep) {
  GradScaler s;
  EXPECT_EQ(s.scale(), 65536.0f);
  for (float want : {32768.0f, 16384.0f, 8192.0f}) {
    s.Update(true);
    EXPECT_EQ(s.scale(), want);
  }
  for (int i = 0; i < 1999; ++i) s.Update(false);
  EXPECT_EQ(s.scale(), 8192.0f);
  EXPECT_EQ(s.growth_tracker(), 1999);
  s.Update(false);
  EXPECT_EQ(s.scale(), 16384.0f);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScaler, TwentyInfsFromDefaultScaleGiveOneSixteenth) {
  GradScaler s;
  for (int i = 0; i < 20; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 0.0625f);
}

TEST(GradScaler, RefusesToGrowToInfButStillResetsTheTracker) {
  GradScaler s = Make(0x1p127, 2.0, 0.5, 1);
  s.Update(false);
  EXPECT_EQ(s.scale(), 0x1p127f);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScaler, UnderflowsThroughSubnormalsToZeroAndStaysZero) {
  GradScaler s = Make(1.0, 2.0, 0.5, 1);
  for (int i = 0; i < 149; ++i) s.Update(true);
  EXPECT_EQ(s.scale(), 0x1p-149f);  // the smallest subnormal
  s.Update(true);
  EXPECT_EQ(s.scale(), 0.0f);  // 2^-149 * 0.5 rounds to even: 0
  s.Update(false);             // growth: 0 * 2 = 0, finite, accepted
  EXPECT_EQ(s.scale(), 0.0f);
  EXPECT_TRUE(std::isinf(s.inv_scale()));
}

TEST(GradScaler, NonPowerOfTwoFactorsRoundTheDoubleProductToFloat) {
  GradScaler s = Make(3.0, 1.1, 0.3, 2);
  s.Update(true);  // 3 * 0.3 = 0.8999999999999999 (double) -> float 0.9f
  EXPECT_EQ(s.scale(), 0.9f);
  s.Update(false);
  s.Update(false);  // 0.9f * 1.1 in double, rounded to float (numpy); a float32 product would be 0.99000001f
  EXPECT_EQ(s.scale(), 0x1.fae146p-1f);  // 0.9899999499320984
}

TEST(GradScaler, InvScaleIsTheDoubleReciprocalRoundedToFloat) {
  EXPECT_EQ(GradScaler().inv_scale(), 0x1p-16f);
  EXPECT_EQ(Make(3.0, 2.0, 0.5, 1).inv_scale(), 0x1.555556p-2f);
  EXPECT_EQ(UnscaleValue(12.0f, 1.0f), 12.0f);
  EXPECT_EQ(UnscaleValue(12.0f, 0.25f), 3.0f);
}

TEST(GradScaler, ConstructorRejectsGrowthAtMostOneAndBackoffAtLeastOne) {
  GradScaler s;
  EXPECT_EQ(GradScaler::Create({65536, 1.0, 0.5, 2000}, &s).code(), Code::kInvalidArgument);
  EXPECT_EQ(GradScaler::Create({65536, 2.0, 1.0, 2000}, &s).code(), Code::kInvalidArgument);
  EXPECT_EQ(GradScaler::Create({65536, 2.0, 0.5, int64_t{1} << 40}, &s).code(), Code::kInvalidArgument);
  EXPECT_TRUE(GradScaler::Create({65536, 1.5, 0.9, 7}, &s).ok());
}

TEST(GradScaler, NewScaleOverwritesTheScaleAndKeepsTheTracker) {
  GradScaler s = Make(1024, 2.0, 0.5, 10);
  Iterate(s, false);
  Iterate(s, false);
  bool skipped = true;
  ASSERT_TRUE(s.StepOptimizer([] { return false; }, &skipped).ok());
  ASSERT_TRUE(s.UpdateAfterStep(7.0f).ok());
  EXPECT_EQ(s.scale(), 7.0f);
  EXPECT_EQ(s.growth_tracker(), 2);
  EXPECT_EQ(s.stage(), ScalerStage::kReady);
}

TEST(GradScaler, StateDictUsesTorchNamesAndRoundTrips) {
  GradScaler a = Make(3.0, 1.1, 0.3, 5);
  for (bool inf : {true, false, false, true, false}) a.Update(inf);
  const nlohmann::json sd = a.StateDict();
  EXPECT_EQ(sd.size(), 5u);
  for (const char* key : {"scale", "growth_factor", "backoff_factor", "growth_interval", "_growth_tracker"}) {
    EXPECT_TRUE(sd.contains(key)) << key;
  }
  EXPECT_EQ(sd["_growth_tracker"].get<int>(), 1);
  GradScaler b;
  ASSERT_TRUE(b.LoadStateDict(nlohmann::json::parse(sd.dump())).ok());
  EXPECT_EQ(std::bit_cast<uint32_t>(b.scale()), std::bit_cast<uint32_t>(a.scale()));
  EXPECT_EQ(b.growth_tracker(), a.growth_tracker());
  EXPECT_EQ(b.StateDict(), sd);
  for (bool inf : {false, false, false, false, true, false}) {
    a.Update(inf);
    b.Update(inf);
    EXPECT_EQ(std::bit_cast<uint32_t>(b.scale()), std::bit_cast<uint32_t>(a.scale()));
  }
}

TEST(GradScaler, LoadStateDictRejectsEmptyAndIncompleteDicts) {
  GradScaler s;
  Status empty = s.LoadStateDict(nlohmann::json::object());
  EXPECT_NE(empty.message().find("The source state dict is empty"), std::string::npos) << empty.ToString();
  nlohmann::json partial = GradScaler().StateDict();
  partial.erase("_growth_tracker");
  EXPECT_EQ(s.LoadStateDict(partial).code(), Code::kInvalidArgument);
}

TEST(GradScaler, UnscaleTwiceBeforeUpdateIsAnErrorAndLeavesGradsAlone) {
  GradScaler s;
  int calls = 0;
  auto unscale = [&calls] { ++calls; return false; };
  ASSERT_TRUE(s.UnscaleGrads(unscale).ok());
  Status again = s.UnscaleGrads(unscale);
  EXPECT_EQ(again.message(), "unscale_() has already been called on this optimizer since the last update().");
  EXPECT_EQ(calls, 1);
  bool skipped = true;
  ASSERT_TRUE(s.StepOptimizer(unscale, &skipped).ok());  // already unscaled: step does not unscale again
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(skipped);
  EXPECT_EQ(s.UnscaleGrads(unscale).message(), "unscale_() is being called after step().");
  EXPECT_EQ(s.StepOptimizer(unscale, &skipped).message(), "step() has already been called since the last update().");
  ASSERT_TRUE(s.UpdateAfterStep().ok());
  EXPECT_TRUE(s.UnscaleGrads(unscale).ok());  // a new iteration
  EXPECT_EQ(calls, 2);
}

TEST(GradScaler, UpdateWithoutAnyInfCheckIsAnError) {
  GradScaler s;
  EXPECT_EQ(s.UpdateAfterStep().message(), "No inf checks were recorded prior to update.");
  EXPECT_EQ(s.scale(), 65536.0f);
}

TEST(GradScaler, StepIsSkippedWhenUnscaleFoundInf) {
  GradScaler s;
  ASSERT_TRUE(s.UnscaleGrads([] { return true; }).ok());
  bool skipped = false;
  ASSERT_TRUE(s.StepOptimizer([] { return false; }, &skipped).ok());
  EXPECT_TRUE(skipped);
  ASSERT_TRUE(s.UpdateAfterStep().ok());
  EXPECT_EQ(s.scale(), 32768.0f);
}

// clip_grad_norm_ (torch 1.13): values from torch.clamp(max_norm / (torch.tensor(total, dtype) + 1e-6), max=1.0).
TEST(ClipCoef, Float32IsReciprocalThenMultiplyNotDivision) {
  // A direct float32 division would give 0.0045186555944383144.
  EXPECT_EQ(ClipCoef(779.1397425339685, 3.5206643379242974, DType::kFloat32), 0.004518656060099602);
  EXPECT_EQ(ClipCoef(1.0, 1.0, DType::kFloat32), 0.9999990463256836);
}

TEST(ClipCoef, Float64IsReciprocalThenMultiplyNotDivision) {
  // A direct double division would give 0.0016296387940445839.
  EXPECT_EQ(ClipCoef(370.58521138153117, 0.6039200385961945, DType::kFloat64), 0.001629638794044584);
  EXPECT_EQ(ClipCoef(1.0, 1.0, DType::kFloat64), 0.9999990000010001);
}

TEST(ClipCoef, IsClampedToOneAndPropagatesNan) {
  EXPECT_EQ(ClipCoef(0.5, 1.0, DType::kFloat32), 1.0);
  EXPECT_EQ(ClipCoef(0.0, 1.0, DType::kFloat64), 1.0);
  EXPECT_EQ(ClipCoef(INFINITY, 1.0, DType::kFloat32), 0.0);
  EXPECT_TRUE(std::isnan(ClipCoef(NAN, 1.0, DType::kFloat32)));
}

}  // namespace
}  // namespace ddpcheck::core
