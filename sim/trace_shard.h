// A rank's part of a trace as one byte string, so ranks as processes can hand their traces to rank 0 through
// the rendezvous store (no shared filesystem needed), and the merge of those parts into one world trace.
#pragma once

#include <vector>

#include "core/status.h"
#include "core/trace.h"

namespace ddpcheck::sim {

// Serialises `trace` exactly as Trace::Write lays it out on disk (index.json + .npy files), packed as
// [u32 name length, name, u64 size, bytes]*.
core::Status PackTrace(const core::Trace& trace, std::vector<char>* out);
// Inverse of PackTrace. Invalid on a truncated or malformed blob.
core::Status UnpackTrace(const std::vector<char>& blob, core::Trace* out);

// Adds every record and event of `shard` to *world (a key present in both takes the shard's value, as when
// rank threads record into one trace). Meta is left alone.
void MergeShard(const core::Trace& shard, core::Trace* world);

}  // namespace ddpcheck::sim
