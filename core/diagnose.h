// Diagnose: match a run's first divergence (and the evidence around it) to a BUGS.md pattern.
#pragma once

#include <optional>

#include "core/compare.h"
#include "core/report.h"
#include "core/scenario.h"
#include "core/trace.h"

namespace ddpcheck::core {

// Decides from the evidence in the traces alone (never from the name of an injected fault). nullopt when the
// run passed; pattern "unknown" when no evidence rule matches.
std::optional<Diagnosis> Diagnose(const Scenario& s, const Trace& got, const Trace& reference,
                                  const CompareResult& result);

// The rule for a rank-divergent initial value (checkpoint init), which needs only the run's trace: a parameter
// that differs between ranks before the first step is no-initial-broadcast, a buffer (running statistics) while
// the parameters agree buffer-outside-ddp. nullopt when `m` is not such a mismatch. Diagnose applies it; a
// recorded run checked without a scenario (protocol only) gets it on its own.
std::optional<Diagnosis> DiagnoseInitialState(const Trace& got, const Mismatch& m);

}  // namespace ddpcheck::core
