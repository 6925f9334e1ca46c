// Step-local replay with element-wise bounds (reference/step_local.h) raises no alarm on clean runs: random
// models (Linear, BatchNorm1d or SyncBatchNorm1d after a biased Linear, ReLU/Tanh, MSE or cross-entropy), W, batch sizes, no_sync windows and optimizers
// (SGD with momentum/nesterov/weight decay, Adam, AdamW) in float32 (with or without bfloat16/float16
// autocast) and float64, with the sim world's trace
// (ranks over the local communicator, the DDP protocol's own reduction order) as the run under test.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include "core/report.h"
#include "core/scenario.h"
#include "core/train_loop.h"
#include "reference/step_local.h"
#include "harness/check.h"

namespace ddpcheck {
namespace {

// Linear(in, hidden) [-> BatchNorm1d(hidden)] -> ReLU|Tanh -> Linear(hidden, out).
std::vector<core::LayerSpec> RandomModel(int64_t in, int64_t hidden, int64_t out) {
  std::vector<core::LayerSpec> layers(2);
  layers[0].type = layers[1].type = "linear";
  layers[0].in_features = in;
  layers[0].out_features = layers[1].in_features = hidden;
  layers[1].out_features = out;
  core::LayerSpec act;
  act.type = *rc::gen::element<std::string>("relu", "tanh");
  layers.insert(layers.begin() + 1, act);
  if (*rc::gen::arbitrary<bool>()) {
    core::LayerSpec bn;
    bn.type = *rc::gen::element<std::string>("batchnorm1d", "syncbatchnorm1d");
    bn.num_features = hidden;
    bn.momentum_none = *rc::gen::arbitrary<bool>();
    layers.insert(layers.begin() + 1, bn);
  }
  return layers;
}

core::Scenario RandomScenario() {
  core::Scenario s;
  s.name = "random-step-local";
  const auto in = *rc::gen::inRange<int64_t>(1, 13);
  const auto out = *rc::gen::inRange<int64_t>(2, 6);
  s.model = RandomModel(in, *rc::gen::inRange<int64_t>(1, 33), out);
  s.loss = *rc::gen::element<std::string>("mse", "cross_entropy");
  s.world = *rc::gen::inRange(1, 5);
  s.batch_size = *rc::gen::inRange<int64_t>(2, 9);
  s.ddp.no_sync_steps = *rc::gen::inRange<int64_t>(1, 3);
  s.ddp.timeout_ms = 5000;
  s.data.kind = s.loss == "mse" ? "regression" : "classification";
  s.data.in_features = in;
  s.data.out_features = out;
  s.data.seed = *rc::gen::inRange<uint64_t>(0, 1000);
  s.data.samples = static_cast<int64_t>(s.world) * s.batch_size * s.ddp.no_sync_steps * 3;
  s.init.seeds = {*rc::gen::inRange<uint64_t>(0, 1000)};
  s.optimizer.type = *rc::gen::element<std::string>("sgd", "adam", "adamw");
  if (s.optimizer.type == "sgd") {
    s.optimizer.lr = 0.05;
    s.optimizer.momentum = *rc::gen::element(0.0, 0.9);
    s.optimizer.nesterov = s.optimizer.momentum > 0 && *rc::gen::arbitrary<bool>();
    s.optimizer.weight_decay = *rc::gen::element(0.0, 1e-4);
  } else {
    s.optimizer.lr = 1e-2;
    s.optimizer.weight_decay = s.optimizer.type == "adamw" ? 1e-2 : *rc::gen::element(0.0, 1e-4);
  }
  s.epochs = 2;
  s.precision = *rc::gen::element(core::DType::kFloat64, core::DType::kFloat32);
  // Autocast (bfloat16 / float16) with or without a GradScaler on float32 master weights.
  if (s.precision == core::DType::kFloat32 && *rc::gen::arbitrary<bool>()) {
    s.amp.enabled = true;
    s.amp.grad_scaler = *rc::gen::arbitrary<bool>();
    s.amp.init_scale = *rc::gen::element(1.0, 1024.0, 65536.0);
    s.amp.growth_interval = *rc::gen::element<int64_t>(1, 2, 2000);
    s.amp.dtype = *rc::gen::element<std::string>("bf16", "fp16");
  }
  return s;
}

RC_GTEST_PROP(StepLocal, CleanSimRunsPassTheElementWiseBounds, ()) {
  const core::Scenario s = RandomScenario();
  RC_PRE(core::ValidateScenario(s).ok());
  harness::CheckOptions opts;
  opts.got = {harness::SourceKind::kSim, ""};
  opts.comm = "local";
  core::RunReport report;
  core::Trace sim_trace, ref_trace;
  RC_ASSERT(harness::Check(s, opts, &report, &sim_trace, &ref_trace).ok());
  core::Scenario materialised = s;
  RC_ASSERT(core::MaterializeData(&materialised).ok());
  for (const core::Trace* run : {&sim_trace, &ref_trace}) {
    core::CompareResult r;
    const core::Status st = ref::CheckStepLocal(materialised, *run, core::PolicyFor(s), &r);
    RC_ASSERT(st.ok());
    if (!r.pass) {
      RC_LOG() << core::ScenarioToJson(s).dump() << "\n" << core::DescribeMismatch(*r.first) << "\n";
    }
    RC_ASSERT(r.pass);
    RC_ASSERT(r.stats["params"].bounded > 0);
  }
  RC_CLASSIFY(s.model.size() == 4, "batchnorm");
  RC_CLASSIFY(s.model.size() == 4 && s.model[1].type == "syncbatchnorm1d", "syncbatchnorm");
  RC_CLASSIFY(s.loss == "cross_entropy", "cross-entropy");
  RC_CLASSIFY(s.precision == core::DType::kFloat32, "float32");
  RC_CLASSIFY(s.amp.enabled, "autocast");
  RC_CLASSIFY(s.amp.enabled && s.amp.grad_scaler, "grad-scaler");
}

}  // namespace
}  // namespace ddpcheck
