#include "core/finite.h"

#include <cmath>

#include <fmt/format.h>

namespace ddpcheck::core {

namespace {

bool ExemptUnderOverflow(Checkpoint c) {
  return c == Checkpoint::kLoss || c == Checkpoint::kLocalGrad || c == Checkpoint::kBucket ||
         c == Checkpoint::kReduced || c == Checkpoint::kUnscaled;
}

// The first non-finite element's index, read as the value is held (a compact record is not widened), or -1.
int64_t FirstNonFinite(const RecordValue& v) {
  if (const RecordValue::Floats f = v.floats()) {
    for (size_t i = 0; i < f->size(); ++i) {
      if (!std::isfinite((*f)[i])) return static_cast<int64_t>(i);
    }
    return -1;
  }
  const std::vector<double>& d = v.tensor().data;
  for (size_t i = 0; i < d.size(); ++i) {
    if (!std::isfinite(d[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace

Status CheckFinite(const Trace& t, const std::string& source, const std::set<int64_t>& overflow_steps,
                   const std::set<std::string>& buffers) {
  std::set<int64_t> overflow = overflow_steps;
  for (const auto& [key, value] : t.records()) {
    if (key.checkpoint != Checkpoint::kScaler || key.tensor != "found_inf") continue;
    for (double v : value->data) {
      if (v != 0) overflow.insert(key.step);
    }
  }
  for (const auto& [key, value] : t.records()) {
    if (ExemptUnderOverflow(key.checkpoint) && overflow.count(key.step)) continue;
    const bool buffer_record = key.checkpoint == Checkpoint::kBuffers || key.checkpoint == Checkpoint::kForwardBuffers ||
                               key.checkpoint == Checkpoint::kInit;
    if (buffer_record && buffers.count(key.tensor)) continue;
    const int64_t i = FirstNonFinite(value.value());
    if (i < 0) continue;
    return Status::Mismatch(fmt::format("{}: non-finite value in {} ({}) at step {}, rank {}: {} at flat index {}",
                                        source, key.tensor, CheckpointName(key.checkpoint), key.step,
                                        key.rank == kAllRanks ? std::string("all") : std::to_string(key.rank),
                                        value->data[static_cast<size_t>(i)], i));
  }
  return Status::Ok();
}

}  // namespace ddpcheck::core
