#include "reference/trainer.h"

#include <vector>

#include "core/faults.h"
#include "core/amp.h"
#include "core/lr_scheduler.h"
#include "core/optimizer.h"
#include "core/plan.h"
#include "reference/grad_ops.h"
#include "reference/rank_model.h"

namespace ddpcheck::ref {

namespace {

using core::Checkpoint;
using core::Tensor;

template <typename T>
Tensor ToTensor(const T* data, const core::ParamInfo& info, core::DType dtype) {
  return Tensor(dtype, info.shape, std::vector<double>(data, data + info.numel()));
}

template <typename T>
void RecordParams(const Model<T>& m, int64_t step, Checkpoint c, core::Trace* t) {
  for (int i = 0; i < m.num_params(); ++i) {
    t->Add({step, c, m.param_info(i).name, core::kAllRanks}, ToTensor(m.param_data(i), m.param_info(i), core::DTypeOf<T>()));
  }
}

template <typename T>
void RecordBuffers(const Model<T>& m, int64_t step, Checkpoint c, int rank, core::Trace* t) {
  for (int i = 0; i < m.num_buffers(); ++i) {
    t->Add({step, c, m.buffer_info(i).name, rank}, ToTensor(m.buffer_data(i), m.buffer_info(i), m.buffer_info(i).dtype));
  }
}

// worker := master's parameters and buffers (DDP's broadcasts); its rank, dropout stream and grads stay.
template <typename T>
void SyncFrom(const Model<T>& master, Model<T>* worker) {
  for (int i = 0; i < master.num_params(); ++i) {
    std::copy_n(master.param_data(i), master.param_info(i).numel(), worker->param_data(i));
  }
  for (int i = 0; i < master.num_buffers(); ++i) {
    std::copy_n(master.buffer_data(i), master.buffer_info(i).numel(), worker->buffer_data(i));
  }
}

template <typename T>
core::Status Run(const core::Scenario& s, core::Trace* trace) {
  const int world = s.world;
  Model<T> master;
  DDPCHECK_RETURN_IF_ERROR(BuildRankModel(s, 0, &master));
  std::vector<Model<T>> workers(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    // The user's model as each rank runs it (a branch not taken on some rank is the model's control flow;
    // the oracle handles it as DDP with find_unused_parameters=True would).
    core::Scenario rank_scenario;
    DDPCHECK_RETURN_IF_ERROR(core::ModelScenarioForRank(s, r, &rank_scenario));
    DDPCHECK_RETURN_IF_ERROR(BuildRankModel(rank_scenario, r, &workers[static_cast<size_t>(r)]));
  }
  RecordParams(master, 0, Checkpoint::kInit, trace);
  RecordBuffers(master, 0, Checkpoint::kInit, core::kAllRanks, trace);

  std::vector<std::vector<core::StepPlan>> plans(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    DDPCHECK_RETURN_IF_ERROR(core::PlanRank(s, r, core::SetupPlanOptions(s, r), &plans[static_cast<size_t>(r)]));
  }
  const int np = master.num_params();
  std::vector<core::ParamState<T>> state(static_cast<size_t>(np));
  std::vector<bool> aliased(static_cast<size_t>(np), false);
  core::LrSchedule schedule(s.optimizer.lr, s.schedulers);
  const T inv_world = static_cast<T>(1.0 / world);
  core::GradScaler scaler;
  if (s.amp.enabled) DDPCHECK_RETURN_IF_ERROR(core::MakeGradScaler(s.amp, 1.0, &scaler));
  const core::AmpGradOps amp_ops{[&](float inv) { return UnscaleGrads(&master, inv); },
                                 [&] { return GradNorm(master); }, [&](double f) { ScaleGrads(&master, f); }};
  // uneven-shard-mean: the oracle is the global-batch mean (each rank weighted by its sample count), which
  // DDP's mean of per-rank means equals only when every rank's batch has the same size.
  const bool global_mean = core::ScenarioHasFault(s, "uneven-shard-mean");

  for (size_t step_i = 0; step_i < plans[0].size(); ++step_i) {
    const int64_t step = plans[0][step_i].step;
    master.ZeroGrad(false);
    std::vector<std::vector<T>> sum(static_cast<size_t>(np));
    std::vector<bool> used_any(static_cast<size_t>(np), false);
    for (int p = 0; p < np; ++p) sum[static_cast<size_t>(p)].assign(static_cast<size_t>(master.param_info(p).numel()), T(0));

    double total_rows = 0;
    for (int r = 0; r < world; ++r) {
      for (const auto& mb : plans[static_cast<size_t>(r)][step_i].micro_batches) total_rows += static_cast<double>(mb.size());
    }
    for (int r = 0; r < world; ++r) {
      Model<T>& w = workers[static_cast<size_t>(r)];
      const core::StepPlan& plan = plans[static_cast<size_t>(r)][step_i];
      SyncFrom(master, &w);
      w.ZeroGrad(true);
      w.SetTraining(true);
      std::vector<double> rows;
      for (const auto& mb : plan.micro_batches) rows.insert(rows.end(), mb.begin(), mb.end());
      trace->Add({step, Checkpoint::kSampler, "indices", r},
                 Tensor(core::DType::kInt64, {static_cast<int64_t>(rows.size())}, rows));
      RecordBuffers(w, step, Checkpoint::kForwardBuffers, r, trace);
      std::vector<bool> used(static_cast<size_t>(np), false);
      const size_t k = plan.micro_batches.size();
      for (size_t m = 0; m < k; ++m) {
        const core::Batch b = core::MakeBatch(s.data.x, s.data.y, plan.micro_batches[m]);
        w.SetMicroStep(static_cast<int64_t>(m));
        Matrix<T> x(b.x.shape[0], b.x.shape[1]);
        for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = static_cast<T>(b.x.data[static_cast<size_t>(i)]);
        DDPCHECK_RETURN_IF_ERROR(w.CheckInputs(x, b.y).Prefixed("reference, rank " + std::to_string(r)));
        const T loss = w.Forward(x, b.y);
        trace->Add({step, Checkpoint::kLoss, k == 1 ? "loss" : "loss." + std::to_string(m), r},
                   Tensor::Scalar(static_cast<double>(loss), s.precision));
        const T loss_scale = s.amp.enabled ? static_cast<T>(scaler.scale()) : T(1);
        w.Backward(loss_scale, [&](int p) { used[static_cast<size_t>(p)] = true; });
      }
      for (int p = 0; p < np; ++p) {
        const auto pi = static_cast<size_t>(p);
        if (!used[pi]) continue;  // locally unused: contributes zeros
        used_any[pi] = true;
        const T* g = w.grad_data(p);
        trace->Add({step, Checkpoint::kLocalGrad, w.param_info(p).name, r}, ToTensor(g, w.param_info(p), core::DTypeOf<T>()));
        for (size_t e = 0; e < sum[pi].size(); ++e) {
          sum[pi][e] += global_mean ? g[e] * static_cast<T>(static_cast<double>(rows.size()) / total_rows)
                        : aliased[pi] ? g[e] / static_cast<T>(world) : g[e] * inv_world;
        }
      }
      RecordBuffers(w, step, Checkpoint::kBuffers, r, trace);
    }
    // Rank 0's buffers survive into the next step's broadcast.
    for (int i = 0; i < master.num_buffers(); ++i) {
      std::copy_n(workers[0].buffer_data(i), master.buffer_info(i).numel(), master.buffer_data(i));
    }
    for (int p = 0; p < np; ++p) {
      const auto pi = static_cast<size_t>(p);
      if (!used_any[pi]) continue;  // globally unused: the grad is left untouched
      std::copy(sum[pi].begin(), sum[pi].end(), master.grad_data(p));
      master.set_grad_defined(p, true);
      if (s.ddp.gradient_as_bucket_view) aliased[pi] = true;
      trace->Add({step, Checkpoint::kReduced, master.param_info(p).name, core::kAllRanks},
                 ToTensor(master.grad_data(p), master.param_info(p), core::DTypeOf<T>()));
    }
    bool found_inf = false;
    if (s.amp.enabled) {
      const core::AmpStepOptions o{s.amp.clip_grad_norm, /*clip_before_unscale=*/false, core::DTypeOf<T>()};
      DDPCHECK_RETURN_IF_ERROR(core::AmpUnscaleAndClip(o, amp_ops, &scaler, &found_inf));
      for (int p = 0; p < np; ++p) {
        if (!master.grad_defined(p)) continue;
        trace->Add({step, Checkpoint::kUnscaled, master.param_info(p).name, core::kAllRanks},
                   ToTensor(master.grad_data(p), master.param_info(p), core::DTypeOf<T>()));
      }
    }
    const double lr = schedule.lr();
    trace->Add({step, Checkpoint::kLr, "lr", core::kAllRanks}, Tensor::Scalar(lr));
    for (int p = 0; p < np && !found_inf; ++p) {
      if (!master.grad_defined(p)) continue;
      core::OptimizerStep<T>(s.optimizer, lr, master.param_data(p), master.grad_data(p), master.param_info(p).numel(),
                             &state[static_cast<size_t>(p)]);
    }
    if (s.amp.enabled) {
      DDPCHECK_RETURN_IF_ERROR(scaler.UpdateAfterStep());
      for (auto& [name, t] : core::ScalerRecord(scaler, found_inf, found_inf)) {
        trace->Add({step, Checkpoint::kScaler, name, core::kAllRanks}, t);
      }
    }
    RecordParams(master, step, Checkpoint::kParams, trace);
    if (plans[0][step_i].last_in_epoch) {
      for (int r = 0; r < world; ++r) {
        const std::vector<int64_t> eval = core::EvalIndices(s, r, /*count_padding=*/false);
        trace->Add({step, Checkpoint::kSampler, "eval_indices", r},
                   Tensor(core::DType::kInt64, {static_cast<int64_t>(eval.size())}, std::vector<double>(eval.begin(), eval.end())));
      }
      schedule.Step();
    }
  }
  return core::Status::Ok();
}

}  // namespace

core::Status RunReference(const core::Scenario& s, core::Trace* out) {
  out->meta["backend"] = "reference";
  out->meta["world"] = s.world;
  out->meta["precision"] = core::DTypeName(s.precision);
  out->meta["scenario"] = s.name;
  if (s.precision == core::DType::kFloat32) return Run<float>(s, out);
  return Run<double>(s, out);
}

}  // namespace ddpcheck::ref
