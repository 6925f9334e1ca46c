// The diagnosis rule of BUGS.md's syncbn-unequal-counts (core/diagnose.cc calls it first when the model has a
// syncbatchnorm1d layer).
#pragma once

#include <optional>

#include "core/compare.h"
#include "core/report.h"
#include "core/scenario.h"
#include "core/trace.h"

namespace ddpcheck::core {

// Matches when, at the step of the first divergence m (a run without no_sync accumulation), the ranks' batch
// sizes differ and some syncbatchnorm1d layer with running statistics ends the step with the same running
// stats on every rank, different from the reference's, whose batch statistics (recovered from the update
// new = (1 - f) * old + f * stat, with old the step's forward buffers) equal the plain average of what the
// ranks all-gathered ("<layer>.gathered_stats", recorded by the training loop) and not the count-weighted
// merge. nullopt otherwise.
std::optional<Diagnosis> DiagnoseSyncBnMerge(const Scenario& s, const Trace& got, const Trace& ref, const Mismatch& m);

}  // namespace ddpcheck::core
