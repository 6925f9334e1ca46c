#include "harness/check.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "core/compare.h"
#include "core/diagnose.h"
#include "core/dump_check.h"
#include "core/faults.h"
#include "core/fault_spec.h"
#include "core/finite.h"
#include "core/model_spec.h"
#include "core/train_loop.h"
#include "harness/compose.h"
#include "harness/sources.h"
#include "harness/tolerance.h"
#include "reference/step_local.h"

namespace ddpcheck::harness {

namespace {

// The oracle of a check: a stored trace or another world when asked, else the scenario's reference.
core::Status ProduceWant(const core::Scenario* s, const CheckOptions& opts, Produced* want) {
  const Source src = opts.want.value_or(Source{SourceKind::kReference, ""});
  if (src.kind == SourceKind::kReference && s && opts.oracle_precision) {
    // An AMP run's oracle in a wider precision keeps its GradScaler (the run's local and reduced gradients are
    // scaled) and autocast's overflow, not its roundings (AmpSpec::range_only).
    core::Scenario at = *s;
    at.precision = *opts.oracle_precision;
    at.amp.range_only = at.amp.enabled;
    DDPCHECK_RETURN_IF_ERROR(Produce(src, &at, opts, want));
    want->name = "reference (" + core::DTypeName(at.precision) + ")";
    return core::Status::Ok();
  }
  DDPCHECK_RETURN_IF_ERROR(Produce(src, s, opts, want));
  if (src.kind == SourceKind::kReference && s) want->name = "reference";
  return core::Status::Ok();
}

}  // namespace

core::Status Finish(const std::optional<core::Scenario>& scenario, Produced got, const CheckOptions& opts,
                    core::RunReport* report, core::Trace* got_trace, core::Trace* want_trace) {
  // A run that ended early (a lost rank, a timeout: its trace has events) is checked as far as it got and one
  // step beyond (where a rank that stopped is reported missing): the oracle and the replay do not compute the
  // steps no rank reached (a run of --steps 2000 that lost a rank at step 150 would otherwise wait for 2000
  // reference steps before its verdict).
  std::optional<core::Scenario> s = scenario;
  if (s && !got.trace.events().empty() && !got.trace.records().empty()) {
    int64_t last = got.trace.records().rbegin()->first.step;  // records are ordered by step first
    for (const auto& e : got.trace.events()) last = std::max(last, e.step);
    if (s->steps < 0 || s->steps > last + 2) s->steps = last + 2;
  }
  const bool has_oracle = opts.replay && (opts.want.has_value() || s.has_value());
  // The policy a scenario gives; without one it is read from the traces' metadata once the oracle exists.
  std::optional<core::TolerancePolicy> scenario_policy;
  if (s) scenario_policy = PolicyFor(opts.got.kind, *s, opts.tf32);
  // The step-local check (StepLocalApplies) replays the run from its own trace. Against the scenario's reference
  // it runs before that reference is computed, which then reuses the memory the replay freed (a 10M-parameter
  // check touched 1.4 GB less, bench/README.md); against a stored reference trace, once that is read.
  std::optional<core::CompareResult> replayed;
  auto replay = [&](const core::TolerancePolicy& policy) {
    replayed.emplace();
    return ref::CheckStepLocal(core::OracleScenario(*s), got.trace, policy, &*replayed).Prefixed("step-local replay");
  };
  const bool scenario_reference = !opts.want.has_value() || opts.want->kind == SourceKind::kReference;
  const bool replay_first = has_oracle && scenario_reference && scenario_policy &&
                            StepLocalApplies(&*s, opts.got.kind, got.trace, *scenario_policy, /*oracle_is_reference=*/true);
  // The CPU world computes each step as the scenario's reference does (the same kernels; DDP's average in Gloo's
  // ring order, reference/trainer.cc): a world bitwise equal to it at every checkpoint did exactly what the
  // single process did, and needs no replay. Its reference comes first; the replay below runs where they differ.
  const bool reference_first = replay_first && opts.got.kind == SourceKind::kSim;
  if (replay_first && !reference_first) {
    StampPolicy(*scenario_policy, &got.trace);
    DDPCHECK_RETURN_IF_ERROR(replay(*scenario_policy));
  }
  Produced want;
  if (has_oracle) {
    // The reference computes much as the run did (a CPU world's values, bitwise): those values are held once, for
    // the two traces.
    want.trace.SetTwinSource(&got.trace);
    const core::Status st = ProduceWant(s ? &*s : nullptr, opts, &want).Prefixed("oracle");
    want.trace.SetTwinSource(nullptr);
    DDPCHECK_RETURN_IF_ERROR(st);
  }
  const bool bitwise = reference_first && core::BitwiseAgrees(got.trace, want.trace);
  const core::TolerancePolicy policy =
      scenario_policy ? *scenario_policy : PolicyFromMeta(got.trace, want.trace);
  if (s) {
    StampPolicy(policy, &got.trace);
    StampPolicy(policy, &want.trace);
  }
  const bool want_is_reference = want.name.rfind("reference", 0) == 0 ||
                                 want.trace.meta.value("backend", std::string()) == "reference";
  if (has_oracle && !replayed && !bitwise &&
      StepLocalApplies(s ? &*s : nullptr, opts.got.kind, got.trace, policy, want_is_reference)) {
    DDPCHECK_RETURN_IF_ERROR(replay(policy));
  }
  if (!opts.dump_trace.empty()) DDPCHECK_RETURN_IF_ERROR(got.trace.Write(opts.dump_trace).Prefixed("--dump-trace"));
  if (has_oracle && !opts.dump_reference.empty()) {
    DDPCHECK_RETURN_IF_ERROR(want.trace.Write(opts.dump_reference).Prefixed("--dump-reference"));
  }

  Composition c;
  c.scenario = s ? &*s : nullptr;
  c.got = &got;
  c.kind = opts.got.kind;
  c.want = has_oracle ? &want : nullptr;
  c.policy = policy;
  c.step_local = replayed ? &*replayed : nullptr;
  c.bitwise = bitwise;
  DDPCHECK_RETURN_IF_ERROR(Compose(c, report));
  // A world that agreed with its reference while its values went to NaN or inf (an lr of 1e18: the single process
  // blows up the same way, bitwise) is not a PASS: a finding, as for a recorded run or a stored trace (QA round 16).
  // AMP's skipped steps are exempt. A run that failed already keeps its first divergence and diagnosis.
  if (report->pass() && (opts.got.kind == SourceKind::kSim || opts.got.kind == SourceKind::kGpu ||
                         opts.got.kind == SourceKind::kHybrid)) {
    // The losses and the last parameters say it: a NaN or inf parameter stays non-finite once there, and a scan of
    // the losses and one step's parameters keeps the whole check's cost (a 10M-parameter world's trace is GBs).
    core::Trace vital;
    int64_t last = -1;
    for (const auto& [key, t] : got.trace.records()) {
      if (key.checkpoint == core::Checkpoint::kParams) last = std::max(last, key.step);
    }
    for (const auto& [key, t] : got.trace.records()) {
      if (key.checkpoint == core::Checkpoint::kLoss || key.checkpoint == core::Checkpoint::kScaler ||
          (key.checkpoint == core::Checkpoint::kParams && key.step == last)) {
        vital.AddShared(key, t.ptr());
      }
    }
    DDPCHECK_RETURN_IF_ERROR(core::CheckFinite(vital, got.name));
  }
  // A PASS over no step of a recording that holds steps checked nothing (QA round 16: rank indexes whose Join
  // rounds disagreed at every step left none in common, and the verdict read "PASS ... of 0 steps").
  if (report->pass() && report->steps == 0 && got.dump) {
    int64_t recorded = got.dump->join_steps_dropped;  // (steps Join left unchecked are no longer in the indexes)
    for (const auto& r : got.dump->ranks) recorded += r.steps;
    if (recorded > 0) {
      return core::Status::Invalid(fmt::format(
          "{}: none of the {} step(s) the ranks recorded could be checked{}; nothing to judge: re-record the run "
          "(every rank's index.json from the same run, unedited)", opts.got.path, recorded,
          report->replay_note.empty() ? "" : " (" + report->replay_note + ")"));
    }
  }

  for (const Source& extra : opts.cross_checks) {
    Produced other;
    DDPCHECK_RETURN_IF_ERROR(Produce(extra, s ? &*s : nullptr, opts, &other).Prefixed("cross-check"));
    core::CompareResult r = has_oracle ? core::CompareTraces(other.trace, want.trace, policy) : core::CompareResult{};
    r.Merge(core::CheckRankInvariants(other.trace));
    r.Merge(core::CheckEvents(other.trace));
    core::RunReport::CrossCheck cc;
    cc.name = other.name + " vs " + (has_oracle ? want.name : std::string("its own ranks"));
    cc.pass = r.pass;
    if (r.first) cc.first = core::DescribeMismatch(*r.first);
    report->cross_checks.push_back(cc);
  }
  if (got_trace) *got_trace = std::move(got.trace);
  if (want_trace) *want_trace = std::move(want.trace);
  return core::Status::Ok();
}

namespace {

// A world keeps every step's records until the comparison (about (W + 2) x the model's elements per step, plus
// about 4 KB per tensor and rank of records, report cells and charts: 72 KB a step for a 9-tensor model at W=2;
// 2 KB counted): a run whose trace cannot fit the memory this machine has available is
// refused before it starts (QA round 16: 2^20 epochs of the default scenario grew by 170 MB/s toward the OOM
// killer). A lower bound: the run is refused only where it could not have finished.
core::Status TraceFitsMemory(const core::Scenario& s) {
  int64_t elements = 0, tensors = 0;
  for (const auto& p : core::ModelParameters(s.model)) elements += core::NumelOf(p.shape), ++tensors;
  for (const auto& b : core::ModelBuffers(s.model)) elements += core::NumelOf(b.shape), ++tensors;
  const int64_t w = std::max(1, s.world), batch = std::max<int64_t>(1, s.batch_size);
  const int64_t per_rank = (s.data.samples + w - 1) / w;
  const double micro = static_cast<double>(s.epochs) * static_cast<double>((per_rank + batch - 1) / batch);
  double steps = std::floor(micro / static_cast<double>(std::max<int64_t>(1, s.ddp.no_sync_steps)));
  if (s.steps > 0) steps = std::min(steps, static_cast<double>(s.steps));
  const double bytes = steps * (static_cast<double>(w + 2) * static_cast<double>(elements) * 8.0 +
                                static_cast<double>(w * tensors) * 2048.0);
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (meminfo >> key) {
    if (key == "MemAvailable:") {
      meminfo >> kib;
      break;
    }
    meminfo.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  if (kib <= 0 || bytes <= kib * 1024.0) return core::Status::Ok();
  return core::Status::Invalid(fmt::format(
      "the run would keep at least {:.1f} GiB of records ({:.0f} optimizer steps x {} ranks x {} model elements), "
      "more than the {:.1f} GiB this machine has available: run fewer steps (--steps, /steps) or epochs (/epochs)",
      bytes / 1073741824.0, steps, w, elements, kib / 1048576.0));
}

}  // namespace

core::Status Check(std::optional<core::Scenario> s, const CheckOptions& opts, core::RunReport* report,
                   core::Trace* got_trace, core::Trace* want_trace) {
  Produced got;
  const bool carries_scenario = opts.got.kind == SourceKind::kTorchDump || opts.got.kind == SourceKind::kStoredTrace;
  if (carries_scenario) {
    DDPCHECK_RETURN_IF_ERROR(Produce(opts.got, nullptr, opts, &got));
    // A dump the replay cannot rebuild (any nn.Module, no DistributedSampler...) carries no usable scenario:
    // its check is the rank invariants and the protocol check, framed from the trace's metadata.
    const bool unreplayable = got.dump && !got.dump->replay_unsupported.empty();
    if (!s && !unreplayable) s = got.scenario;
  }
  if (s) DDPCHECK_RETURN_IF_ERROR(core::MaterializeData(&*s));
  if (s && !carries_scenario) DDPCHECK_RETURN_IF_ERROR(TraceFitsMemory(*s));
  if (!carries_scenario) DDPCHECK_RETURN_IF_ERROR(Produce(opts.got, s ? &*s : nullptr, opts, &got));
  if (s && !got.trace.meta.contains("scenario_spec")) StampScenario(*s, &got.trace);
  CheckOptions o = opts;
  if (got.dump && !got.dump->replay_unsupported.empty()) {
    o.replay = false;
    report->replay_note = got.dump->replay_unsupported;
  } else if (!opts.replay) {
    report->replay_note = "--no-replay";
  }
  if (!o.replay) o.cross_checks.clear();
  return Finish(s, std::move(got), o, report, got_trace, want_trace);
}

}  // namespace ddpcheck::harness
