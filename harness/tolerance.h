// The tolerance policy of a check, chosen in one place for every kind of run under test: the CPU world and
// the reference (core::PolicyFor), the GPU world (the GEMMs' math mode: harness/gpu.h), a recorded torch run
// (torch's kernels block and fuse differently from the reference), and stored traces (what their metadata
// says). The derivation of each is printed in the reports.
#pragma once

#include "core/compare.h"
#include "core/scenario.h"
#include "core/trace.h"
#include "harness/check.h"

namespace ddpcheck::harness {

// The policy for comparing a run of kind `got` on scenario `s` with its oracle.
core::TolerancePolicy PolicyFor(SourceKind got, const core::Scenario& s, bool tf32);
// Two stored traces with no scenario in their metadata: exact when both were recorded as exact, else the
// budget of the precision, world and reduction length `want` recorded.
core::TolerancePolicy PolicyFromMeta(const core::Trace& got, const core::Trace& want);
// What a trace records about the policy it was made under, so `diff` can use the same one later.
void StampPolicy(const core::TolerancePolicy& policy, core::Trace* trace);

}  // namespace ddpcheck::harness
