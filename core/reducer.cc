#include "core/reducer.h"

#include "core/check.h"

namespace ddpcheck::core {

Reducer::Reducer(Replica* replica, Communicator* comm, const DdpSpec& spec)
    : replica_(replica), comm_(comm), spec_(spec) {
  const size_t n = replica_->ParamInfos().size();
  ready_.assign(n, false);
  used_.assign(n, false);
  aliased_.assign(n, false);
  used_outside_sync_.assign(n, false);
  shared_.assign(n, false);
  pending_scale_.assign(n, ScaleMode::kCopy);
  bucket_of_.assign(n, -1);
  slot_of_.assign(n, -1);
}

Reducer::~Reducer() {
  // A bucket buffer an unfinished backward's all-reduce still writes is freed with the replica; wait for it.
  if (comm_) (void)comm_->WaitPending();
}

void Reducer::SetBuckets(const std::vector<std::vector<int>>& layout) {
  const auto& infos = replica_->ParamInfos();
  layout_ = layout;
  buckets_.clear();
  std::fill(bucket_of_.begin(), bucket_of_.end(), -1);
  for (size_t b = 0; b < layout.size(); ++b) {
    Bucket bucket;
    bucket.params = layout[b];
    DDPCHECK_CHECK(!bucket.params.empty(), "bucket ", b, " is empty");
    bucket.dtype = infos[static_cast<size_t>(bucket.params[0])].dtype;
    for (size_t s = 0; s < bucket.params.size(); ++s) {
      const int p = bucket.params[s];
      DDPCHECK_CHECK(p >= 0 && static_cast<size_t>(p) < infos.size(), "bucket ", b, " names parameter ", p);
      DDPCHECK_CHECK_EQ(bucket_of_[static_cast<size_t>(p)], -1, "parameter ", p, " is in two buckets");
      DDPCHECK_CHECK(infos[static_cast<size_t>(p)].dtype == bucket.dtype, "bucket ", b, " mixes dtypes");
      bucket_of_[static_cast<size_t>(p)] = static_cast<int>(b);
      slot_of_[static_cast<size_t>(p)] = static_cast<int>(s);
      bucket.offsets.push_back(bucket.numel);
      bucket.numel += infos[static_cast<size_t>(p)].numel();
    }
    bucket.buffer = replica_->Memory().Allocate(bucket.numel, bucket.dtype);
    buckets_.push_back(std::move(bucket));
  }
  for (size_t p = 0; p < infos.size(); ++p) {
    DDPCHECK_CHECK(bucket_of_[p] >= 0, "parameter ", p, " (", infos[p].name, ") is in no bucket");
  }
  // Each grad moves into its new slot (its values with it), or back into its own storage where it cannot.
  for (size_t p = 0; p < infos.size(); ++p) {
    const Bucket& b = buckets_[static_cast<size_t>(bucket_of_[p])];
    shared_[p] = share_grad_storage_ &&
                 replica_->ShareGradStorage(static_cast<int>(p), View(b, static_cast<size_t>(slot_of_[p])));
    if (!shared_[p]) replica_->ShareGradStorage(static_cast<int>(p), Span{});
  }
}

Span Reducer::View(const Bucket& b, size_t slot) const {
  const int p = b.params[slot];
  Span v;
  v.dtype = b.dtype;
  v.numel = replica_->ParamInfos()[static_cast<size_t>(p)].numel();
  v.data = static_cast<char*>(b.buffer.data) + b.offsets[slot] * ElementSize(b.dtype);
  return v;
}

void Reducer::Prepare(const StepRecorder* rec, const ReducerFaults& faults) {
  rec_ = rec;
  if (rec_) rec_->set_checkpoint(Checkpoint::kBucket);
  faults_ = faults;
  armed_ = true;
  status_ = Status::Ok();
  next_bucket_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  used_ = used_outside_sync_;
  if (faults.forget_nosync_usage) std::fill(used_.begin(), used_.end(), false);
  std::fill(used_outside_sync_.begin(), used_outside_sync_.end(), false);
  std::fill(pending_scale_.begin(), pending_scale_.end(), ScaleMode::kCopy);
  for (auto& b : buckets_) {
    b.pending = static_cast<int>(b.params.size());
    b.launched = false;
  }
}

void Reducer::WriteSlot(int param, bool defined) {
  const auto pi = static_cast<size_t>(param);
  const Bucket& b = buckets_[static_cast<size_t>(bucket_of_[pi])];
  Span view = View(b, static_cast<size_t>(slot_of_[pi]));
  const double world = comm_->world();
  if (!defined) {
    replica_->Memory().Fill(view, 0.0);  // a shared slot: the storage of a grad that stays undefined
  } else if (shared_[pi]) {
    // The slot is the grad: scaled in place as the bucket launches (x * fl(1/1) and x / 1 are x: none at W=1).
    // Asking for it writes the zeros of a grad zeroed lazily and not written since (ref::Param::ZeroLazily), which
    // the bucket reads straight from the slot (FinishBackward's unused parameters are read before this already).
    (void)replica_->Grad(param);
    if (world > 1) pending_scale_[pi] = aliased_[pi] ? ScaleMode::kDivide : ScaleMode::kMultiply;
  } else if (aliased_[pi]) {
    // gradient_as_bucket_view: the grad is the bucket view; torch does bucket_view.div_(div_factor).
    replica_->Memory().CopyScaled(replica_->Grad(param), view, world, ScaleMode::kDivide);
  } else {
    // torch: at::mul_out(bucket_view, grad, wrapped_scalar(1.0 / div_factor)) -> grad * fl(1/W).
    replica_->Memory().CopyScaled(replica_->Grad(param), view, 1.0 / world, ScaleMode::kMultiply);
  }
}

void Reducer::MarkReady(int param) {
  if (!armed_) return;
  const auto pi = static_cast<size_t>(param);
  DDPCHECK_CHECK(!ready_[pi], "parameter ", param, " marked ready twice in one backward");
  ready_[pi] = true;
  used_[pi] = true;
  if (record_ready_order_) ready_order_.push_back(param);
  if (rec_ && rec_->enabled()) {
    const auto& info = replica_->ParamInfos()[pi];
    rec_->RecordSpan(Checkpoint::kLocalGrad, info.name, replica_->Grad(param), info.shape);
  }
  WriteSlot(param, replica_->GradDefined(param));
  --buckets_[static_cast<size_t>(bucket_of_[pi])].pending;
  LaunchReadyBuckets();
}

void Reducer::MarkUsedOutsideSync(int param) { used_outside_sync_[static_cast<size_t>(param)] = true; }

void Reducer::LaunchReadyBuckets() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& b = buckets_[next_bucket_];
    const int index = static_cast<int>(next_bucket_);
    ++next_bucket_;
    if (!status_.ok()) continue;  // a failed collective: later buckets are not launched
    for (size_t slot = 0; slot < b.params.size(); ++slot) {
      const auto pi = static_cast<size_t>(b.params[slot]);
      if (pending_scale_[pi] == ScaleMode::kCopy) continue;
      const Span view = View(b, slot);
      const double world = comm_->world();
      const bool divide = pending_scale_[pi] == ScaleMode::kDivide;
      replica_->Memory().CopyScaled(view, view, divide ? world : 1.0 / world, pending_scale_[pi]);
      pending_scale_[pi] = ScaleMode::kCopy;
    }
    const std::string tag = "bucket" + std::to_string(index);
    if (rec_ && rec_->enabled()) {
      if (rec_->bucket_contents()) rec_->RecordSpan(Checkpoint::kBucket, tag, b.buffer, {b.numel});
      std::vector<double> ids(b.params.begin(), b.params.end());
      const auto count = static_cast<int64_t>(ids.size());  // before the move: argument order is unspecified
      rec_->Record(Checkpoint::kBucket, tag + ".params", Tensor(DType::kInt64, {count}, std::move(ids)));
    }
    b.launched = true;
    if (faults_.drop_bucket == index) continue;  // drop-bucket@R: this rank never issues the all-reduce
    const std::string what = "allreduce bucket " + std::to_string(index) + " (step " +
                             std::to_string(rec_ ? rec_->step() : 0) + ")";
    status_ = comm_->StartAllReduceSum(b.buffer, what);  // may run while the backward goes on
  }
}

