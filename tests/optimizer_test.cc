// SGD / Adam / AdamW against trajectories recorded from torch 1.13 (tests/golden/optimizer.json, written by
// tools/gen_optimizer_golden.py): every parameter after every step, and the final state, bitwise.
#include "core/optimizer.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace ddpcheck::core {
namespace {

using nlohmann::json;

OptimizerSpec SpecFrom(const json& j) {
  OptimizerSpec s;
  s.type = j.at("type").get<std::string>();
  s.momentum = j.at("momentum").get<double>();
  s.dampening = j.at("dampening").get<double>();
  s.weight_decay = j.at("weight_decay").get<double>();
  s.nesterov = j.at("nesterov").get<bool>();
  s.maximize = j.at("maximize").get<bool>();
  if (s.type != "sgd") {
    s.beta1 = j.at("beta1").get<double>();
    s.beta2 = j.at("beta2").get<double>();
    s.eps = j.at("eps").get<double>();
  }
  return s;
}

template <typename T>
std::vector<T> Values(const json& j) {
  std::vector<T> v;
  for (const auto& x : j) v.push_back(static_cast<T>(x.get<double>()));  // float32 values are exact doubles
  return v;
}

// Bitwise equality of two arrays; the message names the first differing element.
template <typename T>
::testing::AssertionResult SameBits(const std::vector<T>& got, const std::vector<T>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << "element " << i << ": got " << got[i] << " want " << want[i]
                                           << " (diff " << (got[i] - want[i]) << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

template <typename T>
void ReplayCase(const json& c) {
  const OptimizerSpec spec = SpecFrom(c.at("optimizer"));
  std::vector<T> p = Values<T>(c.at("p0"));
  ParamState<T> st;
  const auto& lrs = c.at("lrs");
  for (size_t k = 0; k < lrs.size(); ++k) {
    std::vector<T> g = Values<T>(c.at("grads")[k]);
    OptimizerStep<T>(spec, lrs[k].get<double>(), p.data(), g.data(), static_cast<int64_t>(p.size()), &st);
    ASSERT_TRUE(SameBits(p, Values<T>(c.at("params")[k]))) << "step " << k;
  }
  const json& state = c.at("state");
  if (spec.type == "sgd") {
    if (state.at("momentum_buffer").is_null()) {
      EXPECT_TRUE(st.momentum_buffer.empty());
    } else {
      EXPECT_TRUE(SameBits(st.momentum_buffer, Values<T>(state.at("momentum_buffer"))));
    }
  } else {
    EXPECT_EQ(static_cast<double>(st.step), state.at("step").get<double>());
    EXPECT_TRUE(SameBits(st.exp_avg, Values<T>(state.at("exp_avg"))));
    EXPECT_TRUE(SameBits(st.exp_avg_sq, Values<T>(state.at("exp_avg_sq"))));
  }
}

class OptimizerGolden : public ::testing::TestWithParam<std::string> {};

TEST_P(OptimizerGolden, MatchesTorchBitwiseAtEveryStep) {
  const json golden = testing::LoadGolden("optimizer.json");
  for (const json& c : golden.at("cases")) {
    if (c.at("name").get<std::string>() != GetParam()) continue;
    if (c.at("dtype").get<std::string>() == "float32") {
      ReplayCase<float>(c);
    } else {
      ReplayCase<double>(c);
    }
    return;
  }
  FAIL() << "no golden case " << GetParam();
}

std::vector<std::string> CaseNames() {
  std::vector<std::string> names;
  const json golden = testing::LoadGolden("optimizer.json");
  for (const json& c : golden.at("cases")) names.push_back(c.at("name"));
  return names;
}

INSTANTIATE_TEST_SUITE_P(Torch113, OptimizerGolden, ::testing::ValuesIn(CaseNames()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(OptimizerGolden, CoversEveryOptimizerAndBothPrecisions) {
  int sgd = 0, adam = 0, adamw = 0, f32 = 0, f64 = 0;
  const json golden = testing::LoadGolden("optimizer.json");
  for (const json& c : golden.at("cases")) {
    const std::string type = c.at("optimizer").at("type");
    sgd += type == "sgd";
    adam += type == "adam";
    adamw += type == "adamw";
    f32 += c.at("dtype") == "float32";
    f64 += c.at("dtype") == "float64";
  }
  EXPECT_GE(sgd, 8);
  EXPECT_GE(adam, 4);
  EXPECT_GE(adamw, 2);
  EXPECT_GT(f32, 0);
  EXPECT_GT(f64, 0);
}

TEST(SgdStep, FirstMomentumStepCopiesTheGradientWithoutDampening) {
  OptimizerSpec s;
  s.momentum = 0.9;
  s.dampening = 0.5;
  std::vector<double> p = {1.0}, g = {0.25};
  ParamState<double> st;
  OptimizerStep<double>(s, 0.5, p.data(), g.data(), 1, &st);
  EXPECT_EQ(st.momentum_buffer, std::vector<double>{0.25});
  EXPECT_EQ(p[0], 1.0 - 0.5 * 0.25);
  // Second step: buf = 0.25 * 0.9 + (1 - 0.5) * 0.25 = 0.35.
  OptimizerStep<double>(s, 0.5, p.data(), g.data(), 1, &st);
  EXPECT_DOUBLE_EQ(st.momentum_buffer[0], 0.35);
}

TEST(SgdStep, AddWithAlphaIsOneFusedRoundingInFloat32) {
  // p.add_(g, alpha=-lr) on float32 is fmaf(fl32(-lr), g, p). These values tell the two apart.
  OptimizerSpec s;
  float p = -0.287635207f, g = 1.52536726f;
  const float scaled = static_cast<float>(-0.1) * g;
  const float unfused = p + scaled;
  const float fused = std::fma(static_cast<float>(-0.1), g, p);
  ASSERT_NE(fused, unfused);
  ParamState<float> st;
  OptimizerStep<float>(s, 0.1, &p, &g, 1, &st);
  EXPECT_EQ(p, fused);
}

TEST(ValidateOptimizerSpec, RejectsWhatTorchConstructorsReject) {
  OptimizerSpec s;
  s.nesterov = true;
  EXPECT_NE(ValidateOptimizerSpec(s).message().find("Nesterov momentum requires a momentum and zero dampening"),
            std::string::npos);
  s = OptimizerSpec();
  s.lr = -1;
  EXPECT_FALSE(ValidateOptimizerSpec(s).ok());
  s = OptimizerSpec();
  s.type = "adam";
  s.beta2 = 1.0;
  EXPECT_FALSE(ValidateOptimizerSpec(s).ok());
  s.type = "lbfgs";  // an optimizer core/optimizer.h does not implement
  EXPECT_FALSE(ValidateOptimizerSpec(s).ok());
  EXPECT_TRUE(ValidateOptimizerSpec(OptimizerSpec()).ok());
}

}  // namespace
}  // namespace ddpcheck::core
