// Properties of AMP training (autocast + GradScaler) on tiny random scenarios. Replay a failure with
// RC_PARAMS="seed=N". Worlds run on rank threads over the in-memory communicator ("local"), W <= 4, a few
// steps, so each case takes milliseconds.
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "core/compare.h"
#include "core/grad_scaler.h"
#include "core/scenario.h"
#include "core/train_loop.h"
#include "reference/grad_ops.h"
#include "reference/trainer.h"
#include "tests/amp_world.h"

namespace ddpcheck {
namespace {

using core::Checkpoint;
using core::kAllRanks;

core::LayerSpec Layer(const std::string& type, int64_t in = 0, int64_t out = 0) {
  core::LayerSpec l;
  l.type = type;
  l.in_features = in;
  l.out_features = out;
  return l;
}

// Linear(in, hidden) -> relu|tanh -> Linear(hidden, out), MSE (regression) or cross-entropy
// (classification), SGD, fp32 master weights, AMP on.
core::Scenario TinyAmpScenario(int world, int64_t steps, double init_scale, int64_t growth_interval,
                               const std::string& loss = "mse", const std::string& activation = "") {
  const auto in = *rc::gen::inRange<int64_t>(1, 6);
  const auto hidden = *rc::gen::inRange<int64_t>(1, 9);
  const auto out = *rc::gen::inRange<int64_t>(2, 5);
  core::Scenario s;
  s.name = "amp-prop";
  const std::string act = activation.empty() ? *rc::gen::element<std::string>("relu", "tanh") : activation;
  s.model = {Layer("linear", in, hidden), Layer(act),
             Layer("linear", hidden, out)};
  s.loss = loss;
  s.data.kind = loss == "mse" ? "regression" : "classification";
  s.init.seeds = {*rc::gen::inRange<uint64_t>(0, 1000)};
  s.world = world;
  s.batch_size = *rc::gen::inRange<int64_t>(1, 5);
  s.data.samples = s.batch_size * world * steps;
  s.data.seed = *rc::gen::inRange<uint64_t>(0, 1000);
  s.data.in_features = in;
  s.data.out_features = out;
  s.steps = steps;
  s.optimizer.lr = 0.01;
  s.precision = core::DType::kFloat32;
  s.amp.enabled = true;
  s.amp.dtype = *rc::gen::element<std::string>("fp16", "bf16");
  s.amp.init_scale = init_scale;
  s.amp.growth_interval = growth_interval;
  core::Status st = core::ValidateScenario(s);
  if (st.ok()) st = core::MaterializeData(&s);
  if (!st.ok()) RC_FAIL(st.ToString());
  return s;
}

double Scalar(const core::Trace& t, int64_t step, Checkpoint c, const std::string& name, int rank) {
  const core::Tensor* v = t.Find({step, c, name, rank});
  RC_ASSERT(v != nullptr);
  return v->data.at(0);
}

// The bound assumes the gradient is a smooth function of the roundings, so: tanh, not relu (a pre-activation
// within a rounding of 0 flips relu's gate, and that unit's gradient jumps by its full size); cross-entropy,
// not MSE (softmax - onehot, computed in fp32 from low-valued logits, does not cancel, while MSE's residual
// output - target does: its error is relative to |output| + |target|). Scales from 2^8 keep fp16 grads out of
// the subnormals.
RC_GTEST_PROP(Amp, WithoutOverflowUnscaledGradsEqualTheFp32ReferenceWithinTheDerivedBound, ()) {
  const int world = *rc::gen::inRange(1, 5);
  const double scale = std::ldexp(1.0, *rc::gen::inRange(8, 13));
  core::Scenario amp = TinyAmpScenario(world, /*steps=*/1, scale, 2000, "cross_entropy", "tanh");
  core::Scenario fp32 = amp;
  fp32.amp.enabled = false;
  core::Trace got, want;
  RC_ASSERT(ref::RunReference(amp, &got).ok());
  RC_ASSERT(ref::RunReference(fp32, &want).ok());
  RC_ASSERT(Scalar(got, 0, Checkpoint::kScaler, "found_inf", kAllRanks) == 0.0);
  const core::TolerancePolicy policy = core::PolicyFor(amp);
  double max_ref = 0;
  for (const auto& [key, v] : want.records()) {
    if (key.step != 0 || key.checkpoint != Checkpoint::kReduced) continue;
    for (double x : v->data) max_ref = std::max(max_ref, std::abs(x));
  }
  const double budget = policy.Budget(Checkpoint::kUnscaled, 0, max_ref);
  for (const auto& [key, v] : want.records()) {
    if (key.step != 0 || key.checkpoint != Checkpoint::kReduced) continue;
    const core::Tensor* g = got.Find({0, Checkpoint::kUnscaled, key.tensor, kAllRanks});
    RC_ASSERT(g != nullptr);
    for (size_t i = 0; i < v->data.size(); ++i) {
      RC_ASSERT(std::abs(g->data[i] - v->data[i]) <= budget);
    }
  }
}

RC_GTEST_PROP(Amp, WithoutInfsTheScaleGrowsExactlyEveryGrowthIntervalSteps, ()) {
  const int world = *rc::gen::inRange(1, 5);
  const int64_t steps = *rc::gen::inRange<int64_t>(1, 7);
  const int64_t interval = *rc::gen::inRange<int64_t>(1, 4);
  const int e0 = *rc::gen::inRange(0, 5);
  const core::Scenario s = TinyAmpScenario(world, steps, std::ldexp(1.0, e0), interval);
  core::Trace got;
  RC_ASSERT(testing::RunWorld(s, "local", -1, 0, &got).ok());
  for (int64_t k = 0; k < steps; ++k) {
    for (int r = 0; r < world; ++r) {
      RC_ASSERT(Scalar(got, k, Checkpoint::kScaler, "found_inf", r) == 0.0);
      RC_ASSERT(Scalar(got, k, Checkpoint::kScaler, "scale", r) ==
                std::ldexp(1.0, e0 + static_cast<int>((k + 1) / interval)));
      RC_ASSERT(Scalar(got, k, Checkpoint::kScaler, "growth_tracker", r) == static_cast<double>((k + 1) % interval));
    }
  }
}

RC_GTEST_PROP(Amp, AnInfOnOneRanksLocalGradMakesEveryRankSkipThatStepAndBackOffIdentically, ()) {
  const int world = *rc::gen::inRange(1, 5);
  const int64_t steps = *rc::gen::inRange<int64_t>(1, 5);
  const int inject_rank = *rc::gen::inRange(0, world);
  const int64_t inject_step = *rc::gen::inRange<int64_t>(0, steps);
  const core::Scenario s = TinyAmpScenario(world, steps, 1024.0, 2000);
  core::Trace got;
  RC_ASSERT(testing::RunWorld(s, "local", inject_rank, inject_step, &got).ok());
  for (int r = 0; r < world; ++r) {
    for (int64_t k = 0; k < steps; ++k) {
      const bool inf = k == inject_step;
      RC_ASSERT(Scalar(got, k, Checkpoint::kScaler, "found_inf", r) == (inf ? 1.0 : 0.0));
      RC_ASSERT(Scalar(got, k, Checkpoint::kScaler, "skipped", r) == (inf ? 1.0 : 0.0));
      RC_ASSERT(Scalar(got, k, Checkpoint::kScaler, "scale", r) == (k >= inject_step ? 512.0 : 1024.0));
    }
    // The skipped step left this rank's parameters as they were before it.
    for (const auto& [key, v] : got.records()) {
      if (key.rank != r || key.step != inject_step || key.checkpoint != Checkpoint::kParams) continue;
      const core::Tensor* before = inject_step == 0 ? got.Find({0, Checkpoint::kInit, key.tensor, r})
                                                    : got.Find({inject_step - 1, Checkpoint::kParams, key.tensor, r});
      RC_ASSERT(before != nullptr);
      RC_ASSERT(core::BitwiseEqual(*before, v));
    }
  }
  RC_ASSERT(core::CheckRankInvariants(got).pass);
}

RC_GTEST_PROP(Amp, PowerOfTwoScaleThenUnscaleGivesBackEveryGradExactly, ()) {
  // Grads of magnitude in [2^-20, 2^20) times 2^e with |e| <= 60 stay normal floats, so both steps are exact.
  core::Scenario s = TinyAmpScenario(1, 1, 1.0, 2000);
  std::unique_ptr<core::Replica> rep;
  RC_ASSERT(sim::MakeCpuReplica(s, 0, &rep).ok());
  std::vector<std::vector<float>> want;
  for (int i = 0; i < static_cast<int>(rep->ParamInfos().size()); ++i) {
    const int64_t n = rep->ParamInfos()[static_cast<size_t>(i)].numel();
    std::vector<double> g;
    for (int64_t k = 0; k < n; ++k) {
      const double m = 1.0 + *rc::gen::inRange(0, 1 << 23) * 0x1p-23;
      g.push_back((*rc::gen::arbitrary<bool>() ? -1 : 1) * std::ldexp(m, *rc::gen::inRange(-20, 20)));
    }
    rep->Memory().FromHost(core::Tensor(core::DType::kFloat32, {n}, g), rep->Grad(i));
    rep->SetGradDefined(i, true);
    want.emplace_back(g.begin(), g.end());
  }
  core::GradScaler scaler;
  RC_ASSERT(core::GradScaler::Create({std::ldexp(1.0, *rc::gen::inRange(-60, 61)), 2.0, 0.5, 2000}, &scaler).ok());
  rep->ScaleGrads(scaler.scale());
  RC_ASSERT(!rep->UnscaleGrads(scaler.inv_scale()));
  for (int i = 0; i < static_cast<int>(want.size()); ++i) {
    const core::Tensor got = rep->Memory().ToHost(rep->Grad(i), {static_cast<int64_t>(want[static_cast<size_t>(i)].size())});
    for (size_t k = 0; k < want[static_cast<size_t>(i)].size(); ++k) {
      RC_ASSERT(got.data[k] == static_cast<double>(want[static_cast<size_t>(i)][k]));
    }
  }
}

RC_GTEST_PROP(Amp, ScalerStateIsBitwiseIdenticalAcrossRanksAndWithTheReferenceAtEveryStep, ()) {
  const int world = *rc::gen::inRange(1, 5);
  const int64_t steps = *rc::gen::inRange<int64_t>(1, 6);
  // From 2^0 (never overflows) to 2^30 (overflows fp16 for several steps).
  const double scale = std::ldexp(1.0, *rc::gen::inRange(0, 31));
  const core::Scenario s = TinyAmpScenario(world, steps, scale, *rc::gen::inRange<int64_t>(1, 4));
  core::Trace got, ref;
  RC_ASSERT(testing::RunWorld(s, "local", -1, 0, &got).ok());
  RC_ASSERT(ref::RunReference(s, &ref).ok());
  for (int64_t k = 0; k < steps; ++k) {
    for (const char* name : {"scale", "growth_tracker", "found_inf", "skipped"}) {
      const core::Tensor* want = ref.Find({k, Checkpoint::kScaler, name, kAllRanks});
      RC_ASSERT(want != nullptr);
      for (int r = 0; r < world; ++r) {
        const core::Tensor* v = got.Find({k, Checkpoint::kScaler, name, r});
        RC_ASSERT(v != nullptr);
        RC_ASSERT(core::BitwiseEqual(*v, *want));
      }
    }
  }
}

}  // namespace
}  // namespace ddpcheck