Status Reducer::FinishBackward() {
  DDPCHECK_CHECK(armed_, "FinishBackward without Prepare");
  armed_ = false;
  const size_t n = ready_.size();
  unready_.clear();
  // A locally unused parameter's grad in a shared slot takes part in the all-reduce; torch leaves a globally
  // unused one's grad as it was: kept here to put back.
  std::vector<std::pair<int, Tensor>> kept;
  for (size_t p = 0; p < n; ++p) {
    if (ready_[p]) continue;
    if (spec_.find_unused_parameters) {
      const int pi = static_cast<int>(p);
      if (shared_[p] && replica_->GradDefined(pi)) {
        kept.emplace_back(pi, replica_->Memory().ToHost(replica_->Grad(pi), {replica_->Grad(pi).numel}));
      }
      // Unused: the slot holds the existing grad (averaged) or zeros; the param is not "used" locally.
      ready_[p] = true;
      WriteSlot(static_cast<int>(p), replica_->GradDefined(static_cast<int>(p)));
      --buckets_[static_cast<size_t>(bucket_of_[p])].pending;
    } else {
      unready_.push_back(static_cast<int>(p));
    }
  }
  LaunchReadyBuckets();
  const Status pending = comm_->WaitPending();  // every launched bucket reduced (or failed)
  if (status_.ok()) status_ = pending;
  DDPCHECK_RETURN_IF_ERROR(status_);

  std::vector<double> global_used(n, 1.0);
  if (spec_.find_unused_parameters) {
    // local_used_map, SUM-all-reduced once all buckets are launched.
    Span map = replica_->Memory().Allocate(static_cast<int64_t>(n), DType::kInt32);
    std::vector<double> local(n);
    for (size_t p = 0; p < n; ++p) local[p] = used_[p] ? 1.0 : 0.0;
    replica_->Memory().FromHost(Tensor(DType::kInt32, {static_cast<int64_t>(n)}, local), map);
    DDPCHECK_RETURN_IF_ERROR(comm_->AllReduceSum(
        map, "allreduce unused-parameter map (step " + std::to_string(rec_ ? rec_->step() : 0) + ")"));
    global_used = replica_->Memory().ToHost(map, {static_cast<int64_t>(n)}).data;
  }
  // finalize_backward: copy reduced buckets back into the grads.
  for (const Bucket& b : buckets_) {
    if (!b.launched) continue;
    for (size_t s = 0; s < b.params.size(); ++s) {
      const int p = b.params[s];
      if (global_used[static_cast<size_t>(p)] == 0.0) continue;  // globally unused: grad untouched (below)
      replica_->Memory().CopyScaled(View(b, s), replica_->Grad(p), 1.0, ScaleMode::kCopy);
      replica_->SetGradDefined(p, true);
      if (spec_.gradient_as_bucket_view) aliased_[static_cast<size_t>(p)] = true;
    }
  }
  for (const auto& [p, grad] : kept) {
    if (global_used[static_cast<size_t>(p)] == 0.0) replica_->Memory().FromHost(grad, replica_->Grad(p));
  }
  return Status::Ok();
}

void Reducer::OnZeroGrad(bool set_to_none) {
  if (set_to_none) std::fill(aliased_.begin(), aliased_.end(), false);
}

}  // namespace ddpcheck::core
