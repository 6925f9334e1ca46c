// LocalWorld: where the ranks of a LocalCommunicator world meet for each collective. Shared by all ranks
// (std::shared_ptr); see sim/communicator_local.h for the semantics.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <vector>

#include "core/status.h"
#include "sim/communicator_fingerprint.h"
#include "sim/flight_recorder.h"

namespace ddpcheck::sim {

class LocalWorld {
 public:
  // A world of `world` ranks (>= 1).
  static std::shared_ptr<LocalWorld> Create(int world);
  int world() const { return world_; }

  // One rank's part in a collective. in: the rank's input (allreduce/broadcast: the buffer itself);
  // out: where its result goes (allreduce, broadcast: record.numel elements; allgather: world * numel).
  struct Arrival {
    CollectiveRecord record;
    const void* in = nullptr;
    void* out = nullptr;
    bool check_seq = true;  // count a differing sequence number as a mismatch
  };
  // Blocks until every rank has arrived at this collective (the last to arrive computes every result),
  // `timeout` passes (-> Timeout naming the ranks that never arrived; the world is then unusable), or
  // another rank's timeout breaks the world. Mismatching arrivals -> Mismatch on every rank, no data moved.
  core::Status Meet(int rank, const Arrival& arrival, std::chrono::milliseconds timeout);

  explicit LocalWorld(int world);

 private:
  void Complete();  // under mu_, by the last rank to arrive
  core::Status Stall(int rank, const CollectiveRecord& record, std::chrono::milliseconds timeout);

  const int world_;
  std::mutex mu_;
  std::condition_variable cv_;
  MemoryFlightRecorder recorder_;
  std::vector<Arrival> arrivals_;  // by rank, for the collective being met
  int arrived_ = 0;
  int departed_ = 0;
  bool releasing_ = false;  // every rank arrived; results are being copied out
  int64_t generation_ = 0;  // collectives completed
  bool mismatch_ = false;
  std::vector<Fingerprint> fingerprints_;
  std::vector<char> result_;
  core::Status broken_;
};

}  // namespace ddpcheck::sim
