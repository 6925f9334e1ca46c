// The flight recorder kept in a gloo rendezvous store, so ranks in different processes can read each
// other's records. Keys live under "<run_id>/fr/":
//   - on an OverwritableStore (sim::MemoryStore): one key per rank, "<run_id>/fr/<rank>", replaced on every
//     collective (one map assignment);
//   - on gloo's HashStore / FileStore, which refuse to overwrite: one key per record,
//     "<run_id>/fr/<rank>/<seq>", and readers search around their own sequence number. HashStore then
//     grows by ~100 bytes per collective per rank and FileStore by a file, so prefer MemoryStore.
#pragma once

#include <memory>
#include <string>

#include "sim/flight_recorder.h"

namespace gloo::rendezvous {
class Store;
}

namespace ddpcheck::sim {

class StoreFlightRecorder final : public FlightRecorder {
 public:
  StoreFlightRecorder(std::shared_ptr<gloo::rendezvous::Store> store, std::string run_id, int world);
  // Throws what the store throws (gloo::EnforceNotMet when a per-record key already exists).
  void Record(int rank, const CollectiveRecord& record) override;
  // Per-record stores: searches near_seq + 8 down to near_seq - 64 on a HashStore, near_seq down to
  // near_seq - 4 on other stores (a FileStore miss costs ~1 s); a rank with no record in that window but a
  // join record reads as seq -(lowest searched) ("a collective before #..."). Never throws.
  std::vector<std::optional<CollectiveRecord>> ReadAll(int64_t near_seq) override;

 private:
  std::optional<CollectiveRecord> Read(const std::string& key);
  std::optional<CollectiveRecord> ReadPerRecord(int rank, int64_t near_seq);

  std::shared_ptr<gloo::rendezvous::Store> store_;
  std::string prefix_;  // "<run_id>/fr/"
  int world_;
  bool overwritable_;
  bool fast_misses_;  // a read of a missing key returns at once
};

}  // namespace ddpcheck::sim
