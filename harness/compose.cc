#include "harness/compose.h"

#include <algorithm>

#include "core/diagnose.h"
#include "core/dump_check.h"
#include "core/fault_spec.h"
#include "core/faults.h"
#include "reference/step_local.h"

namespace ddpcheck::harness {

namespace {

int64_t StepsOf(const core::Trace& t) {
  int64_t steps = 0;
  for (const auto& [key, v] : t.records()) {
    if (key.checkpoint == core::Checkpoint::kLr || key.checkpoint == core::Checkpoint::kParams) {
      steps = std::max(steps, key.step + 1);
    }
  }
  return steps;
}

void Frame(const Composition& c, core::RunReport* report) {
  const core::Trace& got = c.got->trace;
  report->backend = c.got->name;
  report->against = c.want ? c.want->name : "its own ranks";
  if (c.scenario) {
    const core::Scenario& s = *c.scenario;
    report->scenario = s.name;
    report->world = s.world;
    report->precision = s.precision;
    for (const auto& f : s.faults) report->faults.push_back(core::FaultSpecString(f));
  } else {
    report->scenario = got.meta.value("scenario", std::string("?"));
    report->world = got.meta.value("world", 1);
    core::ParseDType(got.meta.value("precision", std::string("float64")), &report->precision);
  }
  report->steps = std::max(StepsOf(got), c.want ? StepsOf(c.want->trace) : 0);
  nlohmann::json extra = {{"backend", c.got->name},
                          {"world", report->world},
                          {"precision", core::DTypeName(report->precision)},
                          {"scenario", report->scenario}};
  for (const auto& [k, v] : c.got->provenance.items()) extra[k] = v;
  report->provenance = core::Provenance(extra);
}

}  // namespace

// The step-local check (reference/step_local.h) judges a run under test (a recorded torch run, the CPU world, the
// GPU world in fp32 or fp64) against the float64 reference when its oracle is that reference, the arithmetic is not
// exact by construction and the scenario has rules (AMP without clipping). Its fallback for values without
// element-wise rules is the same policy at one step's budget. The GPU world's other modes keep their math mode's
// trajectory policy (harness/gpu.h): TF32 rounds every product's inputs to 10 bits, which the rules do not model,
// and under autocast the GPU world's arithmetic is not yet the rules' (on an H100 in session 16 every fp16/bf16
// row of gpu-report failed the replay at step 0: the loss 5e-4 off in bf16, BatchNorm's running_mean in
// fp16/bf16; docs/gpu.md, "Autocast on the GPU").
bool StepLocalApplies(const core::Scenario* scenario, SourceKind kind, const core::Trace& got,
                      const core::TolerancePolicy& policy, bool oracle_is_reference) {
  if (!scenario || policy.exact || !oracle_is_reference) return false;
  const bool stored_run =
      kind == SourceKind::kStoredTrace && got.meta.value("backend", std::string("reference")) != "reference";
  const bool gpu = kind == SourceKind::kGpu || kind == SourceKind::kHybrid;
  if (kind != SourceKind::kTorchDump && kind != SourceKind::kSim && !stored_run && !gpu) return false;
  // (GpuPolicy gives a TF32 run float16's roundoff.)
  if (gpu && (scenario->amp.enabled || policy.precision != scenario->precision)) return false;
  return ref::StepLocalSupported(*scenario);
}

core::Status Compose(const Composition& c, core::RunReport* report) {
  Frame(c, report);
  const core::Trace& got = c.got->trace;
  core::CompareResult result;
  if (c.want && c.step_local) {
    // Every step replayed in float64 from the state the run recorded at its start, with element-wise error
    // bounds (docs/tolerance.md): a 1e-4 relative error in float32 is caught at the step where it happens.
    // The replay computes what the oracle computes: the scenario with its faults turned into what they mean
    // (core::OracleScenario), as the whole-trajectory reference does.
    result = *c.step_local;
    report->against = c.want->name + ", step-local";
  } else if (c.want) {
    result = core::CompareTraces(got, c.want->trace, c.policy);
    if (c.bitwise && result.pass) {
      result.derivation = "bitwise: every value the run recorded is bitwise equal to the " + c.want->name +
                          "'s (which computes each step as the CPU world does, DDP's average in Gloo's ring order), so "
                          "no step needed the step-local replay's bounds";
      report->against = c.want->name + ", bitwise";
    }
  } else {
    result.derivation = "no oracle" + (report->replay_note.empty() ? "" : " (" + report->replay_note + ")") +
                        ": only DDP's invariants between ranks were checked";
  }
  result.Merge(core::CheckRankInvariants(got));
  result.Merge(core::CheckEvents(got));
  std::optional<core::Diagnosis> diagnosis;
  if (c.got->protocol) {
    const core::ProtocolResult& protocol = *c.got->protocol;
    result.Merge(protocol.result);
    report->protocol.ran = true;
    report->protocol.checked = protocol.checked;
    report->protocol.not_checked = protocol.skipped;
    report->protocol.reference = protocol.reference;
    if (!c.want) report->against = "its own ranks and the protocol check";
    if (!c.want && !protocol.reference_missing.empty()) {
      // A PASS says in its one line that the gradients were not held to a single process.
      report->against += " (" + protocol.reference_missing + ")";
    }
  }
  if (c.got->dump) {
    // A recorded run's own evidence rules (core/dump_check.h) and the protocol check's named findings come
    // first: the earliest step's pattern is the headline (the evidence rules win ties).
    auto finding = core::FindDumpPattern(*c.got->dump, c.want ? &c.want->trace : nullptr);
    const core::ProtocolResult* protocol = c.got->protocol ? &*c.got->protocol : nullptr;
    if (finding && protocol && (finding->diagnosis.pattern == "loss-times-world" ||
                                finding->diagnosis.pattern.rfind("loss-scale-per-rank", 0) == 0)) {
      // The replay's factor read from the reduced gradient, where the protocol check saw the reduction itself
      // differ from the mean of the recorded local buckets by then: the factor is the reduction's, not the loss's.
      for (const auto& m : protocol->result.mismatches) {
        if (m.against == core::kMeanOfLocalBuckets && m.key.step <= finding->mismatch.key.step) {
          finding.reset();
          diagnosis = core::Diagnosis{"unknown", m.kind, m.message};  // what the protocol check saw
          break;
        }
      }
    }
    if (protocol && protocol->diagnosis && protocol->result.first &&
        (!finding || protocol->result.first->key.step < finding->mismatch.key.step)) {
      result.first = protocol->result.first;
      diagnosis = protocol->diagnosis;
    } else if (finding) {
      result.Add(finding->mismatch);
      result.first = finding->mismatch;
      diagnosis = finding->diagnosis;
    }
  }
  if (c.got->dump && result.first) core::NameTheRankThatEdited(*c.got->dump, &*result.first);
  report->result = std::move(result);
  report->events = got.events();
  core::FillSeries(got, report);
  if (c.want) core::FillDivergenceMap(got, c.want->trace, c.policy, report);
  if (!diagnosis && c.scenario && c.want) {
    diagnosis = core::Diagnose(*c.scenario, got, c.want->trace, report->result);
  } else if (!diagnosis && c.got->dump && report->result.first) {
    // A recorded run checked by protocol only (no scenario to replay): the rules that need only its trace.
    diagnosis = core::DiagnoseInitialState(got, *report->result.first);
  }
  report->diagnosis = diagnosis;
  if (c.scenario && !c.scenario->faults.empty() && report->result.pass) {
    // An injected fault that left no trace is itself a finding: the harness must never miss one silently.
    core::Mismatch m;
    m.key = {0, core::Checkpoint::kInit, c.scenario->faults.front().name, core::kAllRanks};
    m.kind = "undetected";
    m.against = report->against;
    m.message = "fault " + c.scenario->faults.front().name + " was injected but no checkpoint diverged: the "
                "scenario does not exercise it (see scenarios/faults/ for one that does)";
    report->result.Add(m);
  }
  return core::Status::Ok();
}

}  // namespace ddpcheck::harness
