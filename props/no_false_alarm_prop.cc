// With no fault injected, the harness never raises an alarm: random clean scenarios (models with BatchNorm or
// SyncBatchNorm, W, batch sizes, uneven splits, bucket caps, no_sync windows, AMP on/off) pass sim-vs-reference
// and every rank invariant.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <nlohmann/json.hpp>

#include "core/report.h"
#include "core/scenario.h"
#include "harness/check.h"

namespace ddpcheck {
namespace {

core::LayerSpec Linear(int64_t in, int64_t out) {
  core::LayerSpec l;
  l.type = "linear";
  l.in_features = in;
  l.out_features = out;
  return l;
}

core::Scenario RandomCleanScenario() {
  core::Scenario s;
  s.name = "random-clean";
  const auto in = *rc::gen::inRange<int64_t>(1, 7);
  const auto hidden = *rc::gen::inRange<int64_t>(1, 9);
  const auto out = *rc::gen::inRange<int64_t>(1, 5);
  s.model.push_back(Linear(in, hidden));
  const bool has_bn = *rc::gen::arbitrary<bool>();
  if (has_bn) {
    core::LayerSpec bn;
    bn.type = *rc::gen::element<std::string>("batchnorm1d", "syncbatchnorm1d");
    bn.num_features = hidden;
    bn.momentum_none = *rc::gen::arbitrary<bool>();
    s.model.push_back(bn);
  }
  core::LayerSpec act;
  act.type = *rc::gen::element<std::string>("relu", "tanh");
  s.model.push_back(act);
  s.model.push_back(Linear(hidden, out));
  s.world = *rc::gen::inRange(1, 6);
  s.batch_size = *rc::gen::inRange<int64_t>(2, 5);
  s.ddp.no_sync_steps = *rc::gen::inRange<int64_t>(1, 3);
  s.ddp.bucket_cap_mb = *rc::gen::element(25.0, 0.0001, 0.001);
  s.ddp.first_bucket_bytes = *rc::gen::element<int64_t>(1048576, 64, 256);
  s.ddp.find_unused_parameters = *rc::gen::arbitrary<bool>();
  s.ddp.gradient_as_bucket_view = *rc::gen::arbitrary<bool>();
  s.ddp.timeout_ms = 5000;
  s.data.kind = "regression";
  s.data.in_features = in;
  s.data.out_features = out;
  s.data.seed = *rc::gen::inRange<uint64_t>(0, 1000);
  // Enough rows that every micro-batch holds >= 2 samples (BatchNorm) for two optimizer steps.
  s.data.samples = static_cast<int64_t>(s.world) * s.batch_size * s.ddp.no_sync_steps * 2;
  // An uneven split (ranks 1..W-1 one sample short): their last micro-batch holds batch_size - 1 rows, which
  // must stay >= 2 for a BatchNorm (or a SyncBatchNorm with W = 1).
  s.sampler.uneven_split = *rc::gen::arbitrary<bool>() && (!has_bn || s.batch_size >= 3);
  s.init.seeds = {*rc::gen::inRange<uint64_t>(0, 1000)};
  s.optimizer.lr = 0.05;
  s.optimizer.momentum = *rc::gen::element(0.0, 0.9);
  s.epochs = 2;
  s.precision = *rc::gen::element(core::DType::kFloat64, core::DType::kFloat32);
  if (*rc::gen::arbitrary<bool>()) {
    s.precision = core::DType::kFloat32;
    s.amp.enabled = true;
    s.amp.dtype = *rc::gen::element<std::string>("fp16", "bf16");
  }
  return s;
}

RC_GTEST_PROP(NoFalseAlarm, RandomCleanScenariosPassEveryCheck, ()) {
  core::Scenario s = RandomCleanScenario();
  const core::Status valid = core::ValidateScenario(s);
  RC_PRE(valid.ok());
  harness::CheckOptions opts;
  opts.comm = "local";
  core::RunReport report;
  const core::Status st = harness::Check(s, opts, &report);
  RC_ASSERT(st.ok());
  if (!report.pass()) RC_LOG() << core::ScenarioToJson(s).dump() << "\n" << core::FormatTerminal(report);
  RC_ASSERT(report.pass());
  RC_ASSERT(report.steps > 0);
  RC_CLASSIFY(s.amp.enabled, "amp");
  RC_CLASSIFY(!s.model.empty() && s.model[1].type == "syncbatchnorm1d", "syncbn");
  RC_CLASSIFY(s.sampler.uneven_split, "uneven split");
  RC_CLASSIFY(s.world > 2, "W>2");
}

}  // namespace
}  // namespace ddpcheck
