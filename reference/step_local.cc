#include "reference/step_local.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <variant>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/amp.h"
#include "core/parallel.h"
#include "core/train_loop.h"
#include "reference/error_bounds.h"
#include "reference/trainer.h"

namespace ddpcheck::ref {

namespace {

using core::Checkpoint;
using core::Tensor;

const char* const kOptStates[] = {"momentum_buffer", "exp_avg", "exp_avg_sq"};

// The recorded value of (step, c, name): the shared record, else rank 0's.
const Tensor* Recorded(const core::Trace& t, int64_t step, Checkpoint c, const std::string& name) {
  if (const Tensor* v = t.Find({step, c, name, core::kAllRanks})) return v;
  return t.Find({step, c, name, 0});
}

Tensor AsTensor(std::vector<double> v, const std::vector<int64_t>& shape) {
  return Tensor(core::DType::kFloat64, shape, std::move(v));
}

// One rank's model and micro-batch, kept for a group analysis.
struct Stashed {
  Model<double> model;
  Matrix<double> x;
  Tensor y;
};

// What the hooks accumulate within one step.
struct StepBounds {
  std::mutex mu;
  bool ok = true;                                         // every micro-batch had rules
  std::map<int, std::vector<std::vector<double>>> grad;   // rank -> per param accumulated bound
  // rank -> per param local grad (after the last micro-batch): the rank's own model's grad where it lives until
  // the optimizer's bounds (a rank's worker), else a copy (a model kept only for a group analysis).
  std::map<int, std::vector<const double*>> gval;
  std::map<int, std::vector<std::vector<double>>> gcopy;
  std::map<int, std::vector<std::vector<double>>> buf;    // rank -> per buffer bound
  std::map<int, std::vector<double>> loss;                // rank -> per micro-batch loss bound
  std::map<int64_t, std::map<int, Stashed>> group;       // micro-batch -> rank -> kept for a group analysis
};

class Replayer {
 public:
  Replayer(const core::Scenario& s, const core::Trace& recorded, core::Trace* bounds)
      : s_(s), rec_(recorded), bounds_(bounds),
        u_(core::UnitRoundoff(s.precision) + core::UnitRoundoff(core::DType::kFloat64)) {}

  StepHooks<double> Hooks() {
    StepHooks<double> h;
    h.load_state = [this](int64_t step, Model<double>* m, std::vector<core::ParamState<double>>* st) {
      return Load(step, m, st);
    };
    h.load_scaler = [this](int64_t step, core::GradScaler* scaler) { return LoadScaler(step, scaler); };
    h.after_backward = [this](int64_t step, int rank, int64_t micro, const Model<double>& w, const Matrix<double>& x,
                              const Tensor& y) { AfterBackward(step, rank, micro, w, x, y); };
    h.before_optimizer = [this](int64_t step, const Model<double>& m, const std::vector<core::ParamState<double>>& st,
                                double lr) { BeforeOptimizer(step, m, st, lr); };
    h.after_step = [this](int64_t step, const Model<double>& m, const std::vector<core::ParamState<double>>& st) {
      RecordState(step, m, st);
    };
    return h;
  }
  void set_values(core::Trace* v) { values_ = v; }
  // Called as step `step` starts (every earlier step's values and bounds are complete).
  void set_on_step_start(std::function<void(int64_t)> f) { on_step_start_ = std::move(f); }

