#include "sim/communicator_local.h"

#include "core/check.h"

namespace ddpcheck::sim {

using core::Status;

LocalCommunicator::LocalCommunicator(std::shared_ptr<LocalWorld> world, int rank, std::chrono::milliseconds timeout)
    : world_(std::move(world)), rank_(rank), timeout_(timeout) {
  DDPCHECK_CHECK(world_ != nullptr);
  DDPCHECK_CHECK(rank >= 0 && rank < world_->world(), "rank ", rank, " of world ", world_->world());
}

int LocalCommunicator::world() const { return world_->world(); }

Status LocalCommunicator::Enter(CollectiveRecord record, const void* in, void* out) {
  DDPCHECK_RETURN_IF_ERROR(queue_.Wait());  // a started all-reduce failed: returned once, this one not run
  record.seq = ++seq_;
  LocalWorld::Arrival arrival{std::move(record), in, out, verify_fingerprints_};
  return world_->Meet(rank_, arrival, timeout_);
}

Status LocalCommunicator::AllReduceSum(core::Span buf, const std::string& what) {
  const core::DType d = buf.dtype;
  if (d != core::DType::kFloat32 && d != core::DType::kFloat64 && d != core::DType::kInt32 &&
      d != core::DType::kInt64) {
    return Status::Invalid("local allreduce '" + what + "': dtype " + core::DTypeName(d) +
                           " is not supported (float32, float64, int32, int64)");
  }
  return Enter({0, CollectiveOp::kAllReduce, buf.numel, d, -1, what}, buf.data, buf.data);
}

Status LocalCommunicator::StartAllReduceSum(core::Span buf, const std::string& what) {
  return queue_.RunHere([&] { return AllReduceSum(buf, what); });
}

Status LocalCommunicator::WaitPending() { return queue_.Wait(); }

Status LocalCommunicator::Broadcast(core::Span buf, int root, const std::string& what) {
  if (root < 0 || root >= world()) {
    return Status::Invalid("local broadcast '" + what + "': root " + std::to_string(root) +
                           " is not a rank of world " + std::to_string(world()));
  }
  return Enter({0, CollectiveOp::kBroadcast, buf.numel, buf.dtype, root, what}, buf.data, buf.data);
}

Status LocalCommunicator::AllGather(core::ConstSpan in, core::Span out, const std::string& what) {
  if (out.dtype != in.dtype || out.numel != in.numel * world()) {
    return Status::Invalid("local allgather '" + what + "': out must be " + std::to_string(in.numel * world()) +
                           " " + core::DTypeName(in.dtype) + " (in.numel * world), got " +
                           std::to_string(out.numel) + " " + core::DTypeName(out.dtype));
  }
  return Enter({0, CollectiveOp::kAllGather, in.numel, in.dtype, -1, what}, in.data, out.data);
}

Status LocalCommunicator::Barrier(const std::string& what) {
  return Enter({0, CollectiveOp::kBarrier, 0, core::DType::kFloat32, -1, what}, nullptr, nullptr);
}

}  // namespace ddpcheck::sim
