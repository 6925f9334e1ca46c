#include "core/ddp.h"

#include <algorithm>
#include <sstream>

#include "core/buckets.h"
#include "core/check.h"

namespace ddpcheck::core {

namespace {
std::string JoinSizes(const std::vector<int64_t>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}
}  // namespace

std::vector<std::pair<int64_t, DType>> ParamSizes(const Replica& replica) {
  std::vector<std::pair<int64_t, DType>> sizes;
  for (const auto& p : replica.ParamInfos()) sizes.emplace_back(p.numel(), p.dtype);
  return sizes;
}

DistributedDataParallel::DistributedDataParallel(Replica* replica, Communicator* comm, const DdpSpec& spec)
    : replica_(replica), comm_(comm), spec_(spec), reducer_(replica, comm, spec) {}

Status DistributedDataParallel::VerifyParams(bool reversed) {
  // (a) all-gather the parameter count.
  std::vector<ParamInfo> infos = replica_->ParamInfos();
  if (reversed) std::reverse(infos.begin(), infos.end());  // param-order: registered in another order
  const int world = comm_->world();
  Span mine = replica_->Memory().Allocate(1, DType::kInt64);
  Span all = replica_->Memory().Allocate(world, DType::kInt64);
  replica_->Memory().FromHost(Tensor(DType::kInt64, {1}, {static_cast<double>(infos.size())}), mine);
  DDPCHECK_RETURN_IF_ERROR(comm_->AllGather(mine, all, "allgather parameter count (DDP construction)"));
  const std::vector<double> counts = replica_->Memory().ToHost(all, {world}).data;
  for (int r = 0; r < world; ++r) {
    if (counts[static_cast<size_t>(r)] != counts[0]) {
      return Status::Mismatch("DDP expects same model across all ranks, but Rank " + std::to_string(comm_->rank()) +
                              " has " + std::to_string(infos.size()) + " params, while rank " + std::to_string(r) +
                              " has inconsistent " + std::to_string(static_cast<int64_t>(counts[static_cast<size_t>(r)])) +
                              " params.");
    }
  }
  // (b) rank 0 broadcasts every parameter's sizes; each rank compares with its own.
  std::vector<double> meta;
  for (const auto& p : infos) {
    meta.push_back(static_cast<double>(p.shape.size()));
    for (int64_t d : p.shape) meta.push_back(static_cast<double>(d));
  }
  Span len = replica_->Memory().Allocate(1, DType::kInt64);
  replica_->Memory().FromHost(Tensor(DType::kInt64, {1}, {static_cast<double>(meta.size())}), len);
  DDPCHECK_RETURN_IF_ERROR(comm_->Broadcast(len, 0, "broadcast parameter shapes length (DDP construction)"));
  const auto root_len = static_cast<int64_t>(replica_->Memory().ToHost(len, {1}).data[0]);
  Span shapes = replica_->Memory().Allocate(root_len, DType::kInt64);
  if (comm_->rank() == 0) replica_->Memory().FromHost(Tensor(DType::kInt64, {root_len}, meta), shapes);
  DDPCHECK_RETURN_IF_ERROR(comm_->Broadcast(shapes, 0, "broadcast parameter shapes (DDP construction)"));
  const std::vector<double> root = replica_->Memory().ToHost(shapes, {root_len}).data;
  size_t pos = 0;
  for (size_t i = 0; i < infos.size(); ++i) {
    std::vector<int64_t> root_shape;
    if (pos < root.size()) {
      const auto nd = static_cast<size_t>(root[pos++]);
      for (size_t d = 0; d < nd && pos < root.size(); ++d) root_shape.push_back(static_cast<int64_t>(root[pos++]));
    }
    if (root_shape != infos[i].shape) {
      return Status::Mismatch("[" + std::to_string(comm_->rank()) + "]: params[" + std::to_string(i) +
                              "] in this process with sizes " + JoinSizes(infos[i].shape) +
                              " appears not to match sizes of the same param in process 0.");
    }
  }
  return Status::Ok();
}

Status DistributedDataParallel::BroadcastState(bool params, bool buffers, const std::string& what) {
  if (params) {
    for (size_t i = 0; i < replica_->ParamInfos().size(); ++i) {
      DDPCHECK_RETURN_IF_ERROR(comm_->Broadcast(replica_->Param(static_cast<int>(i)), 0,
                                                "broadcast " + replica_->ParamInfos()[i].name + " " + what));
    }
  }
  if (buffers) {
    for (size_t i = 0; i < replica_->BufferInfos().size(); ++i) {
      DDPCHECK_RETURN_IF_ERROR(comm_->Broadcast(replica_->Buffer(static_cast<int>(i)), 0,
                                                "broadcast " + replica_->BufferInfos()[i].name + " " + what));
    }
  }
  return Status::Ok();
}

Status DistributedDataParallel::Init(const StepRecorder* rec, const DdpFaults& faults) {
  if (rec) rec->set_checkpoint(Checkpoint::kInit);
  DDPCHECK_RETURN_IF_ERROR(VerifyParams(faults.reversed_param_order));
  if (faults.perturb_buffers) {
    // A buffer-only module outside the wrapper, initialised differently on this rank.
    for (size_t i = 0; i < replica_->BufferInfos().size(); ++i) {
      if (IsFloating(replica_->BufferInfos()[i].dtype)) replica_->Memory().Fill(replica_->Buffer(static_cast<int>(i)), 0.5);
    }
  }
  // _sync_module_states: parameters and (1.13: always) buffers from rank 0.
  if (!faults.skip_initial_broadcast) {
    DDPCHECK_RETURN_IF_ERROR(BroadcastState(true, !faults.buffers_outside, "(DDP construction)"));
  }
  reducer_.SetBuckets(InitialBucketLayout(ParamSizes(*replica_), spec_));
  if (rec) {
    rec->RecordParams(Checkpoint::kInit);
    rec->RecordBuffers(Checkpoint::kInit);
  }
  return Status::Ok();
}

Status DistributedDataParallel::RebuildBuckets() {
  // Rank 0 computes the layout from its gradient-ready order; every rank adopts it (sync_bucket_indices).
  std::vector<double> flat;  // [num_buckets, size_0, ..., size_{B-1}, indices...]
  if (comm_->rank() == 0) {
    auto layout = RebuiltBucketLayout(reducer_.ready_order(), ParamSizes(*replica_), spec_);
    flat.push_back(static_cast<double>(layout.size()));
    for (const auto& b : layout) flat.push_back(static_cast<double>(b.size()));
    for (const auto& b : layout) flat.insert(flat.end(), b.begin(), b.end());
  }
  const int64_t max_len = 1 + 2 * static_cast<int64_t>(replica_->ParamInfos().size());
  Span buf = replica_->Memory().Allocate(max_len, DType::kInt64);
  if (comm_->rank() == 0) {
    flat.resize(static_cast<size_t>(max_len), 0.0);
    replica_->Memory().FromHost(Tensor(DType::kInt64, {max_len}, flat), buf);
  }
  DDPCHECK_RETURN_IF_ERROR(comm_->Broadcast(buf, 0, "broadcast rebuilt bucket layout (step " + std::to_string(step_) + ")"));
  flat = replica_->Memory().ToHost(buf, {max_len}).data;
  const auto nb = static_cast<size_t>(flat[0]);
  std::vector<std::vector<int>> layout(nb);
  size_t pos = 1 + nb;
  for (size_t b = 0; b < nb; ++b) {
    for (int64_t k = 0; k < static_cast<int64_t>(flat[1 + b]); ++k) layout[b].push_back(static_cast<int>(flat[pos++]));
  }
  reducer_.SetBuckets(layout);
  reducer_.StopRecordingReadyOrder();
  has_rebuilt_ = true;
  return Status::Ok();
}

Status DistributedDataParallel::Forward(const Batch& batch, bool no_sync, const StepRecorder* rec,
                                        const DdpFaults& faults, double* loss) {
  step_ = rec ? rec->step() : step_;
  if (reducer_.unfinished()) {
    std::string ids;
    for (int p : reducer_.unready_params()) ids += (ids.empty() ? "" : " ") + std::to_string(p);
    std::string names;
    for (int p : reducer_.unready_params()) names += (names.empty() ? "" : ", ") + replica_->ParamInfos()[static_cast<size_t>(p)].name;
    reducer_.ClearUnfinished();
    return Status::Mismatch(
        "Expected to have finished reduction in the prior iteration before starting a new one. This error "
        "indicates that your module has parameters that were not used in producing loss. You can enable unused "
        "parameter detection by passing the keyword argument `find_unused_parameters=True` to "
        "`torch.nn.parallel.DistributedDataParallel`, and by making sure all `forward` function outputs "
        "participate in calculating loss. Parameter indices which did not receive grad for rank " +
        std::to_string(comm_->rank()) + ": " + ids + " (" + names + ")");
  }
  const bool sync = !no_sync && !faults.bypass;
  if (rec) rec->set_checkpoint(Checkpoint::kForwardBuffers);
  if (sync && !has_rebuilt_ && !spec_.find_unused_parameters && !reducer_.ready_order().empty()) {
    DDPCHECK_RETURN_IF_ERROR(RebuildBuckets());
  }
  if (!faults.bypass && require_forward_param_sync_ && spec_.broadcast_buffers && !faults.skip_buffer_broadcast &&
      !faults.buffers_outside && !replica_->BufferInfos().empty()) {
    DDPCHECK_RETURN_IF_ERROR(BroadcastState(false, true, "(forward, step " + std::to_string(step_) + ")"));
  }
  if (rec && batch.micro_step == 0) rec->RecordBuffers(Checkpoint::kForwardBuffers);  // window start
  replica_->SetTraining(true);
  if (rec) rec->set_checkpoint(Checkpoint::kLoss);
  DDPCHECK_RETURN_IF_ERROR(replica_->Forward(batch, loss));
  if (!faults.bypass) require_forward_param_sync_ = !no_sync;
  if (sync) reducer_.Prepare(rec, faults.reducer);
  return Status::Ok();
}

Status DistributedDataParallel::Backward(double loss_scale) {
  const bool armed = reducer_.armed();
  if (!armed) {
    // no_sync (or a bypassed forward): grads accumulate locally; remember which params got one, for the
    // used-map of the next synced backward (PyTorch PR #124193; the nosync-unused fault forgets them).
    return replica_->Backward(loss_scale, [this](int p) { reducer_.MarkUsedOutsideSync(p); });
  }
  DDPCHECK_RETURN_IF_ERROR(replica_->Backward(loss_scale, [this](int p) { reducer_.MarkReady(p); }));
  return reducer_.FinishBackward();
}

void DistributedDataParallel::ZeroGrad(bool set_to_none) {
  replica_->ZeroGrad(set_to_none);
  reducer_.OnZeroGrad(set_to_none);
}

}  // namespace ddpcheck::core
