// The reference side of a GPU rank: what real/ needs from reference/ (which it may not include), built here in
// the composition root. Rank r's model after model-changing faults (core::ScenarioForRank), initialised exactly
// as its CPU twin (sim::MakeCpuReplica) is, and its dropout stream (ref::DropoutSeed, the same-dropout-seed
// fault honoured), so a CudaReplica starts from the same bits and drops the same elements.
#pragma once

#include "core/scenario.h"
#include "core/status.h"
#include "real/replica_cuda.h"
#include "real/world.h"

namespace ddpcheck::harness {

core::Status ReferenceRankSetup(const core::Scenario& s, int rank, real::RankSetup* out);

// `opts` with setup = ReferenceRankSetup.
real::RealOptions WithReferenceSetup(real::RealOptions opts);

}  // namespace ddpcheck::harness
