#include "sim/communicator_local_world.h"

#include <cstring>

#include "core/check.h"
#include "core/gloo_ring.h"

namespace ddpcheck::sim {

using core::Status;

std::shared_ptr<LocalWorld> LocalWorld::Create(int world) { return std::make_shared<LocalWorld>(world); }

LocalWorld::LocalWorld(int world)
    : world_(world),
      recorder_(world),
      arrivals_(static_cast<size_t>(world)),
      fingerprints_(static_cast<size_t>(world)) {
  DDPCHECK_CHECK_GE(world, 1);
}

Status LocalWorld::Stall(int rank, const CollectiveRecord& record, std::chrono::milliseconds timeout) {
  StallReport report = DescribeStall(record, rank, timeout, recorder_.ReadAll(record.seq), "");
  return Status::Timeout(report.message);
}

Status LocalWorld::Meet(int rank, const Arrival& arrival, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  // Ranks still copying the previous collective's results out finish without waiting on anyone.
  cv_.wait_until(lock, deadline, [&] { return !broken_.ok() || !releasing_; });
  if (!broken_.ok()) {
    return Status(broken_.code(), "local world is unusable after an earlier failure: " + broken_.message());
  }
  if (releasing_) return Status::Internal("local world: rank " + std::to_string(rank) + " found the previous "
                                          "collective still releasing after the timeout");
  recorder_.Record(rank, arrival.record);
  arrivals_[static_cast<size_t>(rank)] = arrival;
  const int64_t generation = generation_;
  if (++arrived_ == world_) {
    Complete();
    cv_.notify_all();
  } else if (!cv_.wait_until(lock, deadline, [&] { return !broken_.ok() || generation_ != generation || releasing_; })) {
    broken_ = Stall(rank, arrival.record, timeout);
    cv_.notify_all();
    return broken_;
  }
  if (!broken_.ok()) return Stall(rank, arrival.record, timeout);  // another rank timed out first

  Status verdict;
  if (mismatch_) verdict = Status::Mismatch(CheckFingerprints(arrival.record, rank, fingerprints_));
  lock.unlock();
  if (verdict.ok() && !result_.empty()) std::memcpy(arrival.out, result_.data(), result_.size());
  lock.lock();
  if (++departed_ == world_) {
    arrived_ = departed_ = 0;
    releasing_ = false;
    mismatch_ = false;
    result_.clear();
    ++generation_;
    cv_.notify_all();
  }
  return verdict;
}

void LocalWorld::Complete() {
  bool check_seq = false;
  for (size_t r = 0; r < arrivals_.size(); ++r) {
    fingerprints_[r] = FingerprintOf(arrivals_[r].record);
    check_seq = check_seq || arrivals_[r].check_seq;
  }
  const CollectiveRecord& first = arrivals_[0].record;
  for (const Arrival& a : arrivals_) {
    const CollectiveRecord& r = a.record;
    bool same = r.op == first.op && r.numel == first.numel && r.dtype == first.dtype && r.root == first.root;
    if (!same || (check_seq && r.seq != first.seq)) mismatch_ = true;
  }
  releasing_ = true;
  if (mismatch_ || first.numel == 0) return;
  const size_t bytes = static_cast<size_t>(first.numel * core::ElementSize(first.dtype));
  switch (first.op) {
    case CollectiveOp::kAllReduce: {
      std::vector<const void*> inputs;
      for (const Arrival& a : arrivals_) inputs.push_back(a.in);
      result_.resize(bytes);
      DDPCHECK_CHECK(core::GlooRingSum(inputs, first.numel, first.dtype, result_.data()), core::DTypeName(first.dtype));
      break;
    }
    case CollectiveOp::kBroadcast: {
      const char* src = static_cast<const char*>(arrivals_[static_cast<size_t>(first.root)].in);
      result_.assign(src, src + bytes);
      break;
    }
    case CollectiveOp::kAllGather:
      result_.resize(bytes * arrivals_.size());
      for (size_t r = 0; r < arrivals_.size(); ++r) std::memcpy(result_.data() + r * bytes, arrivals_[r].in, bytes);
      break;
    default:
      break;
  }
}

}  // namespace ddpcheck::sim
