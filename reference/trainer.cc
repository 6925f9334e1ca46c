#include "reference/trainer.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

#include <fmt/format.h>

#include "core/amp.h"
#include "core/buckets.h"
#include "core/gloo_ring.h"
#include "core/lr_scheduler.h"
#include "core/optimizer.h"
#include "core/parallel.h"
#include "core/plan.h"
#include "reference/grad_ops.h"
#include "reference/rank_model.h"
#include "reference/sync_bn_exchange.h"

namespace ddpcheck::ref {

namespace {

using core::Checkpoint;
using core::Tensor;

template <typename T>
Tensor ToTensor(const T* data, const core::ParamInfo& info, core::DType dtype) {
  return Tensor(dtype, info.shape, std::vector<double>(data, data + info.numel()));
}

// A value as a trace holds it: float32 of a model's size as floats (core::RecordValue), else widened.
template <typename T>
std::shared_ptr<const core::RecordValue> ToRecord(const T* data, const core::ParamInfo& info) {
  if constexpr (std::is_same_v<T, float>) {
    if (core::Trace::HeldAsFloats(core::DTypeOf<T>(), info.numel()))
      return std::make_shared<const core::RecordValue>(info.shape, std::vector<float>(data, data + info.numel()));
  }
  return std::make_shared<const core::RecordValue>(ToTensor(data, info, core::DTypeOf<T>()));
}

// Records values of a model's size: each copied out on every core (a fresh vector, written and page-faulted),
// except where the trace's twin source holds a bitwise equal value of the same key (compared where it lies: the
// CPU world's, which this computation repeats), then added in order.
template <typename T>
void RecordAll(core::Trace* trace, const std::vector<core::TraceKey>& keys,
               const std::vector<std::pair<const T*, const core::ParamInfo*>>& from) {
  std::vector<std::shared_ptr<const core::RecordValue>> shared(from.size());
  std::vector<std::shared_ptr<const core::RecordValue>> out(from.size());
  core::ParallelFor(static_cast<int64_t>(from.size()), [&](int64_t i) {
    const auto k = static_cast<size_t>(i);
    const auto& [data, info] = from[k];
    shared[k] = trace->SourceRecord(keys[k], [&](const core::RecordValue& t) {
      if (t.dtype() != core::DTypeOf<T>() || t.shape() != info->shape) return false;
      if constexpr (std::is_same_v<T, float>) {
        if (const core::RecordValue::Floats f = t.floats()) {
          return std::memcmp(f->data(), data, static_cast<size_t>(t.numel()) * sizeof(float)) == 0;
        }
      }
      return core::WidenedBitwiseEqual(data, t.tensor().data);
    });
    if (!shared[k]) out[k] = ToRecord(data, *info);
  });
  for (size_t k = 0; k < from.size(); ++k) {
    if (shared[k]) {
      trace->AddShared(keys[k], std::move(shared[k]));
    } else {
      trace->Add(keys[k], std::move(out[k]));
    }
  }
}

template <typename T>
void RecordParams(const Model<T>& m, int64_t step, Checkpoint c, core::Trace* t) {
  std::vector<std::pair<const T*, const core::ParamInfo*>> from;
  std::vector<core::TraceKey> keys;
  for (int i = 0; i < m.num_params(); ++i) {
    from.emplace_back(m.param_data(i), &m.param_info(i));
    keys.push_back({step, c, m.param_info(i).name, core::kAllRanks});
  }
  RecordAll(t, keys, from);
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

// Runs run_rank(r) for every rank at once, one thread each (their SyncBatchNorm layers meet in `exchange`).
// The first rank to fail aborts the exchange so no other rank waits for it; its status is returned.
template <typename T, typename Fn>
core::Status RunLockstep(int world, const Fn& run_rank, SyncBnExchange<T>* exchange) {
  exchange->Reset();
  std::mutex mu;
  core::Status first;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      core::Status st;
      try {
        st = run_rank(r);
      } catch (const std::exception& e) {
        st = core::Status::Internal(std::string("reference, rank ") + std::to_string(r) + ": " + e.what());
      }
      if (st.ok()) return;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (first.ok()) first = st;  // the root cause: an aborted rank fails only after this one
      }
      exchange->Abort("rank " + std::to_string(r) + " failed: " + st.message());
    });
  }
  for (auto& t : threads) t.join();
  return first;
}

