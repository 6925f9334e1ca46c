// Fault injection: the BUGS.md catalog turned into per-rank switches that the training loop, DDP wrapper and
// reducer honour. A fault is "NAME[@RANK][:STEP]": RANK limits it to one rank (default: the catalog's
// default rank), STEP makes it start at that optimizer step (default: from the start).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ddp.h"
#include "core/fault_spec.h"
#include "core/plan.h"
#include "core/scenario.h"

namespace ddpcheck::core {

// What the faults of a scenario mean for one rank.
struct RankFaults {
  PlanOptions plan;
  std::vector<FaultSpec> active;  // the scenario's faults that touch this rank
  DdpFaults DdpAt(int64_t step) const;
  double LossFactorAt(int64_t step) const;  // loss-times-world: W; else 1
  bool SkipStepAt(int64_t step) const;      // skip-step@R
  // AMP faults (used where the loop scales, unscales and clips):
  double ScalerInitFactor() const;          // scaler-state@R: this rank's GradScaler starts at 2x the scale
  bool ClipBeforeUnscaleAt(int64_t step) const;  // clip-before-unscale: clip the scaled grads, then unscale
  int world = 1;
  int rank = 0;
};
RankFaults FaultsForRank(const Scenario& s, int rank);

}  // namespace ddpcheck::core
