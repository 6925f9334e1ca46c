// CudaReplica against the reference layers on small models: the same loss, the same gradients (by name, with a
// per-precision tolerance), the same grad-ready order, and optimizer steps bitwise equal to core/optimizer.cc.
#include <cmath>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "core/optimizer.h"
#include "core/scenario.h"
#include "harness/gpu/rank_setup_ref.h"
#include "real/device_context.h"
#include "real/replica_cuda.h"
#include "reference/model.h"
#include "reference/rank_model.h"

namespace ddpcheck::real {
namespace {

core::LayerSpec Linear(int64_t in, int64_t out) {
  core::LayerSpec l;
  l.type = "linear";
  l.in_features = in;
  l.out_features = out;
  return l;
}
core::LayerSpec Of(const std::string& type, int64_t features = 0, double p = 0.5) {
  core::LayerSpec l;
  l.type = type;
  l.num_features = features;
  l.p = p;
  return l;
}

core::Scenario SmallScenario(core::DType precision, const std::string& loss) {
  core::Scenario s = core::DefaultScenario();
  s.model = {Linear(6, 16), Of("batchnorm1d", 16), Of("relu"), Linear(16, 12), Of("tanh"), Of("dropout", 0, 0.25),
             Linear(12, 5)};
  s.loss = loss;
  s.precision = precision;
  s.init.kind = "seed";
  s.init.seeds = {7};
  s.amp.enabled = false;
  return s;
}

core::Batch MakeBatch(int64_t rows, int64_t in, int64_t out, const std::string& loss, unsigned seed) {
  core::Batch b;
  std::mt19937_64 rng(seed);
  b.x = core::Tensor(core::DType::kFloat64, {rows, in}, {});
  for (int64_t i = 0; i < rows * in; ++i) b.x.data.push_back(ref::PortableUniform(rng) * 2 - 1);
  if (loss == "mse") {
    b.y = core::Tensor(core::DType::kFloat64, {rows, out}, {});
    for (int64_t i = 0; i < rows * out; ++i) b.y.data.push_back(ref::PortableUniform(rng));
  } else {
    b.y = core::Tensor(core::DType::kFloat64, {rows}, {});
    for (int64_t i = 0; i < rows; ++i) b.y.data.push_back(static_cast<double>(rng() % static_cast<uint64_t>(out)));
  }
  return b;
}

template <typename T>
void ExpectMatchesReference(core::DType precision, const std::string& loss, double rel_tol) {
  const core::Scenario s = SmallScenario(precision, loss);
  std::unique_ptr<DeviceContext> ctx;
  ASSERT_TRUE(DeviceContext::Create(0, &ctx).ok());
  RankSetup setup;
  ASSERT_TRUE(harness::ReferenceRankSetup(s, 1, &setup).ok());
  std::unique_ptr<CudaReplica> gpu;
  const MathMode math = precision == core::DType::kFloat64 ? MathMode::kFp64 : MathMode::kFp32;
  ASSERT_TRUE(CudaReplica::Create(setup, s.optimizer, math, ctx.get(), &gpu).ok());
  ref::Model<T> cpu;
  ASSERT_TRUE(ref::BuildRankModel(s, 1, &cpu).ok());

  for (int iter = 0; iter < 2; ++iter) {  // the second pass accumulates into defined grads
    const core::Batch batch = MakeBatch(8, 6, 5, loss, 100 + iter);
    double gpu_loss = 0;
    ASSERT_TRUE(gpu->Forward(batch, &gpu_loss).ok());
    ref::Matrix<T> x(8, 6);
    for (int64_t i = 0; i < 48; ++i) x.data()[i] = static_cast<T>(batch.x.data[static_cast<size_t>(i)]);
    const double cpu_loss = static_cast<double>(cpu.Forward(x, batch.y));
    EXPECT_NEAR(gpu_loss, cpu_loss, rel_tol * std::abs(cpu_loss)) << "loss, pass " << iter;
    std::vector<int> gpu_order, cpu_order;
    gpu->Backward(3.0, [&](int p) { gpu_order.push_back(p); });
    cpu.Backward(T(3), [&](int p) { cpu_order.push_back(p); });
    EXPECT_EQ(gpu_order, cpu_order) << "grad-ready order";
  }
  // Normwise, as the comparison's TolerancePolicy (docs/tolerance.md): the scale is the largest gradient of the
  // model, not of the tensor. A gradient that cancels to about 0 carries the rounding of the terms it sums, not
  // of its value: the bias of the Linear right before the BatchNorm has an exact gradient of 0 (the BatchNorm
  // removes the mean), and the GPU's and the CPU's sums of its terms end at different noise (1e-17 in fp64,
  // 1e-8 in fp32 on an H100, reports/gpu/h100-x1).
  double scale = 0;
  for (int i = 0; i < cpu.num_params(); ++i) {
    for (int64_t k = 0; k < cpu.param_info(i).numel(); ++k) {
      scale = std::max(scale, std::abs(double(cpu.grad_data(i)[k])));
    }
  }
  for (int i = 0; i < cpu.num_params(); ++i) {
    const core::ParamInfo& info = cpu.param_info(i);
    ASSERT_TRUE(gpu->GradDefined(i)) << info.name;
    const core::Tensor g = gpu->ToHost(gpu->Grad(i), info.shape);
    for (int64_t k = 0; k < info.numel(); ++k) {
      ASSERT_NEAR(g.data[static_cast<size_t>(k)], double(cpu.grad_data(i)[k]), rel_tol * std::max(scale, 1e-30))
          << info.name << "[" << k << "]";
    }
  }
  for (int i = 0; i < cpu.num_buffers(); ++i) {
    const core::ParamInfo& info = cpu.buffer_info(i);
    const core::Tensor b = gpu->ToHost(gpu->Buffer(i), info.shape);
    for (int64_t k = 0; k < info.numel(); ++k) {
      ASSERT_NEAR(b.data[static_cast<size_t>(k)], double(cpu.buffer_data(i)[k]),
                  rel_tol * std::max(1.0, std::abs(double(cpu.buffer_data(i)[k]))))
          << info.name;
    }
  }
}

TEST(CudaReplica, MatchesTheReferenceInFp64WithMse) { ExpectMatchesReference<double>(core::DType::kFloat64, "mse", 1e-12); }
TEST(CudaReplica, MatchesTheReferenceInFp64WithCrossEntropy) {
  ExpectMatchesReference<double>(core::DType::kFloat64, "cross_entropy", 1e-12);
}
TEST(CudaReplica, MatchesTheReferenceInFp32WithinRoundoff) {
  ExpectMatchesReference<float>(core::DType::kFloat32, "mse", 2e-5);
  ExpectMatchesReference<float>(core::DType::kFloat32, "cross_entropy", 2e-5);
}

// The optimizer kernels round exactly as core/optimizer.cc: bitwise equal over several steps.
void ExpectOptimizerBitwise(const core::OptimizerSpec& spec) {
  core::Scenario s = SmallScenario(core::DType::kFloat32, "mse");
  s.model = {Linear(6, 5)};
  s.optimizer = spec;
  std::unique_ptr<DeviceContext> ctx;
  ASSERT_TRUE(DeviceContext::Create(0, &ctx).ok());
  RankSetup setup;
  ASSERT_TRUE(harness::ReferenceRankSetup(s, 0, &setup).ok());
  std::unique_ptr<CudaReplica> gpu;
  ASSERT_TRUE(CudaReplica::Create(setup, spec, MathMode::kFp32, ctx.get(), &gpu).ok());
  std::vector<float> p(setup.initial["0.weight"].data.begin(), setup.initial["0.weight"].data.end());
  core::ParamState<float> st;
  std::mt19937_64 rng(5);
  for (int step = 0; step < 4; ++step) {
    std::vector<double> g(p.size());
    for (double& v : g) v = static_cast<float>(ref::PortableUniform(rng) - 0.5);
    gpu->FromHost(core::Tensor(core::DType::kFloat32, {5, 6}, g), gpu->Grad(0));
    gpu->SetGradDefined(0, true);
    gpu->SetGradDefined(1, false);
    const double lr = 0.01 * (step + 1);
    ASSERT_TRUE(gpu->OptimizerStep(lr).ok());
    std::vector<float> gf(g.begin(), g.end());
    core::OptimizerStep<float>(spec, lr, p.data(), gf.data(), static_cast<int64_t>(p.size()), &st);
    const core::Tensor got = gpu->ToHost(gpu->Param(0), {5, 6});
    for (size_t k = 0; k < p.size(); ++k) {
      ASSERT_EQ(static_cast<float>(got.data[k]), p[k]) << spec.type << " step " << step << " element " << k;
    }
  }
}

TEST(CudaReplica, SgdWithMomentumNesterovAndWeightDecayMatchesTheCpuOptimizerBitwise) {
  core::OptimizerSpec o;
  o.type = "sgd";
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 1e-3;
  ExpectOptimizerBitwise(o);
}
TEST(CudaReplica, AdamAndAdamWMatchTheCpuOptimizerBitwise) {
  core::OptimizerSpec o;
  o.type = "adam";
  o.weight_decay = 1e-2;
  ExpectOptimizerBitwise(o);
  o.type = "adamw";
  ExpectOptimizerBitwise(o);
}

TEST(CudaReplica, UnscaleReportsNonFiniteGradsAndScalesByInverse) {
  core::Scenario s = SmallScenario(core::DType::kFloat32, "mse");
  s.model = {Linear(2, 2)};
  std::unique_ptr<DeviceContext> ctx;
  ASSERT_TRUE(DeviceContext::Create(0, &ctx).ok());
  RankSetup setup;
  ASSERT_TRUE(harness::ReferenceRankSetup(s, 0, &setup).ok());
  std::unique_ptr<CudaReplica> gpu;
  ASSERT_TRUE(CudaReplica::Create(setup, s.optimizer, MathMode::kFp32, ctx.get(), &gpu).ok());
  gpu->FromHost(core::Tensor(core::DType::kFloat32, {2, 2}, {4, 8, -16, 2}), gpu->Grad(0));
  gpu->SetGradDefined(0, true);
  EXPECT_FALSE(gpu->UnscaleGrads(0.25f));
  EXPECT_EQ(gpu->ToHost(gpu->Grad(0), {2, 2}).data, (std::vector<double>{1, 2, -4, 0.5}));
  gpu->FromHost(core::Tensor(core::DType::kFloat32, {2, 2}, {1, INFINITY, 0, 0}), gpu->Grad(0));
  EXPECT_TRUE(gpu->UnscaleGrads(1.0f));
  EXPECT_DOUBLE_EQ(gpu->GradNorm(), std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace ddpcheck::real