 private:
  core::Status Load(int64_t step, Model<double>* m, std::vector<core::ParamState<double>>* st) {
    if (on_step_start_) on_step_start_(step);
    sb_ = std::make_unique<StepBounds>();
    const int64_t prev = step - 1;
    std::map<std::string, const Tensor*> vals;
    for (const auto& info : m->param_infos()) {
      const Tensor* t = step == 0 ? Recorded(rec_, 0, Checkpoint::kInit, info.name)
                                  : Recorded(rec_, prev, Checkpoint::kParams, info.name);
      if (t) vals[info.name] = t;
    }
    for (const auto& info : m->buffer_infos()) {
      const Tensor* t = step == 0 ? Recorded(rec_, 0, Checkpoint::kInit, info.name)
                                  : Recorded(rec_, prev, Checkpoint::kBuffers, info.name);
      if (t) vals[info.name] = t;
    }
    DDPCHECK_RETURN_IF_ERROR(m->LoadValues(vals).Prefixed(fmt::format("step-local replay, step {}", step)));
    for (int p = 0; p < m->num_params(); ++p) {
      const std::string& name = m->param_info(p).name;
      auto& ps = (*st)[static_cast<size_t>(p)];
      if (step == 0) continue;
      // A state the run did not record (a trace of the sim world) stays the replay's own.
      // Its error bound then carries on too (state_err_); a recorded state is exact.
      auto load = [&](const char* state, std::vector<double>* dst) {
        if (const Tensor* t = Recorded(rec_, prev, Checkpoint::kParams, std::string("opt.") + state + "." + name)) {
          *dst = t->data;
          state_err_[name].erase(state);
        }
      };
      load("momentum_buffer", &ps.momentum_buffer);
      load("exp_avg", &ps.exp_avg);
      load("exp_avg_sq", &ps.exp_avg_sq);
      if (s_.optimizer.type != "sgd") {
        // state['step']: the steps so far in which the parameter had a grad and the optimizer ran (a
        // GradScaler skips a step whose gradients overflowed).
        int n = 0;
        for (int64_t t = 0; t < step; ++t) {
          const Tensor* skipped = Recorded(rec_, t, Checkpoint::kScaler, "skipped");
          n += Recorded(rec_, t, Checkpoint::kReduced, name) != nullptr && !(skipped && skipped->data.at(0) != 0);
        }
        ps.step = static_cast<float>(n);
        if (n == 0) {
          ps.exp_avg.clear();
          ps.exp_avg_sq.clear();
        }
      }
    }
    return core::Status::Ok();
  }

  // A GradScaler's state at the start of step s: the run's record of step s - 1 (its scale and growth tracker
  // after update()), else the replay's own. The step's loss scale and 1/scale as the run used them.
  core::Status LoadScaler(int64_t step, core::GradScaler* scaler) {
    const Tensor* scale = step > 0 ? Recorded(rec_, step - 1, Checkpoint::kScaler, "scale") : nullptr;
    const Tensor* tracker = step > 0 ? Recorded(rec_, step - 1, Checkpoint::kScaler, "growth_tracker") : nullptr;
    if (scale && tracker && scale->numel() == 1 && tracker->numel() == 1) {
      const nlohmann::json state = {{"scale", scale->data[0]},
                                    {"growth_factor", s_.amp.growth_factor},
                                    {"backoff_factor", s_.amp.backoff_factor},
                                    {"growth_interval", s_.amp.growth_interval},
                                    {"_growth_tracker", static_cast<int64_t>(tracker->data[0])}};
      DDPCHECK_RETURN_IF_ERROR(scaler->LoadStateDict(state).Prefixed(fmt::format("step-local replay, step {}", step)));
    }
    loss_scale_ = scaler->scale();
    inv_scale_ = scaler->inv_scale();
    return core::Status::Ok();
  }

  void AfterBackward(int64_t step, int rank, int64_t micro, const Model<double>& w, const Matrix<double>& x,
                     const Tensor& y) {
    (void)step;
    if (Synchronises(w)) {
      // A synchronising SyncBatchNorm's bounds need every rank's micro-batch: keep a copy of this rank's model
      // (its state after this micro-batch) and batch until the step's ranks are all done (BeforeOptimizer).
      std::lock_guard<std::mutex> lock(sb_->mu);
      sb_->group[micro].emplace(rank, Stashed{w, x, y});
      return;
    }
    MicroBatchBounds mb;
    const bool ok = MicroBatchErrorBounds(w, x, y, loss_scale_, u_, &mb);
    std::lock_guard<std::mutex> lock(sb_->mu);
    if (!ok) {
      sb_->ok = false;
      return;
    }
    Accumulate(rank, micro, w, std::move(mb), /*live=*/true);
  }

  static bool Synchronises(const Model<double>& w) {
    for (int i = 0; i < w.num_layers(); ++i) {
      if (const auto* l = std::get_if<SyncBatchNorm1d<double>>(&w.layer(i)); l && l->Syncs(w.sync_bn_group())) return true;
    }
    return false;
  }

