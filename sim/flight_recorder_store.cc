#include "sim/flight_recorder_store.h"

#include <algorithm>
#include <utility>

#include <gloo/rendezvous/hash_store.h>

#include "sim/store.h"

namespace ddpcheck::sim {

namespace {
// How far readers search around their own sequence number on per-record stores. A miss costs nothing on
// HashStore but about a second on FileStore (its wait() polls once a second), so search less there.
constexpr int64_t kSearchAheadFast = 8;
constexpr int64_t kSearchBehindFast = 64;
constexpr int64_t kSearchBehindSlow = 4;
}  // namespace

StoreFlightRecorder::StoreFlightRecorder(std::shared_ptr<gloo::rendezvous::Store> store, std::string run_id,
                                         int world)
    : store_(std::move(store)),
      prefix_(std::move(run_id) + "/fr/"),
      world_(world),
      overwritable_(dynamic_cast<OverwritableStore*>(store_.get()) != nullptr),
      fast_misses_(overwritable_ || dynamic_cast<gloo::rendezvous::HashStore*>(store_.get()) != nullptr) {}

void StoreFlightRecorder::Record(int rank, const CollectiveRecord& record) {
  if (overwritable_) {
    static_cast<OverwritableStore*>(store_.get())->Put(prefix_ + std::to_string(rank), EncodeRecord(record));
  } else {
    store_->set(prefix_ + std::to_string(rank) + "/" + std::to_string(record.seq), EncodeRecord(record));
  }
}

std::optional<CollectiveRecord> StoreFlightRecorder::Read(const std::string& key) {
  std::vector<char> bytes;
  CollectiveRecord record;
  if (!StoreTryGet(*store_, key, &bytes) || !DecodeRecord(bytes, &record)) return std::nullopt;
  return record;
}

std::optional<CollectiveRecord> StoreFlightRecorder::ReadPerRecord(int rank, int64_t near_seq) {
  const std::string base = prefix_ + std::to_string(rank) + "/";
  auto at = [&](int64_t seq) { return Read(base + std::to_string(seq)); };
  if (auto rec = at(near_seq)) {
    for (int64_t s = near_seq + 1; fast_misses_ && s <= near_seq + kSearchAheadFast; ++s) {
      auto next = at(s);
      if (!next) break;
      rec = next;
    }
    return rec;
  }
  const int64_t lowest = std::max<int64_t>(0, near_seq - (fast_misses_ ? kSearchBehindFast : kSearchBehindSlow));
  for (int64_t s = near_seq - 1; s >= lowest; --s) {
    if (auto rec = at(s)) return rec;
  }
  if (lowest > 0 && at(0)) {  // joined, but its last record is older than the window
    CollectiveRecord older;
    older.seq = -lowest;
    return older;
  }
  return std::nullopt;
}

std::vector<std::optional<CollectiveRecord>> StoreFlightRecorder::ReadAll(int64_t near_seq) {
  std::vector<std::optional<CollectiveRecord>> out(static_cast<size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    try {
      out[static_cast<size_t>(r)] =
          overwritable_ ? Read(prefix_ + std::to_string(r)) : ReadPerRecord(r, std::max<int64_t>(0, near_seq));
    } catch (const std::exception&) {
      // A store that fails while we explain a failure: leave the rank unknown.
    }
  }
  return out;
}

}  // namespace ddpcheck::sim