// Runs run_rank(r) for every rank, spread over at most one thread per core (ranks are independent within a
// step without SyncBatchNorm). Every rank runs; the lowest failing rank's status is returned, as a run of the
// ranks one after the other would.
template <typename Fn>
core::Status RunParallel(int world, const Fn& run_rank) {
  const int threads = std::min<int>(world, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  if (threads <= 1) {
    for (int r = 0; r < world; ++r) DDPCHECK_RETURN_IF_ERROR(run_rank(r));
    return core::Status::Ok();
  }
  std::vector<core::Status> status(static_cast<size_t>(world));
  std::atomic<int> next{0};
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      for (int r = next++; r < world; r = next++) {
        try {
          status[static_cast<size_t>(r)] = run_rank(r);
        } catch (const std::exception& e) {
          status[static_cast<size_t>(r)] = core::Status::Internal("reference, rank " + std::to_string(r) + ": " + e.what());
        }
      }
    });
  }
  for (auto& t : pool) t.join();
  for (const auto& st : status) DDPCHECK_RETURN_IF_ERROR(st);
  return core::Status::Ok();
}

// DDP's bucket layout at a step, as core/ddp.cc builds it: the initial one until rank 0's first synced backward
// has given its gradient-ready order, the rebuilt one from then on (never with find_unused_parameters).
std::vector<std::vector<int>> BucketLayoutAt(const core::DdpSpec& ddp, const std::vector<std::pair<int64_t, core::DType>>& sizes,
                                             const std::vector<int>& ready_order) {
  if (ddp.find_unused_parameters || ready_order.size() != sizes.size()) return core::InitialBucketLayout(sizes, ddp);
  return core::RebuiltBucketLayout(ready_order, sizes, ddp);
}

// DDP's average of one parameter's local gradients, bitwise as the CPU world's all-reduce gives it: each rank's
// gradient scaled into its bucket slot (x fl(1/W), or / W where the grad is the bucket view; a rank that did not
// use the parameter gives zeros, as its slot does), then summed in Gloo's ring order over the bucket
// (core/gloo_ring.h): element i of the bucket is in chunk c = i / chunk and is summed along the ring that ends
// at rank c, from rank c - 1 down. `offset`: the parameter's first element in its bucket. On every core.
template <typename T>
void RingAverage(const std::vector<const T*>& local, int64_t numel, int64_t offset, int64_t chunk, bool divide,
                 T* out) {
  const int world = static_cast<int>(local.size());
  const T inv_world = static_cast<T>(1.0 / world);
  const T t_world = static_cast<T>(world);
  auto add = [&](int r, int64_t begin, int64_t end, bool first) {
    const T* g = local[static_cast<size_t>(r)];
    if (!g) {
      if (first) std::fill(out + begin, out + end, T(0));
      else for (int64_t e = begin; e < end; ++e) out[e] = T(0) + out[e];
    } else if (divide) {
      if (first) for (int64_t e = begin; e < end; ++e) out[e] = g[e] / t_world;
      else for (int64_t e = begin; e < end; ++e) out[e] = g[e] / t_world + out[e];
    } else {
      if (first) for (int64_t e = begin; e < end; ++e) out[e] = g[e] * inv_world;
      else for (int64_t e = begin; e < end; ++e) out[e] = g[e] * inv_world + out[e];
    }
  };
  core::ParallelForChunks(numel, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
    for (int64_t e = begin; e < end;) {
      const int64_t c = (offset + e) / chunk;
      const int64_t stop = std::min(end, (c + 1) * chunk - offset);
      for (int k = 1; k <= world; ++k) add(static_cast<int>(((c - k) % world + world) % world), e, stop, k == 1);
      e = stop;
    }
  });
}

