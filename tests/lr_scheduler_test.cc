// LR scheduler chains against torch 1.13: tests/golden/lr.json (shipped fixtures), tests/golden/lr_extra.json
// (tools/gen_lr_golden.py) and the table of SEMANTICS.md 6.3. Every lr is compared bitwise.
#include "core/lr_scheduler.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck::core {
namespace {

using nlohmann::json;

SchedulerSpec FromTorch(const json& s) {
  const std::string type = s.at("type");
  const json& kw = s.at("kwargs");
  SchedulerSpec spec;
  if (type == "StepLR") {
    spec.type = "step";
    spec.step_size = kw.at("step_size");
    spec.gamma = kw.value("gamma", 0.1);
  } else if (type == "MultiStepLR") {
    spec.type = "multistep";
    spec.milestones = kw.at("milestones").get<std::vector<int64_t>>();
    spec.gamma = kw.value("gamma", 0.1);
  } else if (type == "ExponentialLR") {
    spec.type = "exponential";
    spec.gamma = kw.at("gamma");
  } else if (type == "CosineAnnealingLR") {
    spec.type = "cosine";
    spec.t_max = kw.at("T_max");
    spec.eta_min = kw.value("eta_min", 0.0);
  } else if (type == "LinearLR") {
    spec.type = "linear";
    spec.start_factor = kw.value("start_factor", 1.0 / 3);
    spec.end_factor = kw.value("end_factor", 1.0);
    spec.total_iters = kw.value("total_iters", int64_t{5});
  } else {
    ADD_FAILURE() << "unknown scheduler " << type;
  }
  return spec;
}

// Replays one golden case; every lr and every scheduler's get_last_lr must be bitwise torch's.
void ReplayCase(const json& c) {
  SCOPED_TRACE(c.at("name").get<std::string>());
  std::vector<SchedulerSpec> specs;
  for (const json& s : c.at("schedulers_in_step_order")) specs.push_back(FromTorch(s));
  const double lr0 = c.at("optimizer").at("lr");
  LrSchedule sched = c.contains("resume") ? LrSchedule(lr0, c["resume"].at("initial_lr").get<double>(),
                                                       c["resume"].at("last_epoch").get<int64_t>(), specs)
                                          : LrSchedule(lr0, specs);
  const json& lrs = c.at("lrs");
  const json& per = c.at("get_last_lr_per_scheduler");
  ASSERT_EQ(lrs.size(), c.at("epochs").get<size_t>() + 1);
  EXPECT_EQ(sched.lr(), lrs[0].get<double>()) << "after construction";
  for (size_t k = 1; k < lrs.size(); ++k) {
    sched.Step();
    ASSERT_EQ(sched.lr(), lrs[k].get<double>()) << "epoch " << k << ", torch repr " << c.at("lrs_repr")[k];
    ASSERT_EQ(sched.last_lrs(), per[k - 1].get<std::vector<double>>()) << "get_last_lr after epoch " << k;
  }
}

TEST(LrSchedule, ReproducesEveryShippedTorchCaseBitwise) {
  const json golden = testing::LoadGolden("lr.json");
  ASSERT_FALSE(golden.at("cases").empty());
  for (const json& c : golden.at("cases")) ReplayCase(c);
}

TEST(LrSchedule, ReproducesEveryGeneratedTorchCaseBitwise) {
  const json golden = testing::LoadGolden("lr_extra.json");
  ASSERT_GE(golden.at("cases").size(), 10u);
  for (const json& c : golden.at("cases")) ReplayCase(c);
}

TEST(LrSchedule, ExponentialThenCosineMatchesTheSemanticsTable) {
  // SEMANTICS.md 6.3: SGD(lr=0.01), ExponentialLR(0.9) then CosineAnnealingLR(T_max=50), lr during epoch e.
  SchedulerSpec exp;
  exp.type = "exponential";
  exp.gamma = 0.9;
  SchedulerSpec cos;
  cos.type = "cosine";
  cos.t_max = 50;
  cos.eta_min = 0;
  LrSchedule s(0.01, {exp, cos});
  std::vector<double> during;
  for (int e = 0; e < 100; ++e) {
    during.push_back(s.lr());
    s.Step();
  }
  const std::vector<double> head = {0.01,
                                    0.008991120277927223,
                                    0.008068064540323636,
                                    0.0072254370289060715,
                                    0.006457937060082475,
                                    0.005760396811535628,
                                    0.005127811727184692,
                                    0.004555364371153174,
                                    0.004038442508314225,
                                    0.0035726521338717327};
  for (size_t e = 0; e < head.size(); ++e) EXPECT_EQ(during[e], head[e]) << "epoch " << e;
  EXPECT_EQ(during[49], 5.6498878353797995e-08);
  EXPECT_EQ(during[50], 0.0);                    // the cosine factor hits exactly 0
  EXPECT_EQ(during[51], 9.866357858642205e-06);  // restart bump
  EXPECT_EQ(during[52], 3.548384408484956e-05);
  EXPECT_EQ(during[95], 9.460416774169025e-05);
  EXPECT_EQ(during[96], 8.590861055540825e-05);
  EXPECT_EQ(during[97], 7.785598907630144e-05);
  EXPECT_EQ(during[98], 7.041777337292508e-05);
  EXPECT_EQ(during[99], 6.356407787985526e-05);
  EXPECT_EQ(s.lr(), 5.726416897022354e-05);
  // s1.get_last_lr() is what ExponentialLR wrote before the cosine step overwrote the group's lr.
  EXPECT_EQ(s.last_lrs()[0], 5.720767009186974e-05);
}

TEST(LrSchedule, LinearLrAppliesStartFactorAtConstruction) {
  SchedulerSpec lin;
  lin.type = "linear";
  lin.start_factor = 0.5;
  lin.total_iters = 2;
  LrSchedule s(0.5, {lin});
  EXPECT_EQ(s.lr(), 0.25);
  s.Step();  // 0.25 * (1 + 0.5 / (2 * 0.5 + 0)) = 0.375
  EXPECT_EQ(s.lr(), 0.375);
  s.Step();  // 0.375 * (1 + 0.5 / (1 + 0.5)) = 0.5
  EXPECT_EQ(s.lr(), 0.5);
  s.Step();  // past total_iters: unchanged
  EXPECT_EQ(s.lr(), 0.5);
}

TEST(LrSchedule, StepLrMultipliesOnlyAtMultiplesOfStepSize) {
  SchedulerSpec st;
  st.type = "step";
  st.step_size = 2;
  st.gamma = 0.5;
  LrSchedule s(1.0, {st});
  std::vector<double> got = {s.lr()};
  for (int e = 0; e < 5; ++e) {
    s.Step();
    got.push_back(s.lr());
  }
  EXPECT_EQ(got, (std::vector<double>{1.0, 1.0, 0.5, 0.5, 0.25, 0.25}));
}

TEST(ValidateSchedulerSpec, RejectsSpecsTorchRejectsOrCrashesOn) {
  SchedulerSpec s;
  s.type = "cosine";
  s.t_max = 0;
  EXPECT_FALSE(ValidateSchedulerSpec(s).ok());
  s.type = "step";
  s.step_size = 0;
  EXPECT_FALSE(ValidateSchedulerSpec(s).ok());
  s = SchedulerSpec();
  s.type = "linear";
  s.start_factor = 1.5;
  EXPECT_FALSE(ValidateSchedulerSpec(s).ok());
  s.start_factor = 0.5;
  s.end_factor = -0.1;
  EXPECT_FALSE(ValidateSchedulerSpec(s).ok());
  s.type = "plateau";
  EXPECT_NE(ValidateSchedulerSpec(s).message().find("unknown scheduler type 'plateau'"), std::string::npos);
  s = SchedulerSpec();
  s.type = "exponential";
  EXPECT_TRUE(ValidateSchedulerSpec(s).ok());
}

TEST(ParseSchedulerSpec, ReadsEveryTypeWithTorchDefaultsForOmittedKeys) {
  SchedulerSpec s;
  ASSERT_TRUE(ParseSchedulerSpec("step:step_size=3", &s).ok());
  EXPECT_EQ(s.type, "step");
  EXPECT_EQ(s.step_size, 3);
  EXPECT_EQ(s.gamma, 0.1);
  ASSERT_TRUE(ParseSchedulerSpec("multistep:milestones=25|50|75,gamma=0.2", &s).ok());
  EXPECT_EQ(s.milestones, (std::vector<int64_t>{25, 50, 75}));
  EXPECT_EQ(s.gamma, 0.2);
  ASSERT_TRUE(ParseSchedulerSpec("cosine:T_max=50", &s).ok());
  EXPECT_EQ(s.t_max, 50);
  EXPECT_EQ(s.eta_min, 0.0);
  ASSERT_TRUE(ParseSchedulerSpec("linear", &s).ok());
  EXPECT_EQ(s.start_factor, 1.0 / 3);
  EXPECT_EQ(s.end_factor, 1.0);
  EXPECT_EQ(s.total_iters, 5);
  ASSERT_TRUE(ParseSchedulerSpec("exponential:gamma=0.9", &s).ok());
  EXPECT_EQ(s.gamma, 0.9);
}

TEST(ParseSchedulerSpec, RejectsMissingRequiredUnknownRepeatedAndMalformedKeys) {
  SchedulerSpec s;
  EXPECT_NE(ParseSchedulerSpec("exponential", &s).message().find("needs gamma"), std::string::npos);
  EXPECT_NE(ParseSchedulerSpec("cosine:t_max=5,colour=red", &s).message().find("colour"), std::string::npos);
  EXPECT_NE(ParseSchedulerSpec("step:step_size=2,step_size=3", &s).message().find("twice"), std::string::npos);
  EXPECT_FALSE(ParseSchedulerSpec("step:step_size=2.5", &s).ok());
  EXPECT_FALSE(ParseSchedulerSpec("multistep:milestones=1||3", &s).ok());
  EXPECT_FALSE(ParseSchedulerSpec("cosine:t_max=", &s).ok());
  EXPECT_FALSE(ParseSchedulerSpec("linear:start_factor=0", &s).ok());
}

}  // namespace
}  // namespace ddpcheck::core
