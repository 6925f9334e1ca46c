// ValidateScenario and the training-loop checks (CheckTraining).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/fault_spec.h"
#include "core/faults.h"
#include "core/json_reader.h"
#include "core/sampler.h"
#include "core/scenario_checks.h"

namespace ddpcheck::core {

Status ValueError(const std::string& path, const std::string& expected, double value) {
  return Status::Invalid(path + ": " + expected + ", got " + fmt::format("{}", value));
}

Status ValueError(const std::string& path, const std::string& expected, int64_t value) {
  return Status::Invalid(path + ": " + expected + ", got " + std::to_string(value));
}

namespace {

Status CheckOptimizer(const OptimizerSpec& o) {
  // torch.optim's constructor checks, with torch's wording after ours.
  if (!(o.lr >= 0)) return ValueError("/optimizer/lr", "must be >= 0 (torch: Invalid learning rate)", o.lr);
  if (!(o.weight_decay >= 0)) {
    return ValueError("/optimizer/weight_decay", "must be >= 0 (torch: Invalid weight_decay value)", o.weight_decay);
  }
  if (o.type == "sgd") {
    if (!(o.momentum >= 0)) return ValueError("/optimizer/momentum", "must be >= 0 (torch: Invalid momentum value)", o.momentum);
    if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
      return Status::Invalid("/optimizer/nesterov: Nesterov momentum requires a momentum and zero dampening, got "
                             "momentum " + fmt::format("{}", o.momentum) + ", dampening " +
                             fmt::format("{}", o.dampening));
    }
  } else {
    if (!(o.eps >= 0)) return ValueError("/optimizer/eps", "must be >= 0 (torch: Invalid epsilon value)", o.eps);
    if (!(o.beta1 >= 0 && o.beta1 < 1)) {
      return ValueError("/optimizer/betas/0", "must be in [0, 1) (torch: Invalid beta parameter at index 0)", o.beta1);
    }
    if (!(o.beta2 >= 0 && o.beta2 < 1)) {
      return ValueError("/optimizer/betas/1", "must be in [0, 1) (torch: Invalid beta parameter at index 1)", o.beta2);
    }
  }
  return Status::Ok();
}

Status CheckScheduler(const SchedulerSpec& s, const std::string& path) {
  if (s.type != "step" && s.type != "multistep" && s.type != "exponential" && s.type != "cosine" &&
      s.type != "linear") {
    return Status::Invalid(JsonPath(path, "type") + ": must be step, multistep, exponential, cosine or linear, got '" +
                           s.type + "'");
  }
  if (s.type == "step" && (s.step_size < 1 || s.step_size > kMaxSteps)) {
    return ValueError(JsonPath(path, "step_size"), fmt::format("must be in [1, {}]", kMaxSteps), s.step_size);
  }
  if (s.type == "multistep") {
    for (size_t i = 0; i < s.milestones.size(); ++i) {
      if (s.milestones[i] < 0 || s.milestones[i] > kMaxSteps) {
        return ValueError(JsonPath(JsonPath(path, "milestones"), i), fmt::format("must be an epoch in [0, {}]", kMaxSteps),
                          s.milestones[i]);
      }
    }
  }
  if ((s.type == "step" || s.type == "multistep" || s.type == "exponential") && !(s.gamma >= 0)) {
    return ValueError(JsonPath(path, "gamma"), "must be >= 0", s.gamma);
  }
  if (s.type == "cosine") {
    if (s.t_max < 1 || s.t_max > kMaxSteps) {
      return ValueError(JsonPath(path, "t_max"), fmt::format("must be in [1, {}]", kMaxSteps), s.t_max);
    }
    if (!(s.eta_min >= 0)) return ValueError(JsonPath(path, "eta_min"), "must be >= 0", s.eta_min);
  }
  if (s.type == "linear") {
    // torch.optim.lr_scheduler.LinearLR's own checks.
    if (!(s.start_factor > 0 && s.start_factor <= 1)) {
      return ValueError(JsonPath(path, "start_factor"), "must be in (0, 1]", s.start_factor);
    }
    if (!(s.end_factor >= 0 && s.end_factor <= 1)) {
      return ValueError(JsonPath(path, "end_factor"), "must be in [0, 1]", s.end_factor);
    }
    if (s.total_iters < 1 || s.total_iters > kMaxSteps) {
      return ValueError(JsonPath(path, "total_iters"), fmt::format("must be in [1, {}]", kMaxSteps), s.total_iters);
    }
  }
  return Status::Ok();
}

Status CheckAmp(const Scenario& s) {
  const AmpSpec& a = s.amp;
  if (a.dtype != "fp16" && a.dtype != "bf16") {
    return Status::Invalid("/amp/dtype: must be fp16 or bf16, got '" + a.dtype + "'");
  }
  if (!(a.init_scale > 0)) return ValueError("/amp/init_scale", "must be > 0", a.init_scale);
  if (!(a.growth_factor > 1)) return ValueError("/amp/growth_factor", "must be > 1", a.growth_factor);
  if (!(a.backoff_factor > 0 && a.backoff_factor < 1)) {
    return ValueError("/amp/backoff_factor", "must be in (0, 1)", a.backoff_factor);
  }
  if (a.growth_interval < 1 || a.growth_interval > kMaxSteps) {
    return ValueError("/amp/growth_interval", fmt::format("must be in [1, {}]", kMaxSteps), a.growth_interval);
  }
  if (!(a.clip_grad_norm >= 0)) return ValueError("/amp/clip_grad_norm", "must be >= 0 (0: no clipping)", a.clip_grad_norm);
  if (!a.grad_scaler && a.clip_grad_norm > 0) {
    return Status::Invalid("/amp/clip_grad_norm: clipping is modelled with the GradScaler's unscale_; set "
                           "\"grad_scaler\": true or \"clip_grad_norm\": 0");
  }
  if (a.enabled && s.precision != DType::kFloat32) {
    return Status::Invalid("/amp/enabled: AMP keeps fp32 master weights and needs \"precision\": \"fp32\", got " +
                           DTypeName(s.precision));
  }
  return Status::Ok();
}

Status CheckFaults(const Scenario& s) {
  for (size_t i = 0; i < s.faults.size(); ++i) {
    const FaultSpec& f = s.faults[i];
    std::string path = JsonPath("/faults", i);
    if (!IsKnownFaultName(f.name)) {
      return Status::Invalid(path + ": unknown fault '" + f.name + "'; expected a fault name of BUGS.md");
    }
    if (f.rank >= s.world) {
      return ValueError(path + "/rank", "must be < world (" + std::to_string(s.world) + ")", int64_t{f.rank});
    }
    if (f.rank < -1) return ValueError(path + "/rank", "must be >= 0", int64_t{f.rank});
    if (f.step < -1 || f.step > kMaxSteps) {
      return ValueError(path + "/step", fmt::format("must be in [0, {}] (or -1: from the start)", kMaxSteps), f.step);
    }
  }
  return Status::Ok();
}

// DistributedSampler's settings for the scenario's data (its shard sizes; the order is the plan's business).
SamplerConfig ShardSizes(const Scenario& s) {
  SamplerConfig cfg;
  cfg.n = s.data.x.shape.empty() ? s.data.samples : s.data.x.shape[0];
  cfg.world = s.world;
  cfg.drop_last = s.sampler.drop_last;
  return cfg;
}

// An uneven split trims ranks 1..W-1 by one sample per epoch: every rank must still run as many optimizer
// steps, or rank 0 would wait for the others in a collective (that is BUGS.md's uneven-batches, not a setup).
Status CheckUnevenSplit(const Scenario& s) {
  if (!UnevenSplit(s) || s.world < 2) return Status::Ok();
  const SamplerConfig cfg = ShardSizes(s);
  if (cfg.n < 1) return Status::Ok();  // reported by the data checks
  const std::string path = s.sampler.uneven_split ? "/sampler/uneven_split" : "/faults";
  const int64_t shard = NumSamples(cfg);
  if (shard < 2) {
    return Status::Invalid(fmt::format("{}: an uneven split takes one sample from ranks 1..{}, whose shards hold "
                                       "only {}; use more samples", path, s.world - 1, shard));
  }
  const int64_t k = std::max<int64_t>(1, s.ddp.no_sync_steps);
  auto steps = [&](int64_t rows) { return (rows + s.batch_size - 1) / s.batch_size / k; };
  if (steps(shard) != steps(shard - 1)) {
    return Status::Invalid(fmt::format(
        "{}: an uneven split leaves rank 0 {} samples ({} optimizer steps per epoch) and the other ranks {} ({} "
        "steps) with batch_size {} and no_sync_steps {}: rank 0 would wait forever in a collective (BUGS.md "
        "uneven-batches); change samples or batch_size so that both make as many steps",
        path, shard, steps(shard), shard - 1, steps(shard - 1), s.batch_size, k));
  }
  return Status::Ok();
}

}  // namespace

