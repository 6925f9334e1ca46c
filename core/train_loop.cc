#include "core/train_loop.h"

#include "core/amp.h"
#include "core/check.h"
#include "core/data.h"
#include "core/ddp.h"
#include "core/faults.h"
#include "core/lr_scheduler.h"
#include "core/plan.h"
#include "core/recorder.h"
#include "core/sync_bn_comm.h"

namespace ddpcheck::core {

Status MaterializeData(Scenario* s) {
  if (!s->data.x.data.empty() && !s->data.y.data.empty()) return Status::Ok();
  Tensor x, y;
  DDPCHECK_RETURN_IF_ERROR(MakeDataset(*s, &x, &y));
  s->data.x = std::move(x);
  s->data.y = std::move(y);
  return Status::Ok();
}

namespace {

Tensor IndicesTensor(const std::vector<std::vector<int64_t>>& micro_batches) {
  std::vector<double> v;
  for (const auto& mb : micro_batches) v.insert(v.end(), mb.begin(), mb.end());
  const auto n = static_cast<int64_t>(v.size());
  return Tensor(DType::kInt64, {n}, std::move(v));
}

// Records what the model's SyncBatchNorm layers all-gathered in the last forward ("<layer>.gathered_stats",
// (W, 2C + 1) [mean, invstd, count] per rank): evidence for the diagnosis, which the reference does not have.
void RecordGathered(CommSyncBnGroup* group, const std::string& suffix, const StepRecorder* rec) {
  for (auto& [layer, t] : group->TakeGathered()) {
    rec->Record(Checkpoint::kLoss, std::to_string(layer) + ".gathered_stats" + suffix, std::move(t));
  }
}

Status RunSteps(const Scenario& s, int rank, Replica* replica, Communicator* comm, StepRecorder* rec,
                const RankRunOptions& opts) {
  const RankFaults faults = FaultsForRank(s, rank);
  // SyncBatchNorm's collectives go through this rank's Communicator, between DDP's own.
  CommSyncBnGroup sync_bn(comm, faults.Has("syncbn-unequal-counts") ? SyncBnWeighting::kPlainAverage
                                                                     : SyncBnWeighting::kByCount);
  DDPCHECK_RETURN_IF_ERROR(replica->SetSyncBnGroup(&sync_bn));
  struct Detach {
    Replica* r;
    ~Detach() { (void)r->SetSyncBnGroup(nullptr); }
  } detach{replica};
  DistributedDataParallel ddp(replica, comm, s.ddp);
  ddp.set_share_grad_storage(opts.share_grad_storage);
  rec->set_step(0);
  DDPCHECK_RETURN_IF_ERROR(ddp.Init(rec, faults.DdpAt(0)).Prefixed("DDP construction"));

  std::vector<StepPlan> plan;
  DDPCHECK_RETURN_IF_ERROR(PlanRank(s, rank, faults.plan, &plan));
  LrSchedule schedule(s.optimizer.lr, s.schedulers);
  GradScaler scaler;
  const bool scaled = UsesGradScaler(s.amp);
  if (scaled) DDPCHECK_RETURN_IF_ERROR(MakeGradScaler(s.amp, faults.ScalerInitFactor(), &scaler));
  const AmpGradOps amp_ops{[&](float inv) { return replica->UnscaleGrads(inv); }, [&] { return replica->GradNorm(); },
                           [&](double f) { replica->ScaleGrads(f); }};
  Batch batch;  // refilled every micro-step (FillBatch)
  for (const StepPlan& p : plan) {
    rec->set_step(p.step);
    const DdpFaults ddp_faults = faults.DdpAt(p.step);
    ddp.ZeroGrad(/*set_to_none=*/false);
    rec->Record(Checkpoint::kSampler, "indices", IndicesTensor(p.micro_batches));
    const size_t k = p.micro_batches.size();
    for (size_t m = 0; m < k; ++m) {
      FillBatch(s.data.x, s.data.y, p.micro_batches[m], &batch);
      batch.micro_step = static_cast<int64_t>(m);
      sync_bn.SetContext(p.step, static_cast<int64_t>(m), static_cast<int64_t>(k));
      double loss = 0.0;
      DDPCHECK_RETURN_IF_ERROR(ddp.Forward(batch, /*no_sync=*/m + 1 < k, rec, ddp_faults, &loss));
      const std::string suffix = k == 1 ? "" : "." + std::to_string(m);
      rec->Record(Checkpoint::kLoss, "loss" + suffix, Tensor::Scalar(loss, s.precision));
      RecordGathered(&sync_bn, suffix, rec);
      // scaler.scale(loss).backward(): the loss's gradient starts at the scale (times the loss fault's factor).
      const double loss_scale = scaled ? static_cast<double>(scaler.scale()) : 1.0;
      DDPCHECK_RETURN_IF_ERROR(ddp.Backward(loss_scale * faults.LossFactorAt(p.step)));
    }
    rec->RecordGrads(Checkpoint::kReduced);
    bool found_inf = false;
    if (scaled) {
      // After DDP's all-reduce every rank holds the same grads, so found_inf and the scale agree everywhere.
      const AmpStepOptions o{s.amp.clip_grad_norm, faults.ClipBeforeUnscaleAt(p.step), s.precision};
      DDPCHECK_RETURN_IF_ERROR(AmpUnscaleAndClip(o, amp_ops, &scaler, &found_inf));
      rec->RecordGrads(Checkpoint::kUnscaled);
    }
    const double lr = schedule.lr() * faults.LrFactorAt(p.step);
    rec->Record(Checkpoint::kLr, "lr", Tensor::Scalar(lr));
    if (!found_inf && !faults.SkipStepAt(p.step)) DDPCHECK_RETURN_IF_ERROR(replica->OptimizerStep(lr));
    if (scaled) {
      DDPCHECK_RETURN_IF_ERROR(scaler.UpdateAfterStep());
      for (auto& [name, t] : ScalerRecord(scaler, found_inf, found_inf)) rec->Record(Checkpoint::kScaler, name, t);
    }
    rec->RecordParams(Checkpoint::kParams);
    rec->RecordBuffers(Checkpoint::kBuffers);
    if (p.last_in_epoch) {
      // What an evaluation over DistributedSampler(shuffle=False) counts on this rank.
      const std::vector<int64_t> eval = EvalIndices(s, rank, faults.CountEvalPadding());
      rec->Record(Checkpoint::kSampler, "eval_indices",
                  Tensor(DType::kInt64, {static_cast<int64_t>(eval.size())}, std::vector<double>(eval.begin(), eval.end())));
      schedule.Step();
    }
    if (opts.on_step) opts.on_step(p.step + 1, static_cast<int64_t>(plan.size()));
  }
  return Status::Ok();
}

}  // namespace

Status RunRank(const Scenario& s, int rank, Replica* replica, Communicator* comm, const RankRunOptions& opts) {
  SetThreadRank(rank, s.world);
  StepRecorder rec(opts.trace, replica, rank);
  rec.set_bucket_contents(opts.bucket_contents);
  Status st = RunSteps(s, rank, replica, comm, &rec, opts);
  if (!st.ok()) {
    const char* kind = st.code() == Code::kTimeout ? "timeout" : st.code() == Code::kMismatch ? "ddp_error" : "error";
    rec.Event(kind, st.message());
  }
  SetThreadRank(-1, -1);
  return st;
}

}  // namespace ddpcheck::core
