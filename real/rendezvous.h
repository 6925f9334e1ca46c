// The GPU world's join, before any NCCL call: plain C++ over the run's KvStore, so it is tested on machines
// without a GPU (tests/gpu_host_rendezvous_test.cc). Every rank writes its arrival at collective #0 ("nccl
// init", real/arrival_record.h) and waits, bounded by the timeout, until every rank of the world has; rank 0
// publishes the NCCL unique id under "<run_id>/nccl/unique_id", the others read it. A rank that never comes
// is named the way the CPU world names it (sim/communicator_gloo_rendezvous.cc): "nccl init of run 'r' on
// rank 0 timed out after 200 ms: rank 2 never joined (2 of 3 joined)". Only then does NcclCommunicator call
// ncclCommInitRankConfig, whose own wait is bounded by the same deadline.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "real/arrival_record.h"
#include "real/kv_store.h"

namespace ddpcheck::real {

// "rank 2", "ranks 0, 3", "ranks 1-5" (ascending).
std::string RankListText(std::vector<int> ranks);

// Joins run `run_id` as `rank` of `world`. Rank 0 calls make_id once, after every rank joined, and publishes
// its bytes; every rank gets them in *id. Timeout names the ranks that never joined; Internal when the id
// has the wrong size (want_bytes) or make_id fails.
core::Status JoinAndExchangeId(KvStore* store, ArrivalRecord* arrivals, const std::string& run_id, int rank,
                               int world, std::chrono::milliseconds timeout,
                               const std::function<core::Status(std::vector<char>*)>& make_id, size_t want_bytes,
                               std::vector<char>* id);

}  // namespace ddpcheck::real
