// The single-process reference trainer: the mathematical definition of a DDP step, written without any
// communicator or reducer. For every step, each rank's shard (from the sampler) is run through a copy of the
// model that starts from the shared parameters and rank 0's buffers (broadcast_buffers), with per-shard
// BatchNorm statistics; the gradient is DDP's: sum over ranks, in rank order, of each rank's local gradient
// times fl(1/W) (true division by W once gradients alias their buckets under gradient_as_bucket_view);
// parameters no rank used keep their gradient, locally unused ones contribute zeros. Then the optimizer and,
// at the end of each epoch, the schedulers. With AMP (scenario.amp) every rank's copy runs under autocast, its
// backward starts from the GradScaler's scale, and the summed grads go through the same unscale_/clip/skip/
// update as core/amp.h (kUnscaled and kScaler recorded for kAllRanks). With syncbatchnorm1d layers (W > 1)
// the ranks run in lockstep, one thread each, and those layers normalise with BatchNorm's statistics over the
// global batch (every rank's rows of the micro-step; reference/sync_bn_exchange.h) and backpropagate through
// them, while each rank's loss stays its own and DDP still averages the ranks' gradients. Records the same
// checkpoints as a world (kAllRanks for shared values), so traces line up.
#pragma once

#include <functional>
#include <vector>

#include "core/grad_scaler.h"
#include "core/optimizer.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"
#include "reference/model.h"

namespace ddpcheck::ref {

// The scenario's data must be materialised (core::MaterializeData). It never looks at faults (this is the
// oracle): the harness passes core::OracleScenario(s), where the faults that describe the user's setup are
// already the scenario's own settings.
core::Status RunReference(const core::Scenario& s, core::Trace* out);

// Points where a caller may look into (or, at load_state, set) the reference's state during a run: the
// step-local replay (reference/step_local.h) loads each step's starting state from a recorded run and
// propagates rounding-error bounds alongside the values. Any member may be empty.
template <typename T>
struct StepHooks {
  // Before step `step`: the master's parameters and buffers and the optimizer state may be replaced.
  std::function<core::Status(int64_t step, Model<T>* master, std::vector<core::ParamState<T>>* state)> load_state;
  // Before step `step` of a run with a GradScaler, after load_state: the scaler's state may be replaced.
  std::function<core::Status(int64_t step, core::GradScaler* scaler)> load_scaler;
  // After rank `rank`'s backward of micro-batch `micro` (x, y its batch). Runs on several threads at once
  // (the ranks of a step run in parallel, one thread per core, or in lockstep with SyncBatchNorm).
  std::function<void(int64_t step, int rank, int64_t micro, const Model<T>& worker, const Matrix<T>& x,
                     const core::Tensor& y)> after_backward;
  // After the reduction (master's grads hold the reduced gradient, unscaled with a GradScaler), before the
  // optimizer step with `lr` (not called for a step the GradScaler skips).
  std::function<void(int64_t step, const Model<T>& master, const std::vector<core::ParamState<T>>& state,
                     double lr)> before_optimizer;
  // After the optimizer step and the parameters' record.
  std::function<void(int64_t step, const Model<T>& master, const std::vector<core::ParamState<T>>& state)> after_step;
};

// RunReference in float64 (s.precision must be kFloat64) with hooks.
core::Status RunReferenceWithHooks(const core::Scenario& s, const StepHooks<double>& hooks, core::Trace* out);

}  // namespace ddpcheck::ref
