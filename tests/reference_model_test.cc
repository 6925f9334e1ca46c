// Model<T>: registration, autograd hook order, grad accumulation, zero_grad, bypassed layers, init, loading.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "reference/model.h"

namespace ddpcheck::ref {
namespace {

core::LayerSpec Lin(int64_t in, int64_t out) {
  core::LayerSpec s;
  s.type = "linear";
  s.in_features = in;
  s.out_features = out;
  return s;
}
core::LayerSpec Bn(int64_t c) {
  core::LayerSpec s;
  s.type = "batchnorm1d";
  s.num_features = c;
  return s;
}
core::LayerSpec Act(const std::string& type) {
  core::LayerSpec s;
  s.type = type;
  return s;
}

// Sequential(Linear(8,16), BatchNorm1d(16), ReLU, Linear(16,4)) with MSE: golden model c.
Model<double> Mlp() {
  Model<double> m;
  core::Status st = Model<double>::Build({Lin(8, 16), Bn(16), Act("relu"), Lin(16, 4)}, "mse", &m);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return m;
}

Matrix<double> Input(int64_t rows, int64_t cols) {
  Matrix<double> x(rows, cols);
  for (Eigen::Index k = 0; k < x.size(); ++k) x.data()[k] = std::sin(1.0 + 0.7 * static_cast<double>(k));
  return x;
}
core::Tensor Target(int64_t rows, int64_t cols) {
  return core::Tensor(core::DType::kFloat64, {rows, cols}, std::vector<double>(static_cast<size_t>(rows * cols), 0.25));
}

// One forward + backward; returns the on_ready order.
std::vector<int> Step(Model<double>& m, int64_t batch = 4) {
  m.Forward(Input(batch, m.widths().in), Target(batch, m.widths().out));
  std::vector<int> order;
  m.Backward(1.0, [&](int i) { order.push_back(i); });
  return order;
}

std::vector<double> GradOf(const Model<double>& m, int i) {
  return {m.grad_data(i), m.grad_data(i) + m.param_info(i).numel()};
}

TEST(Model, RegistersParametersAndBuffersInTorchOrderWithStateDictNames) {
  Model<double> m = Mlp();
  std::vector<std::string> names, buffers;
  for (const auto& p : m.param_infos()) names.push_back(p.name);
  for (const auto& b : m.buffer_infos()) buffers.push_back(b.name);
  EXPECT_EQ(names, (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "3.weight", "3.bias"}));
  EXPECT_EQ(buffers, (std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"}));
  EXPECT_EQ(m.param_info(0).shape, (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(m.param_info(0).dtype, core::DType::kFloat64);
  EXPECT_EQ(m.buffer_info(2).dtype, core::DType::kInt64);
  EXPECT_EQ(m.buffer_info(2).shape, std::vector<int64_t>{});
  EXPECT_EQ(m.widths().in, 8);
  EXPECT_EQ(m.widths().out, 4);
}

TEST(Model, HookOrderMatchesPyTorchForMlpWithBatchNorm) {
  Model<double> m = Mlp();
  EXPECT_EQ(Step(m), (std::vector<int>{5, 4, 2, 3, 1, 0}));  // golden: DDP's rebuilt bucket order
}

TEST(Model, HookOrderForSingleLinearIsBiasThenWeight) {
  Model<double> m;
  ASSERT_TRUE(Model<double>::Build({Lin(10, 10)}, "mse", &m).ok());
  EXPECT_EQ(Step(m), (std::vector<int>{1, 0}));
}

TEST(Model, SecondBackwardDoublesEveryGrad) {
  Model<double> m = Mlp();
  Step(m);
  std::vector<std::vector<double>> first;
  for (int i = 0; i < m.num_params(); ++i) first.push_back(GradOf(m, i));
  m.Backward(1.0, nullptr);
  for (int i = 0; i < m.num_params(); ++i) {
    for (size_t k = 0; k < first[static_cast<size_t>(i)].size(); ++k) {
      ASSERT_EQ(GradOf(m, i)[k], 2 * first[static_cast<size_t>(i)][k]) << m.param_info(i).name << "[" << k << "]";
    }
  }
}

TEST(Model, LossScaleScalesEveryGradExactlyForPowersOfTwo) {
  Model<double> a = Mlp(), b = Mlp();
  Step(a);
  b.Forward(Input(4, 8), Target(4, 4));
  b.Backward(1024.0, nullptr);
  for (int i = 0; i < a.num_params(); ++i) {
    for (size_t k = 0; k < GradOf(a, i).size(); ++k) ASSERT_EQ(GradOf(b, i)[k], 1024.0 * GradOf(a, i)[k]);
  }
}

TEST(Model, ZeroGradToNoneUndefinesAndZeroGradKeepsDefinedGradsAsZeros) {
  Model<double> m = Mlp();
  for (int i = 0; i < m.num_params(); ++i) EXPECT_FALSE(m.grad_defined(i)) << "fresh grads are None";
  Step(m);
  m.set_grad_defined(0, false);  // as if 0.weight's grad were None
  m.ZeroGrad(false);
  EXPECT_FALSE(m.grad_defined(0)) << "zero_grad(set_to_none=False) leaves None grads None";
  for (int i = 1; i < m.num_params(); ++i) {
    EXPECT_TRUE(m.grad_defined(i));
    for (double g : GradOf(m, i)) ASSERT_EQ(g, 0.0);
  }
  m.ZeroGrad(true);
  for (int i = 0; i < m.num_params(); ++i) EXPECT_FALSE(m.grad_defined(i));
}

// zero_grad writes no zeros until a reader asks (ref::Param::ZeroLazily): a float32 model large enough for the
// batch-row kernels, whose weight gradients are then written over the stale values as 0 + the product, gives the
// bits of one whose zeros were written at once; every reader, on any thread, sees +0 before the next backward.
TEST(Model, LazilyZeroedGradsGiveTheBitsOfWrittenZerosAndReadAsPlusZero) {
  auto build = [] {
    Model<float> m;
    EXPECT_TRUE(Model<float>::Build({Lin(128, 256), Act("relu"), Lin(256, 128)}, "mse", &m).ok());
    return m;
  };
  Model<float> lazy = build(), eager = build();
  Matrix<float> x(32, 128);
  for (Eigen::Index k = 0; k < x.size(); ++k) x.data()[k] = static_cast<float>(std::sin(0.3 * static_cast<double>(k)));
  const core::Tensor y(core::DType::kFloat32, {32, 128}, std::vector<double>(32 * 128, 0.125));
  for (int step = 0; step < 3; ++step) {
    for (Model<float>* m : {&lazy, &eager}) {
      m->ZeroGrad(false);
      if (m == &eager) {
        for (int i = 0; i < m->num_params(); ++i) (void)m->grad_data(i);  // the zeros written now
      } else if (step > 0) {
        // Eight threads read one stale gradient at once: each sees +0 everywhere.
        std::vector<std::thread> readers;
        std::vector<int> nonzero(8, 0);
        for (int t = 0; t < 8; ++t) {
          readers.emplace_back([&, t] {
            const Model<float>& c = lazy;
            const float* g = c.grad_data(1);
            for (int64_t k = 0; k < c.param_info(1).numel(); ++k) nonzero[static_cast<size_t>(t)] += g[k] != 0.0f || std::signbit(g[k]);
          });
        }
        for (auto& r : readers) r.join();
        for (int n : nonzero) EXPECT_EQ(n, 0);
      }
      m->Forward(x, y);
      m->Backward(1.0, nullptr);
    }
    for (int i = 0; i < lazy.num_params(); ++i) {
      const int64_t n = lazy.param_info(i).numel();
      EXPECT_EQ(std::memcmp(lazy.grad_data(i), eager.grad_data(i), static_cast<size_t>(n) * sizeof(float)), 0)
          << "step " << step << " " << lazy.param_info(i).name;
    }
  }
}

TEST(Model, LayerUnusedOnARankIsBypassedAndItsParamsGetNoGradOrHook) {
  core::LayerSpec mid = Lin(4, 4);
  mid.unused_on_ranks = {1};
  Model<double> m;
  ASSERT_TRUE(Model<double>::Build({Lin(3, 4), Act("tanh"), mid, Lin(4, 2)}, "mse", &m).ok());
  Model<double> on_rank1 = m;
  on_rank1.SetRank(1);
  EXPECT_EQ(Step(m), (std::vector<int>{5, 4, 3, 2, 1, 0}));
  EXPECT_EQ(Step(on_rank1), (std::vector<int>{5, 4, 1, 0}));
  EXPECT_FALSE(on_rank1.grad_defined(2));
  EXPECT_FALSE(on_rank1.grad_defined(3));
  // Bypassed means identity: layer 3 sees layer 2's input.
  EXPECT_EQ(on_rank1.layer_input(3), on_rank1.layer_input(2));
}

TEST(Model, BuildRejectsBypassingALayerThatChangesWidth) {
  core::LayerSpec l = Lin(3, 4);
  l.unused = true;
  Model<double> m;
  core::Status st = Model<double>::Build({l}, "mse", &m);
  EXPECT_EQ(st.code(), core::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("/model/0/unused: a linear that may be skipped"), std::string::npos) << st.message();
}

TEST(Model, BuildRejectsWidthsThatDoNotChainAndNamesTheLayer) {
  Model<double> m;
  core::Status st = Model<double>::Build({Lin(8, 16), Bn(8)}, "mse", &m);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.message().find("/model/1/features: must equal the output width of /model/0 (16), got 8"),
            std::string::npos)
      << st.message();
  EXPECT_FALSE(Model<double>::Build({Lin(2, 2)}, "hinge", &m).ok());
  EXPECT_FALSE(Model<double>::Build({Act("conv2d")}, "mse", &m).ok());
}

TEST(Model, CopyIsAnIndependentReplica) {
  Model<double> a = Mlp();
  Model<double> b = a;
  b.param_data(0)[0] = 42.0;
  Step(b);
  EXPECT_NE(a.param_data(0)[0], 42.0);
  EXPECT_FALSE(a.grad_defined(0));
  EXPECT_EQ(a.buffer_data(2)[0], 0.0);
  EXPECT_EQ(b.buffer_data(2)[0], 1.0);
}

TEST(Model, InitFromSeedIsDeterministicAndWithinTorchBounds) {
  Model<double> a = Mlp(), b = Mlp();
  a.InitFromSeed(3, false);
  b.InitFromSeed(3, false);
  for (int i = 0; i < a.num_params(); ++i) EXPECT_EQ(GradOf(a, i).size(), GradOf(b, i).size());
  const double bound0 = 1 / std::sqrt(8.0), bound3 = 1 / std::sqrt(16.0);
  for (int k = 0; k < 16 * 8; ++k) {
    ASSERT_EQ(a.param_data(0)[k], b.param_data(0)[k]);
    ASSERT_LE(std::abs(a.param_data(0)[k]), bound0);
  }
  for (int k = 0; k < 4 * 16; ++k) ASSERT_LE(std::abs(a.param_data(4)[k]), bound3);
  EXPECT_EQ(a.param_data(2)[0], 1.0);  // BN weight
  EXPECT_EQ(a.param_data(3)[0], 0.0);  // BN bias
  b.InitFromSeed(4, false);
  EXPECT_NE(a.param_data(0)[0], b.param_data(0)[0]);
}

TEST(Model, ExactInitUsesSixteenthsInMinusHalfToHalf) {
  Model<double> m = Mlp();
  m.InitFromSeed(9, true);
  std::vector<int> seen(17, 0);
  for (int i : {0, 1, 4, 5}) {
    for (int64_t k = 0; k < m.param_info(i).numel(); ++k) {
      const double v16 = m.param_data(i)[k] * 16;
      ASSERT_EQ(v16, std::round(v16));
      ASSERT_LE(std::abs(v16), 8.0);
      seen[static_cast<size_t>(v16 + 8)] = 1;
    }
  }
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), 17) << "all 17 values appear among 220 draws";
}

TEST(Model, LoadValuesSetsNamedTensorsAndNamesTheOffenderOnShapeMismatch) {
  Model<double> m = Mlp();
  std::map<std::string, core::Tensor> v;
  v["3.bias"] = core::Tensor(core::DType::kFloat32, {4}, {1, 2, 3, 4});
  v["1.num_batches_tracked"] = core::Tensor(core::DType::kInt64, {}, {7});
  ASSERT_TRUE(m.LoadValues(v).ok());
  EXPECT_EQ(m.param_data(5)[3], 4.0);
  EXPECT_EQ(m.buffer_data(2)[0], 7.0);
  v["0.weight"] = core::Tensor::Zeros(core::DType::kFloat64, {10, 8});
  v["3.bias"] = core::Tensor(core::DType::kFloat32, {4}, {9, 9, 9, 9});
  core::Status st = m.LoadValues(v);
  EXPECT_EQ(st.code(), core::Code::kInvalidArgument);
  EXPECT_NE(st.message().find("0.weight: shape (10, 8)"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("(16, 8)"), std::string::npos) << st.message();
  EXPECT_EQ(m.param_data(5)[3], 4.0) << "a failed load changes nothing";
  EXPECT_EQ(m.LoadValues({{"2.weight", core::Tensor::Scalar(1)}}).code(), core::Code::kNotFound);
}

TEST(Model, CheckInputsRejectsWrongShapesAndBatchOfOneUnderBatchNormTraining) {
  Model<double> m = Mlp();
  EXPECT_TRUE(m.CheckInputs(Input(4, 8), Target(4, 4)).ok());
  EXPECT_FALSE(m.CheckInputs(Input(4, 7), Target(4, 4)).ok());
  EXPECT_FALSE(m.CheckInputs(Input(4, 8), Target(4, 3)).ok());
  EXPECT_FALSE(m.CheckInputs(Input(1, 8), Target(1, 4)).ok());
  m.SetTraining(false);
  EXPECT_TRUE(m.CheckInputs(Input(1, 8), Target(1, 4)).ok()) << "eval mode uses running stats";
  Model<double> ce;
  ASSERT_TRUE(Model<double>::Build({Lin(2, 3)}, "cross_entropy", &ce).ok());
  EXPECT_TRUE(ce.CheckInputs(Input(2, 2), core::Tensor(core::DType::kInt64, {2}, {0, 2})).ok());
  EXPECT_FALSE(ce.CheckInputs(Input(2, 2), core::Tensor(core::DType::kInt64, {2}, {0, 3})).ok());
  EXPECT_FALSE(ce.CheckInputs(Input(2, 2), core::Tensor(core::DType::kInt64, {2}, {0, 0.5})).ok());
}

TEST(Model, DropoutSeedReproducesTheMaskAndEvalModeIgnoresIt) {
  core::LayerSpec drop = Act("dropout");
  drop.p = 0.5;
  Model<double> a;
  ASSERT_TRUE(Model<double>::Build({Lin(4, 4), drop}, "mse", &a).ok());
  Model<double> b = a;
  a.SetDropoutSeed(11);
  b.SetDropoutSeed(11);
  const double la = a.Forward(Input(6, 4), Target(6, 4));
  EXPECT_EQ(la, b.Forward(Input(6, 4), Target(6, 4)));
  b.SetDropoutSeed(12);
  EXPECT_NE(la, b.Forward(Input(6, 4), Target(6, 4)));
  a.SetTraining(false);
  b.SetTraining(false);
  EXPECT_EQ(a.Forward(Input(6, 4), Target(6, 4)), b.Forward(Input(6, 4), Target(6, 4)));
}

}  // namespace
}  // namespace ddpcheck::ref