  // The group analysis of every micro-batch whose ranks AfterBackward kept, in micro-batch order.
  void BoundStashedGroups() {
    for (auto& [micro, ranks] : sb_->group) {
      std::vector<const Model<double>*> models;
      std::vector<const Matrix<double>*> xs;
      std::vector<const Tensor*> ys;
      for (const auto& [rank, st] : ranks) {
        models.push_back(&st.model);
        xs.push_back(&st.x);
        ys.push_back(&st.y);
      }
      std::vector<MicroBatchBounds> mbs;
      if (!GroupMicroBatchErrorBounds(models, xs, ys, loss_scale_, u_, &mbs)) {
        sb_->ok = false;
        break;
      }
      size_t j = 0;
      for (const auto& [rank, st] : ranks) Accumulate(rank, micro, st.model, std::move(mbs[j++]), /*live=*/false);
    }
    sb_->group.clear();
  }

  // Adds one micro-batch's bounds to rank's accumulated ones (sb_->mu held or single-threaded). `live`: w is the
  // rank's worker, whose grads stay as they are until the optimizer's bounds; else they are copied.
  void Accumulate(int rank, int64_t micro, const Model<double>& w, MicroBatchBounds mb, bool live) {
    auto& g = sb_->grad[rank];
    auto& gv = sb_->gval[rank];
    g.resize(static_cast<size_t>(w.num_params()));
    gv.resize(static_cast<size_t>(w.num_params()), nullptr);
    for (int p = 0; p < w.num_params(); ++p) {
      const auto pi = static_cast<size_t>(p);
      if (!w.grad_defined(p)) continue;
      const int64_t n = w.param_info(p).numel();
      if (live) {
        gv[pi] = w.grad_data(p);
      } else {
        auto& copies = sb_->gcopy[rank];
        copies.resize(static_cast<size_t>(w.num_params()));
        copies[pi].assign(w.grad_data(p), w.grad_data(p) + n);
        gv[pi] = copies[pi].data();
      }
      if (micro == 0 && g[pi].empty() && mb.grad[pi].size() == static_cast<size_t>(n)) {
        g[pi] = std::move(mb.grad[pi]);  // 0 + the first micro-batch's bound
        continue;
      }
      if (g[pi].empty()) g[pi].assign(static_cast<size_t>(n), 0.0);
      if (mb.grad[pi].empty()) continue;
      // autograd's += of this micro-batch's grad: one more rounding of the sum.
      for (size_t k = 0; k < g[pi].size(); ++k) g[pi][k] += mb.grad[pi][k] + (micro > 0 ? u_ * std::abs(gv[pi][k]) : 0.0);
    }
    auto& b = sb_->buf[rank];
    b.resize(mb.buffer.size());
    for (size_t i = 0; i < mb.buffer.size(); ++i) {
      if (mb.buffer[i].empty()) continue;
      if (b[i].empty()) b[i].assign(mb.buffer[i].size(), 0.0);
      for (size_t k = 0; k < b[i].size(); ++k) b[i][k] += mb.buffer[i][k];
    }
    sb_->loss[rank].push_back(mb.loss);
  }

