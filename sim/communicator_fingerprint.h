// Collective fingerprints: before the data of a collective moves, every rank can check that all ranks are
// entering the same collective (same op, sequence number, element count, dtype and root). The label
// (`what`) is left out on purpose: ranks may word it differently, and the check is about the data.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "sim/flight_recorder.h"

namespace ddpcheck::sim {

// {op, seq, numel, dtype, root, hash of the first five}: what a rank contributes to the fingerprint
// allgather (Gloo) or leaves at the meeting point (LocalWorld).
constexpr int kFingerprintWords = 6;
using Fingerprint = std::array<int64_t, kFingerprintWords>;

Fingerprint FingerprintOf(const CollectiveRecord& record);

// "allreduce of 1000 float32 (#5)", "broadcast of 8 float64 from rank 0 (#6)", "barrier (#7)".
std::string DescribeFingerprint(const Fingerprint& fp);

// Empty when all fingerprints agree. Otherwise names the ranks that differ from the majority (ties go to
// the group holding the lowest rank) and both fingerprints, as seen by `rank` entering `mine`:
//   "collective #5 allreduce 'b' does not match on every rank (seen by rank 0): rank 1 entered allreduce
//    of 1000 float32 (#5) while rank 0 entered allreduce of 1024 float32 (#5)"
// all: one fingerprint per rank, indexed by rank.
std::string CheckFingerprints(const CollectiveRecord& mine, int rank, const std::vector<Fingerprint>& all);

}  // namespace ddpcheck::sim
