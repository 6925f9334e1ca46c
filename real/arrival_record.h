// ArrivalRecord: a small store-based flight recorder for the GPU world (sim/flight_recorder.h is the CPU
// world's; sim and real never include each other, so the lead may move one shared version to core/).
// Before its collective number `seq`, a rank writes "<run_id>/arrive/<rank>/<seq>" = what it entered. When
// a collective times out, the ranks without that key are the missing ones, and the latest key each of them
// did write says what it entered last.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "real/kv_store.h"

namespace ddpcheck::real {

class ArrivalRecord {
 public:
  ArrivalRecord(std::shared_ptr<KvStore> store, std::string run_id, int rank, int world);

  // This rank enters collective `seq` (1-based, the same number on every rank).
  void Arrive(int64_t seq, const std::string& what);
  // Ranks that have not arrived at `seq`.
  std::vector<int> Missing(int64_t seq) const;
  // "rank 2 (last entered #7 'allreduce bucket 0'), rank 3 (entered nothing)"; looks back `lookback` records.
  std::string DescribeMissing(int64_t seq, int lookback = 16) const;

 private:
  std::string Key(int rank, int64_t seq) const;
  std::shared_ptr<KvStore> store_;
  std::string run_id_;
  int rank_, world_;
};

}  // namespace ddpcheck::real