  void BeforeOptimizer(int64_t step, const Model<double>& m, const std::vector<core::ParamState<double>>& st,
                       double lr) {
    if (sb_->ok) BoundStashedGroups();
    if (!sb_->ok || sb_->grad.empty()) return;
    const double W = s_.world;
    for (const auto& [rank, losses] : sb_->loss) {
      for (size_t k = 0; k < losses.size(); ++k) {
        bounds_->Add({step, Checkpoint::kLoss, losses.size() == 1 ? "loss" : "loss." + std::to_string(k), rank},
                     Tensor::Scalar(losses[k]));
      }
    }
    for (const auto& [rank, eb] : sb_->buf) {
      for (size_t i = 0; i < eb.size(); ++i) {
        if (!eb[i].empty()) bounds_->Add({step, Checkpoint::kBuffers, m.buffer_info(static_cast<int>(i)).name, rank},
                                         AsTensor(eb[i], m.buffer_info(static_cast<int>(i)).shape));
      }
    }
    for (int p = 0; p < m.num_params(); ++p) {
      const auto pi = static_cast<size_t>(p);
      if (!m.grad_defined(p)) continue;
      const int64_t n = m.param_info(p).numel();
      const auto& shape = m.param_info(p).shape;
      // The all-reduce: a sum over the W ranks' grads (any order: g(W) of the summed magnitudes), divided by W.
      // With a GradScaler the master's grad is already unscaled: the reduced one is it times the scale, and the
      // unscaled one (what the optimizer reads) the reduced one times 1/scale, one more rounding.
      std::vector<std::pair<const double*, const double*>> ranks;  // (bound, value) of each rank's local grad
      for (auto& [rank, eg] : sb_->grad) {
        if (pi >= eg.size() || eg[pi].empty()) continue;
        ranks.emplace_back(eg[pi].data(), sb_->gval[rank][pi]);
      }
      const double* g = m.grad_data(p);
      std::vector<double> e(static_cast<size_t>(n));
      core::ParallelForChunks(n, int64_t{1} << 16, [&](int64_t begin, int64_t end) {  // each element as before
        for (int64_t k = begin; k < end; ++k) {
          double ek = 0.0, mag = 0.0;
          for (const auto& [eg, gv] : ranks) {
            ek += eg[k] / W;
            mag += std::abs(gv[k]) / W;
          }
          e[static_cast<size_t>(k)] = ek + (core_gamma(W) * mag + u_ * std::abs(g[k]) * loss_scale_);
        }
      });
      for (auto& [rank, eg] : sb_->grad) {
        if (pi >= eg.size() || eg[pi].empty()) continue;
        bounds_->Add({step, Checkpoint::kLocalGrad, m.param_info(p).name, rank}, AsTensor(std::move(eg[pi]), shape));
      }
      // (each bound is moved into bounds_ once nothing reads it: these are the model's size each)
      std::vector<double> reduced;
      if (scaled_) {
        reduced = e;
        for (size_t k = 0; k < e.size(); ++k) e[k] = e[k] * inv_scale_ + u_ * std::abs(g[k]);
      }
      std::vector<double> ep;
      std::map<std::string, std::vector<double>> estate;
      OptimizerErrorBounds(s_.optimizer, lr, m.param_data(p), g, e, n, st[pi], &state_err_[m.param_info(p).name], u_,
                           &ep, &estate);
      NanToInf(&ep);
      for (auto& [state, es] : estate) NanToInf(&es);
      if (scaled_) {
        bounds_->Add({step, Checkpoint::kReduced, m.param_info(p).name, core::kAllRanks}, AsTensor(std::move(reduced), shape));
        bounds_->Add({step, Checkpoint::kUnscaled, m.param_info(p).name, core::kAllRanks}, AsTensor(std::move(e), shape));
      } else {
        bounds_->Add({step, Checkpoint::kReduced, m.param_info(p).name, core::kAllRanks}, AsTensor(std::move(e), shape));
      }
      bounds_->Add({step, Checkpoint::kParams, m.param_info(p).name, core::kAllRanks}, AsTensor(std::move(ep), shape));
      for (const auto& [state, es] : estate) {
        bounds_->Add({step, Checkpoint::kParams, "opt." + state + "." + m.param_info(p).name, core::kAllRanks},
                     AsTensor(es, shape));
      }
      state_err_[m.param_info(p).name] = std::move(estate);
    }
    // Parameters without a gradient keep their value exactly.
    for (int p = 0; p < m.num_params(); ++p) {
      if (m.grad_defined(p)) continue;
      bounds_->Add({step, Checkpoint::kParams, m.param_info(p).name, core::kAllRanks},
                   AsTensor(std::vector<double>(static_cast<size_t>(m.param_info(p).numel()), 0.0), m.param_info(p).shape));
    }
  }

  void RecordState(int64_t step, const Model<double>& m, const std::vector<core::ParamState<double>>& st) {
    for (int p = 0; p < m.num_params(); ++p) {
      const auto& ps = st[static_cast<size_t>(p)];
      const std::vector<double>* v[] = {&ps.momentum_buffer, &ps.exp_avg, &ps.exp_avg_sq};
      for (int k = 0; k < 3; ++k) {
        if (v[k]->empty()) continue;
        values_->Add({step, Checkpoint::kParams, std::string("opt.") + kOptStates[k] + "." + m.param_info(p).name,
                      core::kAllRanks},
                     AsTensor(*v[k], m.param_info(p).shape));
      }
    }
  }

