// RunCheck: the main job. Runs a scenario on the reference and (unless the backend is the reference) on the CPU
// world, compares them (rank invariants, events, equivalence with the derived tolerance), diagnoses the first
// divergence against BUGS.md, and returns the report. Used by `ddpcheck run`, the tests and the properties.
#pragma once

#include <string>

#include "core/report.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"
#include "sim/world.h"

namespace ddpcheck::sim {

struct CheckOptions {
  std::string backend = "sim";  // "sim" | "reference"
  SimOptions sim;
  std::string dump_trace;      // folder for the backend's trace ("" = none)
  std::string dump_reference;  // folder for the reference's trace
};

// `s` must be validated; its data is materialised here. Returns non-OK only for bad input or a broken backend;
// divergences are in report->result (report->ExitCode() is the verdict).
core::Status RunCheck(core::Scenario s, const CheckOptions& opts, core::RunReport* report,
                      core::Trace* backend_trace = nullptr, core::Trace* reference_trace = nullptr);

// Compare two traces (of one scenario): invariants and events of `got`, and `got` against `want`.
core::CompareResult CompareRun(const core::Trace& got, const core::Trace& want, const core::TolerancePolicy& policy);

}  // namespace ddpcheck::sim
