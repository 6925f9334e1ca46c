// Fault injection: the BUGS.md catalog (core/fault_spec.h) turned into per-rank switches that the training
// loop, the DDP wrapper, the reducer and the replica builders honour. A fault is "NAME[@RANK][:STEP]":
// RANK limits it to one rank (a fault whose catalog row is per-rank defaults to the last rank, W-1; the others
// touch every rank), STEP makes it start at that optimizer step (default: from the start).
// The reference never sees faults (it is the oracle), except for what describes the user's setup rather than
// a bug: the uneven data split of uneven-shard-mean and syncbn-unequal-counts (see SetupPlanOptions).
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
  std::vector<FaultSpec> active;  // the scenario's faults that touch this rank (rank resolved)
  int world = 1;
  int rank = 0;
  int64_t no_sync_steps = 1;
  bool buffers_outside = false;  // buffer-outside-ddp anywhere: no rank broadcasts the buffers

  bool Has(const std::string& name) const;
  DdpFaults DdpAt(int64_t step) const;
  // Factor on the loss before backward: loss-times-world: W; grad-accum-normalisation: 1/k (1/W when k == 1).
  double LossFactorAt(int64_t step) const;
  double LrFactorAt(int64_t step) const;     // lr-not-scaled: 1/W (the rule the run assumes was not applied)
  bool SkipStepAt(int64_t step) const;       // skip-step@R
  bool CountEvalPadding() const;             // eval-padding-counted
  // AMP faults (used where the loop scales, unscales and clips):
  double ScalerInitFactor() const;               // scaler-state@R: this rank's GradScaler starts at 2x the scale
  bool ClipBeforeUnscaleAt(int64_t step) const;  // clip-before-unscale: clip the scaled grads, then unscale
};
RankFaults FaultsForRank(const Scenario& s, int rank);

// The plan options of the user's setup for `rank` (faults aside): an uneven split (sampler.uneven_split, or
// the faults uneven-shard-mean and syncbn-unequal-counts, whose rows describe one) trims ranks 1..W-1.
PlanOptions SetupPlanOptions(const Scenario& s, int rank);
// The scenario as the user's setup describes it, for the oracle: no faults, and what the faults that describe
// a setup rather than a bug say turned into the scenario's own settings (an uneven split: sampler.uneven_split;
// uneven-shard-mean: the single-process global-batch mean; unused-param and different-forward-path: the layer
// not taken, as `unused` on those ranks). The reference runs this scenario and never sees a fault.
Scenario OracleScenario(const Scenario& s);
// Whether the scenario's data split is uneven (see SetupPlanOptions).
bool UnevenSplit(const Scenario& s);
bool ScenarioHasFault(const Scenario& s, const std::string& name);

// The scenario rank `rank`'s replica is built from: model-changing faults applied (unused-param: a layer
// with in == out is skipped on every rank; different-forward-path@R: skipped on rank R only). Fails when a
// fault needs a layer the model lacks (syncbn-unequal-counts: a syncbatchnorm1d).
Status ScenarioForRank(const Scenario& s, int rank, Scenario* out);
// The same transforms as they describe the user's model (used by the reference for each rank's copy).
Status ModelScenarioForRank(const Scenario& s, int rank, Scenario* out);
// Whether rank `rank`'s dropout generator gets rank 0's seed (same-dropout-seed).
bool SameDropoutSeed(const Scenario& s);

}  // namespace ddpcheck::core
