#include "core/faults.h"

namespace ddpcheck::core {

namespace {
bool Touches(const FaultSpec& f, int rank) { return f.rank < 0 || f.rank == rank; }
bool ActiveAt(const FaultSpec& f, int64_t step) { return f.step < 0 || step >= f.step; }
}  // namespace

RankFaults FaultsForRank(const Scenario& s, int rank) {
  RankFaults rf;
  rf.plan = DefaultPlanOptions(s);
  rf.world = s.world;
  rf.rank = rank;
  for (const auto& f : s.faults) {
    if (!Touches(f, rank)) continue;
    rf.active.push_back(f);
    if (f.name == "skip-set-epoch") rf.plan.set_epoch = false;
    if (f.name == "sampler-seed-per-rank") rf.plan.sampler_seed = s.sampler.seed + static_cast<uint64_t>(rank);
    if (f.name == "uneven-batches") rf.plan.drop_batches = 1;
  }
  return rf;
}

DdpFaults RankFaults::DdpAt(int64_t step) const {
  DdpFaults d;
  for (const auto& f : active) {
    if (!ActiveAt(f, step)) continue;
    if (f.name == "no-initial-broadcast") d.skip_initial_broadcast = true;
    if (f.name == "no-buffer-broadcast") d.skip_buffer_broadcast = true;
    if (f.name == "bypass-ddp") d.bypass = true;
    if (f.name == "drop-bucket") d.reducer.drop_bucket = 0;
  }
  return d;
}

double RankFaults::LossFactorAt(int64_t step) const {
  for (const auto& f : active) {
    if (f.name == "loss-times-world" && ActiveAt(f, step)) return world;
  }
  return 1.0;
}

bool RankFaults::SkipStepAt(int64_t step) const {
  for (const auto& f : active) {
    if (f.name == "skip-step" && (f.step < 0 ? step == 0 : step == f.step)) return true;
  }
  return false;
}

double RankFaults::ScalerInitFactor() const {
  for (const auto& f : active) {
    if (f.name == "scaler-state") return 2.0;
  }
  return 1.0;
}

bool RankFaults::ClipBeforeUnscaleAt(int64_t step) const {
  for (const auto& f : active) {
    if (f.name == "clip-before-unscale" && ActiveAt(f, step)) return true;
  }
  return false;
}

}  // namespace ddpcheck::core
