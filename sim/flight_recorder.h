// Flight recorder: before entering a collective, each rank records what it is about to enter (sequence
// number, op, label, numel, dtype). When a collective fails, a rank reads every rank's last record and can
// say which ranks never arrived and what each of them entered last, e.g.
//   collective #17 allreduce 'bucket 0 (step 3)' timed out after 2000 ms on rank 1: rank 2 never arrived
//   (last entered: #16 broadcast 'buffers (step 3)'); rank 0 entered #17 allreduce 'bucket 0 (step 3)'
// The records live wherever the ranks can all see them: in memory for LocalWorld, in the rendezvous store
// for Gloo (sim/flight_recorder_store.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace ddpcheck::sim {

enum class CollectiveOp : int64_t { kJoin = 0, kAllReduce = 1, kBroadcast = 2, kAllGather = 3, kBarrier = 4 };

// "join", "allreduce", "broadcast", "allgather", "barrier".
std::string OpName(CollectiveOp op);

struct CollectiveRecord {
  // 1 for a communicator's first collective; 0 for the join record written at rendezvous; -N when a reader
  // only knows that the rank's last record is older than #N (see StoreFlightRecorder).
  int64_t seq = 0;
  CollectiveOp op = CollectiveOp::kJoin;
  int64_t numel = 0;  // per rank: the input's element count (allgather: one rank's contribution)
  core::DType dtype = core::DType::kFloat32;
  int root = -1;     // broadcast only
  std::string what;  // the caller's label
};

// "#17 allreduce 'bucket 0 (step 3)'"; the join record reads "#0 rendezvous"; seq -N "a collective before #N".
std::string DescribeRecord(const CollectiveRecord& record);

// A compact, self-delimiting encoding for stores. Decode returns false on malformed input.
std::vector<char> EncodeRecord(const CollectiveRecord& record);
bool DecodeRecord(const std::vector<char>& bytes, CollectiveRecord* out);

// "rank 2", "ranks 0, 3", "ranks 0-1, 3-63": sorted ranks with runs of three or more collapsed.
std::string RankList(std::vector<int> ranks);

class FlightRecorder {
 public:
  virtual ~FlightRecorder() = default;
  // Records that `rank` is about to enter `record`; replaces the rank's previous record.
  virtual void Record(int rank, const CollectiveRecord& record) = 0;
  // Every rank's last record, indexed by rank; nullopt for a rank that recorded nothing (never joined).
  // `near_seq` is the reader's own sequence number: stores that keep one key per record search from there.
  virtual std::vector<std::optional<CollectiveRecord>> ReadAll(int64_t near_seq) = 0;
};

// Records in memory, for ranks that share one process (LocalWorld). Thread-safe.
class MemoryFlightRecorder final : public FlightRecorder {
 public:
  explicit MemoryFlightRecorder(int world) : records_(static_cast<size_t>(world)) {}
  void Record(int rank, const CollectiveRecord& record) override;
  std::vector<std::optional<CollectiveRecord>> ReadAll(int64_t near_seq) override;

 private:
  std::mutex mu_;
  std::vector<std::optional<CollectiveRecord>> records_;
};

struct StallReport {
  std::vector<int> missing;  // ranks whose last record is older than `mine` (or that never joined)
  std::string message;
};

// Explains why collective `mine` failed on `rank`. `records` as from FlightRecorder::ReadAll (empty when
// the recorder is off); `cause` the backend's error text, appended when non-empty. With missing ranks:
//   "collective #17 allreduce 'b' timed out after 2000 ms on rank 1: rank 2 never arrived (last entered:
//    #16 broadcast 'x'); rank 0 entered #17 allreduce 'b'"
// Without (every rank entered, e.g. a peer failed inside the collective):
//   "collective #17 allreduce 'b' failed on rank 1 although every rank entered it: <cause>"
StallReport DescribeStall(const CollectiveRecord& mine, int rank, std::chrono::milliseconds timeout,
                          const std::vector<std::optional<CollectiveRecord>>& records, const std::string& cause);

}  // namespace ddpcheck::sim
