// Diagnose: match a run's first divergence (and the evidence around it) to a BUGS.md pattern.
#pragma once

#include <optional>

#include "core/compare.h"
#include "core/report.h"
#include "core/scenario.h"
#include "core/trace.h"

namespace ddpcheck::core {

// nullopt when the run passed and no fault was injected, or when no pattern matches.
std::optional<Diagnosis> Diagnose(const Scenario& s, const Trace& got, const Trace& reference,
                                  const CompareResult& result);

}  // namespace ddpcheck::core
