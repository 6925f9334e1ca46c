// Step-local replay: every step of a run under test replayed on the float64 reference from the state the run
// itself recorded at that step's start (parameters and buffers after the previous step, or the initial state;
// optimizer state "opt.<state>.<param>" as tools/ddpcheck_torch.py records it, else the replay's own; Adam's step count from the
// steps that had a gradient), with running-error bounds (reference/error_bounds.h) for every value. Comparing
// the run's step s with this replay's step s checks one step's arithmetic only: the budget does not grow
// with s, and the first divergence is the step where the run went wrong. The recorded state at the start of
// step s is itself checked, as step s-1's result.
//
// The check a harness composes: CheckStepLocal(scenario, recorded trace, fallback policy, &result), where the
// fallback policy (core::PolicyFor / core::DumpPolicy, at one step's budget) judges the values without an
// element-wise bound (forward buffers).
#pragma once

#include "core/compare.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"

namespace ddpcheck::ref {

// Whether ReplayStepLocal supports the scenario: no AMP, or AMP without gradient clipping (the replay emulates autocast's roundings in float64, reference/error_bounds.h bounds them; a
// GradScaler's state at each step's start is the run's record of the step before, kScaler "scale" and
// "growth_tracker"); the harness uses the normwise policy otherwise. SyncBatchNorm layers are bounded over
// every rank's rows (GroupMicroBatchErrorBounds).
bool StepLocalSupported(const core::Scenario& s);

// `s` with its data materialised. *values: the float64 reference's values of each step from the recorded
// state, keyed as RunReference keys them, plus the optimizer state "opt.<state>.<param>" (kParams, kAllRanks).
// *bounds: the same keys (where the analysis has rules) holding each value's absolute error bound for a run in
// s.precision (plus the float64 replay's own rounding).
core::Status ReplayStepLocal(const core::Scenario& s, const core::Trace& recorded, core::Trace* values,
                             core::Trace* bounds);

// ReplayStepLocal and core::CompareTraces(recorded, values, fallback, bounds, 0) into *result, with the
// derivation of the element-wise bounds, compared step by step as the replay goes (each step's values and
// bounds are dropped once compared). *values (optional) receives the replay.
core::Status CheckStepLocal(const core::Scenario& s, const core::Trace& recorded, const core::TolerancePolicy& fallback,
                            core::CompareResult* result, core::Trace* values = nullptr);

}  // namespace ddpcheck::ref