template <typename T>
core::Status Run(const core::Scenario& s, const StepHooks<T>* hooks, core::Trace* trace) {
  const int world = s.world;
  Model<T> master;
  DDPCHECK_RETURN_IF_ERROR(BuildRankModel(s, 0, &master));
  std::vector<Model<T>> workers(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    // The user's model as each rank runs it (a layer `unused` on some rank is the model's control flow; the
    // oracle handles it as DDP with find_unused_parameters=True would).
    // (its values are the master's, copied at the start of every step)
    DDPCHECK_RETURN_IF_ERROR(BuildRankModel(s, r, &workers[static_cast<size_t>(r)], /*values=*/false));
    // A hook that analyses each backward (the step-local replay's error bounds) reads its per-layer gradients.
    if (hooks && hooks->after_backward) workers[static_cast<size_t>(r)].SetKeepLayerInputGrads(true);
  }
  RecordParams(master, 0, Checkpoint::kInit, trace);
  RecordBuffers(master, 0, Checkpoint::kInit, core::kAllRanks, trace);

  std::vector<std::vector<core::StepPlan>> plans(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    DDPCHECK_RETURN_IF_ERROR(core::PlanRank(s, r, core::UserPlanOptions(s, r), &plans[static_cast<size_t>(r)]));
    if (plans[static_cast<size_t>(r)].size() != plans[0].size()) {
      return core::Status::Invalid(fmt::format(
          "reference: rank {} has {} optimizer steps and rank 0 has {}: a DDP run with uneven step counts hangs "
          "(BUGS.md uneven-batches), so it has no reference", r, plans[static_cast<size_t>(r)].size(), plans[0].size()));
    }
  }
  // SyncBatchNorm layers make the ranks' forwards and backwards depend on each other: the ranks then run in
  // lockstep, one thread each, meeting in the exchange; otherwise one after the other.
  const bool lockstep =
      world > 1 && std::any_of(s.model.begin(), s.model.end(), [](const core::LayerSpec& l) { return l.type == "syncbatchnorm1d"; });
  std::unique_ptr<SyncBnExchange<T>> exchange;
  if (lockstep) {
    exchange = std::make_unique<SyncBnExchange<T>>(world);
    for (int r = 0; r < world; ++r) workers[static_cast<size_t>(r)].SetSyncBnGroup(exchange->member(r));
  }
  const int np = master.num_params();
  std::vector<core::ParamState<T>> state(static_cast<size_t>(np));
  std::vector<bool> aliased(static_cast<size_t>(np), false);
  core::LrSchedule schedule(s.optimizer.lr, s.schedulers);
  core::GradScaler scaler;
  const bool scaled = core::UsesGradScaler(s.amp);
  if (scaled) DDPCHECK_RETURN_IF_ERROR(core::MakeGradScaler(s.amp, 1.0, &scaler));
  const core::AmpGradOps amp_ops{[&](float inv) { return UnscaleGrads(&master, inv); },
                                 [&] { return GradNorm(master); }, [&](double f) { ScaleGrads(&master, f); }};
  // The single-process global-batch mean (each rank weighted by its sample count), which DDP's mean of
  // per-rank means equals only when every rank's batch has the same size.
  const bool global_mean = s.global_batch_mean;
  // Rank 0's gradient-ready order in its first synced backward: DDP's buckets are rebuilt from it.
  std::vector<int> ready_order;
  std::vector<std::pair<int64_t, core::DType>> sizes;
  for (int p = 0; p < np; ++p) sizes.emplace_back(master.param_info(p).numel(), master.param_info(p).dtype);

  for (size_t step_i = 0; step_i < plans[0].size(); ++step_i) {
    const int64_t step = plans[0][step_i].step;
    if (hooks && hooks->load_state) DDPCHECK_RETURN_IF_ERROR(hooks->load_state(step, &master, &state));
    if (scaled && hooks && hooks->load_scaler) DDPCHECK_RETURN_IF_ERROR(hooks->load_scaler(step, &scaler));
    master.ZeroGrad(false);
    std::vector<bool> used_any(static_cast<size_t>(np), false);

    double total_rows = 0;
    for (int r = 0; r < world; ++r) {
      for (const auto& mb : plans[static_cast<size_t>(r)][step_i].micro_batches) total_rows += static_cast<double>(mb.size());
    }
    std::vector<std::vector<double>> rows(static_cast<size_t>(world));
    core::ParallelFor(world, [&](int64_t r) { SyncFrom(master, &workers[static_cast<size_t>(r)]); });
    for (int r = 0; r < world; ++r) {
      Model<T>& w = workers[static_cast<size_t>(r)];
      const core::StepPlan& plan = plans[static_cast<size_t>(r)][step_i];
      w.ZeroGrad(false);  // as the world does (core/train_loop.cc): a later step adds into zeros, +0 for a -0
      w.SetTraining(true);
      auto& rr = rows[static_cast<size_t>(r)];
      for (const auto& mb : plan.micro_batches) rr.insert(rr.end(), mb.begin(), mb.end());
      trace->Add({step, Checkpoint::kSampler, "indices", r}, Tensor(core::DType::kInt64, {static_cast<int64_t>(rr.size())}, rr));
      RecordBuffers(w, step, Checkpoint::kForwardBuffers, r, trace);
    }
    // Each rank's micro-batches: forward, loss, backward (which parameters it reached).
    const T loss_scale = scaled ? static_cast<T>(scaler.scale()) : T(1);
    std::vector<std::vector<bool>> used(static_cast<size_t>(world), std::vector<bool>(static_cast<size_t>(np), false));
    const std::vector<std::vector<int>> layout = BucketLayoutAt(s.ddp, sizes, ready_order);
    const bool record_order = ready_order.empty();
    auto run_rank = [&](int r) -> core::Status {
      Model<T>& w = workers[static_cast<size_t>(r)];
      const core::StepPlan& plan = plans[static_cast<size_t>(r)][step_i];
      const size_t k = plan.micro_batches.size();
      for (size_t m = 0; m < k; ++m) {
        const core::Batch b = core::MakeBatch(s.data.x, s.data.y, plan.micro_batches[m]);
        w.SetMicroStep(static_cast<int64_t>(m));
        Matrix<T> x(b.x.shape[0], b.x.shape[1]);
        for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = static_cast<T>(b.x.data[static_cast<size_t>(i)]);
        DDPCHECK_RETURN_IF_ERROR(w.CheckInputs(x, b.y).Prefixed("reference, rank " + std::to_string(r)));
        T loss = 0;
        DDPCHECK_RETURN_IF_ERROR(w.Forward(x, b.y, &loss));
        trace->Add({step, Checkpoint::kLoss, k == 1 ? "loss" : "loss." + std::to_string(m), r},
                   Tensor::Scalar(static_cast<double>(loss), s.precision));
        auto& u = used[static_cast<size_t>(r)];
        const bool order = record_order && r == 0 && m + 1 == k;  // the synced backward
        DDPCHECK_RETURN_IF_ERROR(w.Backward(loss_scale, [&](int p) {
          u[static_cast<size_t>(p)] = true;
          if (order) ready_order.push_back(p);
        }));
        if (hooks && hooks->after_backward) hooks->after_backward(step, r, static_cast<int64_t>(m), w, x, b.y);
      }
      return core::Status::Ok();
    };
    if (lockstep) {
      DDPCHECK_RETURN_IF_ERROR(RunLockstep(world, run_rank, exchange.get()));
    } else {
      DDPCHECK_RETURN_IF_ERROR(RunParallel(world, run_rank));
    }
    // The local gradients recorded (RecordAll), then DDP's average as the CPU world's buckets give it (RingAverage;
    // a global-batch mean in rank order from 0), on every core over chunks of elements.
    std::vector<std::pair<int, int>> contributions;  // (rank, param) in rank order
    std::vector<std::pair<const T*, const core::ParamInfo*>> local;
    for (int r = 0; r < world; ++r) {
      const Model<T>& w = workers[static_cast<size_t>(r)];
      const auto& u = used[static_cast<size_t>(r)];
      for (int p = 0; p < np; ++p) {
        if (!u[static_cast<size_t>(p)]) continue;  // locally unused: contributes zeros
        used_any[static_cast<size_t>(p)] = true;
        contributions.emplace_back(r, p);
        local.emplace_back(w.grad_data(p), &w.param_info(p));
      }
    }
    {
      std::vector<core::TraceKey> keys;
      for (const auto& [r, p] : contributions) keys.push_back({step, Checkpoint::kLocalGrad, master.param_info(p).name, r});
      RecordAll(trace, keys, local);
    }
    for (int r = 0; r < world; ++r) RecordBuffers(workers[static_cast<size_t>(r)], step, Checkpoint::kBuffers, r, trace);
    // Each parameter's place in its bucket (offset, bucket length) and the ranks' gradients of it.
    std::vector<std::pair<int64_t, int64_t>> place(static_cast<size_t>(np), {0, 0});
    for (const auto& bucket : layout) {
      int64_t length = 0;
      for (int p : bucket) length += master.param_info(p).numel();
      int64_t offset = 0;
      for (int p : bucket) {
        place[static_cast<size_t>(p)] = {offset, length};
        offset += master.param_info(p).numel();
      }
    }
    std::vector<std::vector<const T*>> by_param(static_cast<size_t>(np), std::vector<const T*>(static_cast<size_t>(world), nullptr));
    for (size_t i = 0; i < contributions.size(); ++i) {
      by_param[static_cast<size_t>(contributions[i].second)][static_cast<size_t>(contributions[i].first)] = local[i].first;
    }
    std::vector<std::pair<const T*, const core::ParamInfo*>> averaged;
    for (int p = 0; p < np; ++p) {
      const auto pi = static_cast<size_t>(p);
      if (!used_any[pi]) continue;  // globally unused: the grad is left untouched
      T* sum = master.grad_data(p);
      const int64_t numel = master.param_info(p).numel();
      if (global_mean) {
        core::ParallelForChunks(numel, int64_t{1} << 16, [&](int64_t begin, int64_t end) {
          std::fill(sum + begin, sum + end, T(0));
          for (int r = 0; r < world; ++r) {
            const T* g = by_param[pi][static_cast<size_t>(r)];
            if (!g) continue;
            const auto share = static_cast<T>(static_cast<double>(rows[static_cast<size_t>(r)].size()) / total_rows);
            for (int64_t e = begin; e < end; ++e) sum[e] += g[e] * share;
          }
        });
      } else {
        const auto [offset, length] = place[pi];
        const int64_t chunk = core::GlooRingChunkElements(length, static_cast<int64_t>(sizeof(T)), world);
        RingAverage<T>(by_param[pi], numel, offset, chunk, aliased[pi], sum);
      }
      master.set_grad_defined(p, true);
      if (s.ddp.gradient_as_bucket_view) aliased[pi] = true;
      averaged.emplace_back(sum, &master.param_info(p));
    }
    // Rank 0's buffers survive into the next step's broadcast.
    for (int i = 0; i < master.num_buffers(); ++i) {
      std::copy_n(workers[0].buffer_data(i), master.buffer_info(i).numel(), master.buffer_data(i));
    }
    {
      std::vector<core::TraceKey> keys;
      for (const auto& a : averaged) keys.push_back({step, Checkpoint::kReduced, a.second->name, core::kAllRanks});
      RecordAll(trace, keys, averaged);
    }
    bool found_inf = false;
    if (scaled) {
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
    if (hooks && hooks->before_optimizer && !found_inf) hooks->before_optimizer(step, master, state, lr);
    for (int p = 0; p < np && !found_inf; ++p) {
      if (!master.grad_defined(p)) continue;
      core::OptimizerStep<T>(s.optimizer, lr, master.param_data(p), master.grad_data(p), master.param_info(p).numel(),
                             &state[static_cast<size_t>(p)]);
    }
    if (scaled) {
      DDPCHECK_RETURN_IF_ERROR(scaler.UpdateAfterStep());
      for (auto& [name, t] : core::ScalerRecord(scaler, found_inf, found_inf)) {
        trace->Add({step, Checkpoint::kScaler, name, core::kAllRanks}, t);
      }
    }
    RecordParams(master, step, Checkpoint::kParams, trace);
    if (hooks && hooks->after_step) hooks->after_step(step, master, state);
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
  if (s.precision == core::DType::kFloat32) return Run<float>(s, nullptr, out);
  return Run<double>(s, nullptr, out);
}

core::Status RunReferenceWithHooks(const core::Scenario& s, const StepHooks<double>& hooks, core::Trace* out) {
  if (s.precision != core::DType::kFloat64) return core::Status::Invalid("RunReferenceWithHooks: precision must be fp64");
  out->meta["backend"] = "reference";
  out->meta["world"] = s.world;
  out->meta["precision"] = core::DTypeName(s.precision);
  out->meta["scenario"] = s.name;
  return Run<double>(s, &hooks, out);
}

}  // namespace ddpcheck::ref
