// RMSprop, Adagrad, Adadelta and Adam/AdamW(amsgrad=True) against trajectories recorded from torch 1.13
// (tests/golden/optimizer_more.json, written by tools/gen_optimizer_more_golden.py): every parameter after every
// step, bitwise. The spec comes from the param group's own keys through OptimizerSpecFromGroup, as the protocol
// check of recorded runs reads them.
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "core/dump_protocol.h"
#include "core/optimizer.h"
#include "tests/test_util.h"

namespace ddpcheck::core {
namespace {

using nlohmann::json;

template <typename T>
void Replay(const json& c) {
  OptimizerSpec spec;
  ASSERT_TRUE(OptimizerSpecFromGroup(c.at("optimizer").at("type"), c.at("optimizer"), &spec).ok());
  std::vector<T> p;
  for (const auto& x : c.at("p0")) p.push_back(static_cast<T>(x.get<double>()));
  ParamState<T> st;
  for (size_t k = 0; k < c.at("lrs").size(); ++k) {
    std::vector<T> g;
    for (const auto& x : c.at("grads")[k]) g.push_back(static_cast<T>(x.get<double>()));
    OptimizerStep<T>(spec, c.at("lrs")[k].get<double>(), p.data(), g.data(), static_cast<int64_t>(p.size()), &st);
    const auto& want = c.at("params")[k];
    for (size_t i = 0; i < p.size(); ++i) {
      const T w = static_cast<T>(want[i].get<double>());
      ASSERT_EQ(std::memcmp(&p[i], &w, sizeof(T)), 0)
          << c.at("name").get<std::string>() << " step " << k << " element " << i << ": got " << p[i] << " want " << w;
    }
  }
}

TEST(OptimizerMoreGolden, EveryCaseMatchesTorchBitwiseAtEveryStep) {
  const json golden = testing::LoadGolden("optimizer_more.json");
  ASSERT_GE(golden.at("cases").size(), 18u);
  for (const json& c : golden.at("cases")) {
    SCOPED_TRACE(c.at("name").get<std::string>());
    if (c.at("dtype") == "float32") {
      Replay<float>(c);
    } else {
      Replay<double>(c);
    }
  }
}

TEST(OptimizerSpecFromGroup, RejectsAnUnknownOptimizerNamingIt) {
  OptimizerSpec spec;
  const Status st = OptimizerSpecFromGroup("lbfgs", json{{"lr", 0.1}}, &spec);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("lbfgs"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace ddpcheck::core
