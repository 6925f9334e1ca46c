// LocalCommunicator: core::Communicator in memory, for worlds too large for a Gloo full mesh (W up to 256
// rank threads in one process). All ranks share one LocalWorld, where each collective meets.
//
// AllReduceSum produces the bits GlooCommunicator produces (Gloo's ring order, core/gloo_ring.h).
// Timeouts, fingerprints and messages follow GlooCommunicator: a rank that never arrives within the timeout
// makes the others return Status::Timeout naming it and what it entered last (the world's flight recorder),
// after which the whole world is unusable; ranks that enter different collectives all return
// Status::Mismatch and the world stays usable. One thread per rank; ranks run concurrently.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/communicator.h"
#include "sim/collective_queue.h"
#include "sim/communicator_local_world.h"
#include "sim/flight_recorder.h"

namespace ddpcheck::sim {


class LocalCommunicator final : public core::Communicator {
 public:
  // rank in [0, world->world()); at most one communicator per rank.
  LocalCommunicator(std::shared_ptr<LocalWorld> world, int rank,
                    std::chrono::milliseconds timeout = core::kDefaultTimeout);

  int rank() const override { return rank_; }
  int world() const override;
  // float32, float64, int32, int64 for AllReduceSum; any dtype for the others.
  core::Status AllReduceSum(core::Span buf, const std::string& what) override;
  core::Status Broadcast(core::Span buf, int root, const std::string& what) override;
  core::Status AllGather(core::ConstSpan in, core::Span out, const std::string& what) override;
  core::Status Barrier(const std::string& what) override;
  // Runs at once, with GlooCommunicator's bookkeeping (core/communicator.h): a failure is returned here and
  // again, once, by the next call, which then does not run.
  core::Status StartAllReduceSum(core::Span buf, const std::string& what) override;
  core::Status WaitPending() override;

  void SetTimeout(std::chrono::milliseconds timeout) override { timeout_ = timeout; }
  std::chrono::milliseconds timeout() const override { return timeout_; }
  std::string name() const override { return "local"; }

  // Return Mismatch when ranks disagree on the sequence number too (default on). Off, ranks are still
  // required to agree on op, numel, dtype and root, since the data could not move otherwise.
  void SetVerifyFingerprints(bool on) { verify_fingerprints_ = on; }
  int64_t sequence() const { return seq_; }

 private:
  core::Status Enter(CollectiveRecord record, const void* in, void* out);

  std::shared_ptr<LocalWorld> world_;
  int rank_;
  std::chrono::milliseconds timeout_;
  int64_t seq_ = 0;
  bool verify_fingerprints_ = true;
  // Started all-reduces run at once (RunHere); the queue keeps their failure for the next call.
  CollectiveQueue queue_;
};

}  // namespace ddpcheck::sim
