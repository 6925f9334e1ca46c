#include "sim/check.h"

#include "core/diagnose.h"
#include "core/fault_spec.h"
#include "core/train_loop.h"
#include "reference/trainer.h"

namespace ddpcheck::sim {

core::CompareResult CompareRun(const core::Trace& got, const core::Trace& want, const core::TolerancePolicy& policy) {
  core::CompareResult result = core::CompareTraces(got, want, policy);
  result.Merge(core::CheckRankInvariants(got));
  result.Merge(core::CheckEvents(got));
  return result;
}

core::Status RunCheck(core::Scenario s, const CheckOptions& opts, core::RunReport* report, core::Trace* backend_trace,
                      core::Trace* reference_trace) {
  DDPCHECK_RETURN_IF_ERROR(core::MaterializeData(&s));
  const core::TolerancePolicy policy = core::PolicyFor(s);
  core::Trace ref;
  DDPCHECK_RETURN_IF_ERROR(ref::RunReference(s, &ref));
  ref.meta["exact"] = policy.exact;
  ref.meta["reduction_length"] = policy.reduction_length;
  if (!opts.dump_reference.empty()) DDPCHECK_RETURN_IF_ERROR(ref.Write(opts.dump_reference));

  report->scenario = s.name;
  report->world = s.world;
  report->precision = s.precision;
  for (const auto& f : s.faults) report->faults.push_back(core::FaultSpecString(f));
  report->provenance = core::Provenance({{"backend", opts.backend == "sim" ? "sim/" + opts.sim.comm : opts.backend},
                                         {"world", s.world},
                                         {"precision", core::DTypeName(s.precision)},
                                         {"scenario", s.name}});
  int64_t steps = 0;
  for (const auto& [key, v] : ref.records()) {
    if (key.checkpoint == core::Checkpoint::kLr) steps = std::max(steps, key.step + 1);
  }
  report->steps = steps;

  if (opts.backend == "reference") {
    report->backend = "reference";
    report->against = "itself";
    report->result.derivation = policy.Derivation();
    core::FillSeries(ref, report);
    if (!opts.dump_trace.empty()) DDPCHECK_RETURN_IF_ERROR(ref.Write(opts.dump_trace));
    if (reference_trace) *reference_trace = ref;
    return core::Status::Ok();
  }

  core::Trace got;
  core::Status finding;
  DDPCHECK_RETURN_IF_ERROR(RunSim(s, opts.sim, &got, &finding));
  got.meta["exact"] = policy.exact;
  got.meta["reduction_length"] = policy.reduction_length;
  if (!opts.dump_trace.empty()) DDPCHECK_RETURN_IF_ERROR(got.Write(opts.dump_trace));
  report->backend = "sim (" + opts.sim.comm + ")";
  report->against = "reference";
  report->result = CompareRun(got, ref, policy);
  report->events = got.events();
  core::FillSeries(got, report);
  core::FillDivergenceMap(got, ref, policy, report);
  report->diagnosis = core::Diagnose(s, got, ref, report->result);
  if (!report->diagnosis.has_value() && !s.faults.empty() && report->result.pass) {
    // An injected fault that left no trace is itself a finding: the harness must never miss one silently.
    core::Mismatch m;
    m.key = {0, core::Checkpoint::kInit, s.faults.front().name, core::kAllRanks};
    m.kind = "undetected";
    m.against = "reference";
    m.message = "fault " + s.faults.front().name + " was injected but no checkpoint diverged: the scenario does not "
                "exercise it (see scenarios/faults/ for one that does)";
    report->result.Add(m);
  }
  if (backend_trace) *backend_trace = std::move(got);
  if (reference_trace) *reference_trace = std::move(ref);
  return core::Status::Ok();
}

}  // namespace ddpcheck::sim
