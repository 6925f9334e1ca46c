// Fault guide: for each BUGS.md pattern of the fault catalog (core/fault_spec.h), what a user sees, what to
// change in the training script (one "how to fix" line plus a before/after snippet of the usual mistake), and
// the scenario that reproduces it. Reports print the fix under a diagnosis; `ddpcheck faults` prints the guide;
// docs/bugs.md is FaultGuideMarkdown() (tests/fault_guide_test.cc keeps the two equal).
#pragma once

#include <string>
#include <vector>

#include "core/fault_spec.h"

namespace ddpcheck::core {

struct FaultGuide {
  const char* name;
  const char* symptom;  // what the user sees in their own run
  const char* fix;      // one line: what to change
  const char* before;   // the usual mistake (Python, a few lines)
  const char* after;    // the same lines, fixed
};

// The guide of a catalog fault or of a recorded-run pattern, or nullptr for an unknown name.
const FaultGuide* FindFaultGuide(const std::string& name);

// Patterns that only the protocol check of a recorded PyTorch run names (core/dump_protocol.h): no scenario
// injects them. kind and shows_at as in FaultInfo.
struct RecordedPattern {
  const char* name;
  const char* kind;
  const char* shows_at;
  const char* description;
};
const std::vector<RecordedPattern>& RecordedPatterns();

// The scenario under scenarios/faults/ that reproduces the fault, relative to the repository root.
std::string FaultScenarioPath(const std::string& name);

// One fault as plain text (`ddpcheck faults NAME`): kind, where it shows, symptom, cause, fix, snippet, scenario.
std::string FormatFaultGuide(const FaultInfo& info);

// docs/bugs.md: every fault of the catalog, in catalog order.
std::string FaultGuideMarkdown();

}  // namespace ddpcheck::core