  double core_gamma(double n) const { return Gamma(n, u_); }

  const core::Scenario& s_;
  const core::Trace& rec_;
  core::Trace* bounds_;
  core::Trace* values_ = nullptr;
  double u_;
  const bool scaled_ = core::UsesGradScaler(s_.amp);
  double loss_scale_ = 1.0, inv_scale_ = 1.0;  // the GradScaler's, this step
  std::unique_ptr<StepBounds> sb_;
  std::function<void(int64_t)> on_step_start_;
  // Per parameter: the error bound of optimizer state the replay carries on from its own previous step.
  std::map<std::string, std::map<std::string, std::vector<double>>> state_err_;
};

}  // namespace

// Autocast, with or without a GradScaler, as long as it does not clip (clipping has no rules in error_bounds.h).
bool StepLocalSupported(const core::Scenario& s) { return !s.amp.enabled || s.amp.clip_grad_norm == 0; }

namespace {

core::Status Replay(const core::Scenario& s, const core::Trace& recorded, core::Trace* values, core::Trace* bounds,
                    std::function<void(int64_t)> on_step_start) {
  if (!StepLocalSupported(s)) return core::Status::Invalid("step-local replay: gradient clipping under AMP is not supported");
  core::Scenario s64 = s;
  s64.precision = core::DType::kFloat64;
  DDPCHECK_RETURN_IF_ERROR(core::MaterializeData(&s64));
  Replayer r(s, recorded, bounds);
  r.set_values(values);
  r.set_on_step_start(std::move(on_step_start));
  return RunReferenceWithHooks(s64, r.Hooks(), values);
}

}  // namespace

core::Status ReplayStepLocal(const core::Scenario& s, const core::Trace& recorded, core::Trace* values,
                             core::Trace* bounds) {
  return Replay(s, recorded, values, bounds, nullptr);
}

core::Status CheckStepLocal(const core::Scenario& s, const core::Trace& recorded, const core::TolerancePolicy& fallback,
                            core::CompareResult* result, core::Trace* values) {
  // Each step is compared as soon as the replay has finished it, and its values and bounds are dropped (the
  // caller's *values keeps them), so the replay holds one step of a large model, not the whole run.
  core::Trace replayed, bounds, kept;
  int max_rank = -1;
  for (const auto& [key, v] : recorded.records()) max_rank = std::max(max_rank, key.rank);
  core::CompareResult total;
  auto flush = [&](int64_t last_step) {
    core::Trace v = replayed.TakeSteps(last_step);
    core::Trace b = bounds.TakeSteps(last_step);
    if (v.records().empty()) return;
    const core::StepRange range{v.records().begin()->first.step, last_step, max_rank};
    total.Merge(core::CompareTraces(recorded, v, fallback, b, /*policy_step=*/0, range));
    if (values) {
      for (auto& [key, t] : v.records()) kept.Add(key, t.ptr());
    }
  };
  DDPCHECK_RETURN_IF_ERROR(Replay(s, recorded, &replayed, &bounds, [&](int64_t step) { flush(step - 1); }));
  flush(std::numeric_limits<int64_t>::max());
  if (values) {
    kept.meta = replayed.meta;
    *values = std::move(kept);
  }
  *result = std::move(total);
  result->derivation = fmt::format(
      "step-local: every step replayed in float64 from the state the run recorded at its start, so the budget "
      "covers one step. Each value has its own bound from a running error analysis (docs/tolerance.md): a sum or "
      "dot product of n terms adds g(n) = nu/(1-nu) times the sum of its terms' magnitudes, the all-reduce over "
      "W = {} ranks g(W), BatchNorm, the loss and the optimizer update their own terms, each propagated to "
      "first order; u = {:.3g} ({} plus the float64 replay's own), safety factor {}. Values without a bound "
      "(forward buffers): ",
      s.world, core::UnitRoundoff(s.precision) + core::UnitRoundoff(core::DType::kFloat64),
      core::DTypeName(s.precision), core::kBoundSafety) + fallback.Derivation() + " (at s = 0)";
  return core::Status::Ok();
}

}  // namespace ddpcheck::ref