Status CheckTraining(const Scenario& s) {
  if (s.world < 1 || s.world > kMaxWorld) return ValueError("/world", fmt::format("must be in [1, {}]", kMaxWorld), int64_t{s.world});
  if (s.batch_size < 1 || s.batch_size > kMaxSamples) {
    return ValueError("/batch_size", fmt::format("must be in [1, {}]", kMaxSamples), s.batch_size);
  }
  // A BatchNorm in training takes statistics over the batch's rows: torch raises "Expected more than 1 value per
  // channel when training" at the first step (said here with the pointer, not by the run: QA round 15). A
  // SyncBatchNorm over several ranks takes them over every rank's rows.
  for (size_t i = 0; i < s.model.size() && s.batch_size == 1; ++i) {
    const LayerSpec& l = s.model[i];
    const bool local_stats = l.type == "batchnorm1d" || (l.type == "syncbatchnorm1d" && s.world == 1);
    if (local_stats && l.unused_on_ranks.empty() && l.only_micro_step < 0) {
      return ValueError("/batch_size",
                        fmt::format("must be at least 2 with the {} at {} (in training torch raises 'Expected more "
                                    "than 1 value per channel')", l.type, JsonPath("/model", i)),
                        s.batch_size);
    }
  }
  if (s.epochs < 1 || s.epochs > kMaxEpochs) return ValueError("/epochs", fmt::format("must be in [1, {}]", kMaxEpochs), s.epochs);
  if (s.steps < -1 || s.steps == 0 || s.steps > kMaxSteps) {  // (0 steps would train nothing and pass)
    return ValueError("/steps", fmt::format("must be in [1, {}] (or -1: every step of every epoch)", kMaxSteps), s.steps);
  }
  if (s.loss != "mse" && s.loss != "cross_entropy") {
    return Status::Invalid("/loss: must be mse or cross_entropy, got '" + s.loss + "'");
  }
  if (s.precision != DType::kFloat64 && s.precision != DType::kFloat32) {
    return Status::Invalid("/precision: must be fp64 or fp32, got " + DTypeName(s.precision));
  }
  const DdpSpec& d = s.ddp;
  if (!(d.bucket_cap_mb > 0 && d.bucket_cap_mb <= kMaxBucketCapMb)) {
    return ValueError("/ddp/bucket_cap_mb", fmt::format("must be in (0, {}]", kMaxBucketCapMb), d.bucket_cap_mb);
  }
  if (d.first_bucket_bytes < 1) return ValueError("/ddp/first_bucket_bytes", "must be >= 1", d.first_bucket_bytes);
  if (d.timeout_ms < 1 || d.timeout_ms > kMaxTimeoutMs) {
    return ValueError("/ddp/timeout_ms", fmt::format("must be in [1, {}] (a week)", kMaxTimeoutMs), d.timeout_ms);
  }
  if (d.no_sync_steps < 1 || d.no_sync_steps > kMaxSteps) {
    return ValueError("/ddp/no_sync_steps", fmt::format("must be in [1, {}] (1: no accumulation)", kMaxSteps),
                      d.no_sync_steps);
  }
  if (s.optimizer.type != "sgd" && s.optimizer.type != "adam" && s.optimizer.type != "adamw") {
    return Status::Invalid("/optimizer/type: must be sgd, adam or adamw, got '" + s.optimizer.type + "'");
  }
  DDPCHECK_RETURN_IF_ERROR(CheckOptimizer(s.optimizer));
  for (size_t i = 0; i < s.schedulers.size(); ++i) {
    DDPCHECK_RETURN_IF_ERROR(CheckScheduler(s.schedulers[i], JsonPath("/schedulers", i)));
  }
  DDPCHECK_RETURN_IF_ERROR(CheckAmp(s));
  DDPCHECK_RETURN_IF_ERROR(CheckFaults(s));
  return CheckUnevenSplit(s);
}

