#include "core/train_loop.h"

#include "core/check.h"
#include "core/data.h"
#include "core/ddp.h"
#include "core/faults.h"
#include "core/lr_scheduler.h"
#include "core/plan.h"
#include "core/recorder.h"

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

Status RunSteps(const Scenario& s, int rank, Replica* replica, Communicator* comm, StepRecorder* rec) {
  const RankFaults faults = FaultsForRank(s, rank);
  DistributedDataParallel ddp(replica, comm, s.ddp);
  rec->set_step(0);
  DDPCHECK_RETURN_IF_ERROR(ddp.Init(rec, faults.DdpAt(0)).Prefixed("DDP construction"));

  std::vector<StepPlan> plan;
  DDPCHECK_RETURN_IF_ERROR(PlanRank(s, rank, faults.plan, &plan));
  LrSchedule schedule(s.optimizer.lr, s.schedulers);
  for (const StepPlan& p : plan) {
    rec->set_step(p.step);
    const DdpFaults ddp_faults = faults.DdpAt(p.step);
    ddp.ZeroGrad(/*set_to_none=*/false);
    rec->Record(Checkpoint::kSampler, "indices", IndicesTensor(p.micro_batches));
    const size_t k = p.micro_batches.size();
    for (size_t m = 0; m < k; ++m) {
      const Batch batch = MakeBatch(s.data.x, s.data.y, p.micro_batches[m]);
      double loss = 0.0;
      DDPCHECK_RETURN_IF_ERROR(ddp.Forward(batch, /*no_sync=*/m + 1 < k, rec, ddp_faults, &loss));
      rec->Record(Checkpoint::kLoss, k == 1 ? "loss" : "loss." + std::to_string(m), Tensor::Scalar(loss, s.precision));
      DDPCHECK_RETURN_IF_ERROR(ddp.Backward(faults.LossFactorAt(p.step)));
    }
    rec->RecordGrads(Checkpoint::kReduced);
    const double lr = schedule.lr();
    rec->Record(Checkpoint::kLr, "lr", Tensor::Scalar(lr));
    if (!faults.SkipStepAt(p.step)) DDPCHECK_RETURN_IF_ERROR(replica->OptimizerStep(lr));
    rec->RecordParams(Checkpoint::kParams);
    rec->RecordBuffers(Checkpoint::kBuffers);
    if (p.last_in_epoch) schedule.Step();
  }
  return Status::Ok();
}

}  // namespace

Status RunRank(const Scenario& s, int rank, Replica* replica, Communicator* comm, const RankRunOptions& opts) {
  SetThreadRank(rank, s.world);
  StepRecorder rec(opts.trace, replica, rank);
  Status st = RunSteps(s, rank, replica, comm, &rec);
  if (!st.ok()) {
    const char* kind = st.code() == Code::kTimeout ? "timeout" : st.code() == Code::kMismatch ? "ddp_error" : "error";
    rec.Event(kind, st.message());
  }
  SetThreadRank(-1, -1);
  return st;
}

}  // namespace ddpcheck::core
