// Step-local replay with element-wise bounds (reference/step_local.h): a clean float32/float64 run passes,
// and a 1e-4 (float32) / 1e-11 (float64) relative error in one recorded tensor at one step is caught at that
// step. The run under test is the reference's own float32 (or float64) trajectory: real rounding, no mocks.
#include <algorithm>
#include <iostream>

#include <nlohmann/json.hpp>

#include <gtest/gtest.h>

#include "core/scenario.h"
#include "core/train_loop.h"
#include "reference/blas.h"
#include "reference/error_bounds.h"
#include "reference/step_local.h"
#include "reference/trainer.h"
#include "tests/test_util.h"

namespace ddpcheck {
namespace {

core::Scenario Load(const std::string& file, core::DType precision, const std::string& optimizer) {
  core::Scenario s;
  const core::Status st = core::LoadScenario(std::string(DDPCHECK_SOURCE_DIR) + "/scenarios/" + file, &s);
  EXPECT_TRUE(st.ok()) << st.ToString();
  s.precision = precision;
  s.faults.clear();  // a fault scenario's clean twin
  s.epochs = 1;
  s.steps = 4;
  if (optimizer != "sgd") {
    s.optimizer.type = optimizer;
    s.optimizer.lr = 1e-3;
    s.optimizer.momentum = 0;
  }
  EXPECT_TRUE(core::MaterializeData(&s).ok());
  return s;
}

core::CompareResult Check(const core::Scenario& s, const core::Trace& recorded) {
  core::CompareResult r;
  const core::Status st = ref::CheckStepLocal(s, recorded, core::PolicyFor(s), &r);
  EXPECT_TRUE(st.ok()) << st.ToString();
  return r;
}

// Scales every element of the (step, checkpoint, tensor) records of every rank by (1 + eps).
void Perturb(core::Trace* t, int64_t step, core::Checkpoint c, const std::string& tensor, double eps) {
  std::vector<std::pair<core::TraceKey, core::Tensor>> changed;
  for (const auto& [k, v] : t->records()) {
    if (k.step != step || k.checkpoint != c || k.tensor != tensor) continue;
    core::Tensor w = v;
    for (double& x : w.data) x = w.dtype == core::DType::kFloat32 ? static_cast<float>(x * (1 + eps)) : x * (1 + eps);
    changed.emplace_back(k, w);
  }
  ASSERT_FALSE(changed.empty()) << tensor;
  for (auto& [k, v] : changed) t->Add(k, v);
}

// (scenario file, precision, optimizer, eps that must be caught)
using Case = std::tuple<std::string, core::DType, std::string, double>;
class StepLocal : public ::testing::TestWithParam<Case> {};

TEST_P(StepLocal, CleanRunPassesAndOnePerturbedTensorIsCaughtAtItsStep) {
  const auto [file, precision, optimizer, eps] = GetParam();
  const core::Scenario s = Load(file, precision, optimizer);
  core::Trace run;
  ASSERT_TRUE(ref::RunReference(s, &run).ok());
  const core::CompareResult clean = Check(s, run);
  EXPECT_TRUE(clean.pass) << (clean.first ? clean.first->key.ToString() + " " + clean.first->message : "");
  ASSERT_GT(clean.stats.at("params").bounded, 0);
  for (const auto& [name, st] : clean.stats) {
    if (st.bounded) std::cout << name << ": sensitivity " << st.sensitivity << ", noise tensors " << st.noise << "\n";
  }

  const std::string last = std::to_string(s.model.size() - 1);  // the last Linear
  const std::pair<core::Checkpoint, std::string> targets[] = {{core::Checkpoint::kParams, "0.weight"},
                                                              {core::Checkpoint::kReduced, last + ".weight"},
                                                              {core::Checkpoint::kLoss, "loss"}};
  for (const auto& [c, tensor] : targets) {
    core::Trace bad = run;
    Perturb(&bad, 2, c, tensor, eps);
    const core::CompareResult r = Check(s, bad);
    ASSERT_FALSE(r.pass) << tensor << " scaled by 1 + " << eps << " was not caught";
    EXPECT_EQ(r.first->key.step, 2) << r.first->key.ToString();
    EXPECT_EQ(r.first->key.checkpoint, c) << r.first->key.ToString();
  }
}

// The tutorial ToyModel (widths 10): 1e-4 in float32, 1e-11 in float64. The default scenario (widths 32,
// BatchNorm over 8 rows, W=4) has wider bounds (sensitivity about 5e-3 in float32): 1e-2 and 1e-10.
INSTANTIATE_TEST_SUITE_P(
    Scenarios, StepLocal,
    ::testing::Values(Case{"tutorial_toymodel.json", core::DType::kFloat32, "sgd", 1e-4},
                      Case{"tutorial_toymodel.json", core::DType::kFloat32, "adam", 1e-4},
                      Case{"tutorial_toymodel.json", core::DType::kFloat64, "sgd", 1e-11},
                      Case{"tutorial_toymodel.json", core::DType::kFloat64, "adam", 1e-11},
                      Case{"default.json", core::DType::kFloat32, "sgd", 1e-2},
                      Case{"default.json", core::DType::kFloat32, "adam", 1e-2},
                      Case{"default.json", core::DType::kFloat64, "sgd", 1e-10},
                      Case{"default.json", core::DType::kFloat64, "adam", 1e-10},
                      // SyncBatchNorm over unequal per-rank batches right after a biased Linear, W=4: the
                      // bias's gradient is rounding noise that Adam turns into lr-sized steps (once a false
                      // alarm under the normwise policy; the group rules bound it).
                      Case{"faults/syncbn-unequal-counts.json", core::DType::kFloat32, "adam", 1e-2},
                      Case{"faults/syncbn-unequal-counts.json", core::DType::kFloat32, "sgd", 1e-2},
                      Case{"faults/syncbn-unequal-counts.json", core::DType::kFloat64, "adam", 1e-10}));

// AMP: autocast with a GradScaler (whose state each step starts from as recorded), or without one (as torch's
// CPU bfloat16 autocast runs). The run is the reference's float32 trajectory under autocast emulation, the
// replay float64 with the same roundings and the low-precision rules of reference/error_bounds.h. A 1e-2
// error in the loss (bfloat16's spacing above 1 is 2^-7 ~ 8e-3) or in a parameter is caught at its step.
using AutocastCase = std::tuple<std::string, std::string, std::string, bool>;  // scenario, dtype, optimizer, scaler
class StepLocalAutocast : public ::testing::TestWithParam<AutocastCase> {};

TEST_P(StepLocalAutocast, CleanRunPassesAndAPerturbedLossOrParameterIsCaughtAtItsStep) {
  const auto [file, dtype, optimizer, scaler] = GetParam();
  core::Scenario s = Load(file, core::DType::kFloat32, optimizer);
  s.amp.enabled = true;
  s.amp.grad_scaler = scaler;
  s.amp.dtype = dtype;
  ASSERT_TRUE(ref::StepLocalSupported(s));
  core::Trace run;
  ASSERT_TRUE(ref::RunReference(s, &run).ok());
  const core::CompareResult clean = Check(s, run);
  EXPECT_TRUE(clean.pass) << (clean.first ? clean.first->key.ToString() + " " + clean.first->message : "");
  for (const auto& [name, st] : clean.stats) {
    if (st.bounded) std::cout << name << ": sensitivity " << st.sensitivity << "\n";
  }
  const std::pair<core::Checkpoint, std::string> targets[] = {{core::Checkpoint::kLoss, "loss"},
                                                              {core::Checkpoint::kParams, "0.weight"}};
  for (const auto& [c, tensor] : targets) {
    core::Trace bad = run;
    Perturb(&bad, 2, c, tensor, 1e-2);
    const core::CompareResult r = Check(s, bad);
    ASSERT_FALSE(r.pass) << tensor << " scaled by 1 + 1e-2 was not caught";
    EXPECT_EQ(r.first->key.step, 2) << r.first->key.ToString();
    EXPECT_EQ(r.first->key.checkpoint, c) << r.first->key.ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(Scenarios, StepLocalAutocast,
                         ::testing::Values(AutocastCase{"tutorial_toymodel.json", "bf16", "sgd", false},
                                           AutocastCase{"tutorial_toymodel.json", "bf16", "adam", false},
                                           AutocastCase{"tutorial_toymodel.json", "fp16", "sgd", false},
                                           AutocastCase{"default.json", "bf16", "sgd", false},
                                           AutocastCase{"default.json", "fp16", "adam", false},
                                           AutocastCase{"tutorial_toymodel.json", "fp16", "sgd", true},
                                           AutocastCase{"tutorial_toymodel.json", "bf16", "adam", true},
                                           AutocastCase{"default.json", "fp16", "sgd", true},
                                           AutocastCase{"default.json", "bf16", "sgd", true}));

// A model wide enough that its Linear bound products go through the BLAS in float (reference/error_bounds.h,
// SetFloatBoundProducts; with OpenBLAS as libblas.so.3, as scripts/setup.sh installs it): every bound is at
// least its float64 product's and at most a part in 10^3 above it (plus k 2^-149 for underflow), a clean float32
// run still passes, and an error in one tensor is caught at its step both ways. The setting is the process's.
TEST(StepLocalWide, FloatBoundProductsBoundTheFloat64OnesFromAboveAndCatchWhatTheyCatch) {
  const nlohmann::json j = {
      {"name", "wide-mlp"},
      {"model", {{{"type", "linear"}, {"in", 96}, {"out", 160}}, {{"type", "relu"}},
                 {{"type", "linear"}, {"in", 160}, {"out", 160}}, {{"type", "relu"}},
                 {{"type", "linear"}, {"in", 160}, {"out", 96}}}},
      {"loss", "mse"},
      {"data", {{"kind", "regression"}, {"samples", 192}, {"seed", 3}}},
      {"world", 2},
      {"batch_size", 32},
      {"precision", "fp32"},
      {"epochs", 1},
      {"optimizer", {{"type", "sgd"}, {"lr", 0.01}}}};
  core::Scenario s;
  const core::Status parsed = core::ParseScenario(j, "wide-mlp", ".", &s);
  ASSERT_TRUE(parsed.ok()) << parsed.ToString();
  ASSERT_TRUE(core::MaterializeData(&s).ok());
  core::Trace run;
  ASSERT_TRUE(ref::RunReference(s, &run).ok());

  core::Trace values64, bounds64, values32, bounds32;
  ref::SetFloatBoundProducts(false);
  const core::Status st64 = ref::ReplayStepLocal(s, run, &values64, &bounds64);
  ref::SetFloatBoundProducts(true);
  ASSERT_TRUE(st64.ok()) << st64.ToString();
  ASSERT_TRUE(ref::ReplayStepLocal(s, run, &values32, &bounds32).ok());
  int64_t compared = 0;
  double widest = 0;
  for (const auto& [key, rec64] : bounds64.records()) {
    const core::Tensor& b64 = *rec64;
    const core::Tensor* b32 = bounds32.Find(key);
    ASSERT_NE(b32, nullptr) << key.ToString();
    ASSERT_EQ(b32->numel(), b64.numel()) << key.ToString();
    for (int64_t i = 0; i < b64.numel(); ++i) {
      const double lo = b64.data[static_cast<size_t>(i)], hi = b32->data[static_cast<size_t>(i)];
      ASSERT_GE(hi, lo * (1 - 1e-12)) << key.ToString() << " [" << i << "]";
      ASSERT_LE(hi, lo * (1 + 1e-3) + 1e-40) << key.ToString() << " [" << i << "]";  // + k 2^-149: underflow
      if (lo > 0) widest = std::max(widest, hi / lo - 1);
      ++compared;
    }
  }
  std::cout << compared << " bounds compared, the float products' at most " << widest << " above float64's\n";
  ASSERT_GT(compared, 3 * 160 * 160);
  if (ref::BlasBackend().rfind("openblas", 0) == 0) {
    EXPECT_GT(widest, 0.0) << "the float bound products never ran (" << ref::BlasBackend() << ")";
  }
  for (const auto& [key, v64] : values64.records()) {  // the values themselves do not change
    const core::Tensor* v32 = values32.Find(key);
    ASSERT_NE(v32, nullptr) << key.ToString();
    ASSERT_TRUE(core::BitwiseEqual(*v64, *v32)) << key.ToString();
  }

  const core::CompareResult clean = Check(s, run);
  EXPECT_TRUE(clean.pass) << (clean.first ? clean.first->key.ToString() + " " + clean.first->message : "");
  for (const auto& [name, st] : clean.stats) {
    if (st.bounded) std::cout << name << ": sensitivity " << st.sensitivity << "\n";
  }
  // (the first layer's weight moves by lr times its gradient: a 1e-4 error in it is far above its bound; the
  // gradients' worst bounds are their cancelling bias gradients', so 1e-2 there)
  for (const auto& [c, tensor, eps] : {std::tuple{core::Checkpoint::kParams, std::string("0.weight"), 1e-4},
                                       std::tuple{core::Checkpoint::kReduced, std::string("2.weight"), 1e-2},
                                       std::tuple{core::Checkpoint::kLocalGrad, std::string("4.weight"), 1e-2}}) {
    core::Trace bad = run;
    Perturb(&bad, 1, c, tensor, eps);
    for (const bool in_float : {true, false}) {
      ref::SetFloatBoundProducts(in_float);
      const core::CompareResult r = Check(s, bad);
      ref::SetFloatBoundProducts(true);
      ASSERT_FALSE(r.pass) << tensor << " scaled by 1 + " << eps << " was not caught, float products " << in_float;
      EXPECT_EQ(r.first->key.step, 1) << r.first->key.ToString();
      EXPECT_EQ(r.first->key.checkpoint, c) << r.first->key.ToString();
    }
  }
}

}  // namespace
}  // namespace ddpcheck
