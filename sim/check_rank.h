// RunCheckRank: RunCheck for one rank of a world whose ranks are processes (cli `launch`, torchrun, mpirun,
// srun). Every rank runs its part of the sim world through `store` and publishes its trace shard there
// ("<run_id>/shard/<rank>"); rank 0 then waits for all shards, merges them, runs the reference and compares,
// exactly as RunCheck does for ranks as threads, so the merged trace equals the threads run bitwise.
#pragma once

#include <memory>

#include "core/report.h"
#include "core/scenario.h"
#include "core/status.h"
#include "sim/check.h"

namespace gloo::rendezvous {
class Store;
}

namespace ddpcheck::sim {

// `s` must be validated and s.world is the number of processes. On rank 0, *report is filled and *reporter set
// true. On other ranks *reporter is false and the return is the rank's own finding (a Timeout naming the
// ranks missing from a collective, a Mismatch) or OK. Rank 0 returns Timeout naming the ranks whose shards
// did not arrive within opts.sim.timeout after its own part ended (they died or never came).
core::Status RunCheckRank(core::Scenario s, const CheckOptions& opts, int rank,
                          std::shared_ptr<gloo::rendezvous::Store> store, core::RunReport* report, bool* reporter);

}  // namespace ddpcheck::sim
