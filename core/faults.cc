#include "core/faults.h"

#include <algorithm>

namespace ddpcheck::core {

namespace {

// Catalog rows written NAME@R in BUGS.md: without an explicit rank they hit the last rank only.
bool IsPerRankFault(const std::string& name) {
  static const char* kPerRank[] = {"buffer-outside-ddp", "bypass-ddp", "different-forward-path", "scaler-state",
                                   "skip-step",          "uneven-batches", "param-order",         "drop-bucket"};
  return std::any_of(std::begin(kPerRank), std::end(kPerRank), [&](const char* n) { return name == n; });
}

int ResolvedRank(const FaultSpec& f, int world) {
  if (f.rank >= 0) return f.rank;
  return IsPerRankFault(f.name) ? world - 1 : -1;
}

bool ActiveAt(const FaultSpec& f, int64_t step) { return f.step < 0 || step >= f.step; }

}  // namespace

bool ScenarioHasFault(const Scenario& s, const std::string& name) {
  return std::any_of(s.faults.begin(), s.faults.end(), [&](const FaultSpec& f) { return f.name == name; });
}

bool UnevenSplit(const Scenario& s) {
  return s.sampler.uneven_split || ScenarioHasFault(s, "uneven-shard-mean") ||
         ScenarioHasFault(s, "syncbn-unequal-counts");
}

PlanOptions SetupPlanOptions(const Scenario& s, int rank) {
  PlanOptions o = DefaultPlanOptions(s);
  // The user split the data unevenly, so ranks other than 0 have one sample fewer.
  if (UnevenSplit(s) && rank > 0) o.trim_last_sample = true;
  return o;
}

Scenario OracleScenario(const Scenario& s) {
  Scenario o = s;
  o.faults.clear();
  o.sampler.uneven_split = UnevenSplit(s);
  o.global_batch_mean = s.global_batch_mean || ScenarioHasFault(s, "uneven-shard-mean");
  for (const auto& f : s.faults) {
    if (f.name != "unused-param" && f.name != "different-forward-path") continue;
    int layer = -1;  // the last Linear with in == out, as ScenarioForRank picks it
    for (size_t i = 0; i < s.model.size(); ++i) {
      if (s.model[i].type == "linear" && s.model[i].in_features == s.model[i].out_features) layer = static_cast<int>(i);
    }
    if (layer < 0) continue;  // ScenarioForRank refuses such a scenario before any run
    LayerSpec& spec = o.model[static_cast<size_t>(layer)];
    const int target = ResolvedRank(f, s.world);
    spec.unused = true;
    if (target >= 0) spec.unused_on_ranks.push_back(target);
  }
  return o;
}

RankFaults FaultsForRank(const Scenario& s, int rank) {
  RankFaults rf;
  rf.plan = SetupPlanOptions(s, rank);
  rf.world = s.world;
  rf.rank = rank;
  rf.no_sync_steps = std::max<int64_t>(1, s.ddp.no_sync_steps);
  for (FaultSpec f : s.faults) {
    const int target = ResolvedRank(f, s.world);
    if (f.name == "buffer-outside-ddp") rf.buffers_outside = true;
    if (target >= 0 && target != rank) continue;
    f.rank = target;
    rf.active.push_back(f);
    if (f.name == "skip-set-epoch") rf.plan.set_epoch = false;
    if (f.name == "sampler-seed-per-rank") rf.plan.sampler_seed = s.sampler.seed + static_cast<uint64_t>(rank);
    if (f.name == "uneven-batches") rf.plan.drop_batches = 1;
  }
  return rf;
}

bool RankFaults::Has(const std::string& name) const {
  return std::any_of(active.begin(), active.end(), [&](const FaultSpec& f) { return f.name == name; });
}

DdpFaults RankFaults::DdpAt(int64_t step) const {
  DdpFaults d;
  d.buffers_outside = buffers_outside;
  for (const auto& f : active) {
    if (!ActiveAt(f, step)) continue;
    if (f.name == "no-initial-broadcast") d.skip_initial_broadcast = true;
    if (f.name == "no-buffer-broadcast") d.skip_buffer_broadcast = true;
    if (f.name == "buffer-outside-ddp") d.perturb_buffers = true;
    if (f.name == "bypass-ddp") d.bypass = true;
    if (f.name == "param-order") d.reversed_param_order = true;
    if (f.name == "drop-bucket") d.reducer.drop_bucket = 0;
    if (f.name == "nosync-unused") d.reducer.forget_nosync_usage = true;
  }
  return d;
}

double RankFaults::LossFactorAt(int64_t step) const {
  for (const auto& f : active) {
    if (!ActiveAt(f, step)) continue;
    if (f.name == "loss-times-world") return world;
    if (f.name == "grad-accum-normalisation") return no_sync_steps > 1 ? 1.0 / static_cast<double>(no_sync_steps) : 1.0 / world;
  }
  return 1.0;
}

double RankFaults::LrFactorAt(int64_t step) const {
  for (const auto& f : active) {
    if (f.name == "lr-not-scaled" && ActiveAt(f, step)) return 1.0 / world;
  }
  return 1.0;
}

bool RankFaults::SkipStepAt(int64_t step) const {
  for (const auto& f : active) {
    if (f.name == "skip-step" && (f.step < 0 ? step == 0 : step == f.step)) return true;
  }
  return false;
}

bool RankFaults::CountEvalPadding() const { return Has("eval-padding-counted"); }

double RankFaults::ScalerInitFactor() const { return Has("scaler-state") ? 2.0 : 1.0; }

bool RankFaults::ClipBeforeUnscaleAt(int64_t step) const {
  for (const auto& f : active) {
    if (f.name == "clip-before-unscale" && ActiveAt(f, step)) return true;
  }
  return false;
}

Status ModelScenarioForRank(const Scenario& s, int rank, Scenario* out) { return ScenarioForRank(s, rank, out); }

bool SameDropoutSeed(const Scenario& s) { return ScenarioHasFault(s, "same-dropout-seed"); }

Status ScenarioForRank(const Scenario& s, int rank, Scenario* out) {
  *out = s;
  if (ScenarioHasFault(s, "syncbn-unequal-counts") &&
      std::none_of(s.model.begin(), s.model.end(), [](const LayerSpec& l) { return l.type == "syncbatchnorm1d"; })) {
    return Status::Invalid("/faults: fault syncbn-unequal-counts needs a syncbatchnorm1d layer in the model (it corrupts "
                           "SyncBatchNorm's merge of the ranks' statistics); this scenario has none: turn a "
                           "batchnorm1d into {\"type\": \"syncbatchnorm1d\", ...}, or drop the fault");
  }
  for (size_t k = 0; k < s.faults.size(); ++k) {
    const auto& f = s.faults[k];
    if (f.name != "unused-param" && f.name != "different-forward-path") continue;
    const int target = ResolvedRank(f, s.world);
    if (f.name == "unused-param" && target >= 0 && target != rank) continue;
    if (f.name == "different-forward-path" && target != rank) continue;
    // The last Linear with in == out and parameters: bypassing it keeps shapes (a branch not taken).
    int layer = -1;
    for (size_t i = 0; i < s.model.size(); ++i) {
      const auto& l = s.model[i];
      if (l.type == "linear" && l.in_features == l.out_features) layer = static_cast<int>(i);
    }
    if (layer < 0) {
      return Status::Invalid("/faults/" + std::to_string(k) + ": fault " + f.name + " needs a Linear layer with in == "
                             "out in the model (it is skipped as a branch not taken); this scenario has none: add "
                             "one, or drop the fault");
    }
    auto& spec = out->model[static_cast<size_t>(layer)];
    spec.unused = true;
    spec.unused_on_ranks.clear();  // this rank's copy: unused here
  }
  return Status::Ok();
}

}  // namespace ddpcheck::core
