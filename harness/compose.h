// Compose: the comparison and the report of a check, once its traces exist (internal to harness/; Check and
// CheckAsRank both end here). Rank invariants and events of the run under test, the run against the oracle
// under the policy, a torch dump's own evidence rules, the diagnosis (from the traces alone, never from the
// name of an injected fault), the series and divergence map, and the report's frame.
#pragma once

#include "core/compare.h"
#include "core/report.h"
#include "core/scenario.h"
#include "harness/sources.h"

namespace ddpcheck::harness {

struct Composition {
  const core::Scenario* scenario = nullptr;  // null for stored traces that carry none (no diagnosis then)
  const Produced* got = nullptr;
  SourceKind kind = SourceKind::kSim;  // what produced `got`
  const Produced* want = nullptr;  // null: no oracle (invariants only)
  core::TolerancePolicy policy;
  // The step-local check's result, where it applies (StepLocalApplies; Finish runs it); null: the run is compared
  // with the oracle's trace.
  const core::CompareResult* step_local = nullptr;
  // The run is bitwise equal to the oracle at every checkpoint (core::BitwiseAgrees): judged by that, without a
  // replay (Finish).
  bool bitwise = false;
};

// Whether the run is judged by the step-local replay (reference/step_local.h) against an oracle that is the
// float64 reference (`oracle_is_reference`): a recorded torch run, a CPU world, a GPU world in fp32 or fp64, or a stored run's trace, whose
// arithmetic is not exact by construction, with a scenario the replay has rules for.
bool StepLocalApplies(const core::Scenario* scenario, SourceKind kind, const core::Trace& got,
                      const core::TolerancePolicy& policy, bool oracle_is_reference);

core::Status Compose(const Composition& c, core::RunReport* report);

// Finishes a check whose run under test has been produced: the oracle, the policy, dumps of both traces,
// Compose, and the cross-checks (harness/check.cc).
core::Status Finish(const std::optional<core::Scenario>& s, Produced got, const CheckOptions& opts,
                    core::RunReport* report, core::Trace* got_trace, core::Trace* want_trace);

}  // namespace ddpcheck::harness
