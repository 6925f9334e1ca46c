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

}  // namespace ddpcheck::core