Status ValidateScenario(const Scenario& s) {
  Status st = CheckTraining(s);
  if (st.ok()) st = CheckModelAndData(s);
  if (st.ok()) st = CheckInit(s);
  return st.Prefixed(s.source.empty() ? "<scenario>" : s.source);
}

// The data must give every rank at least one optimizer step an epoch (3 samples with drop_last over 4 ranks, or
// fewer batches than no_sync_steps, give none: the run would train nothing and pass), and a fault must fall within
// the run's optimizer steps (rank 0's, core::PlanRank's count), or it is never injected.
Status CheckTrainsSomeStep(const Scenario& s) {
  const SamplerConfig cfg = ShardSizes(s);
  if (cfg.n < 1 || s.world < 1 || s.batch_size < 1) return Status::Ok();  // reported by the other checks
  const int64_t shard = NumSamples(cfg);
  const int64_t batches = BatchesPerEpoch(shard, s.batch_size, s.sampler.drop_last_batch);
  const int64_t per_epoch = batches / std::max<int64_t>(1, s.ddp.no_sync_steps);
  if (per_epoch < 1) {
    const std::string got = batches < 1 ? fmt::format("no batch of {}", s.batch_size)
                                        : fmt::format("{} batch(es) of {}, fewer than /ddp/no_sync_steps ({})",
                                                      batches, s.batch_size, s.ddp.no_sync_steps);
    return Status::Invalid(fmt::format(
        "/data/samples: {} samples over {} ranks give each rank {} (sampler drop_last {}) and {}{}: the run would "
        "train no step; use more samples or a smaller batch_size", cfg.n, s.world, shard,
        s.sampler.drop_last ? "true" : "false", got, s.sampler.drop_last_batch ? " (drop_last_batch)" : ""));
  }
  const int64_t steps = s.steps >= 0 ? std::min(per_epoch * s.epochs, s.steps) : per_epoch * s.epochs;
  for (size_t i = 0; i < s.faults.size(); ++i) {
    if (s.faults[i].step >= steps) {
      return ValueError(JsonPath(JsonPath("/faults", i), "step"),
                        fmt::format("must be below the run's {} optimizer step(s) (the fault would never be injected)",
                                    steps), s.faults[i].step);
    }
  }
  return Status::Ok();
}

}  // namespace ddpcheck::core
