// Fault specs: "NAME[@RANK][:STEP]" as given on the command line (--fault) and in a scenario's "faults" list.
// NAME is one of the 22 fault names of BUGS.md (e.g. "skip-set-epoch", "bypass-ddp@1", "drop-bucket@2:3").
#pragma once

#include <string>
#include <vector>

#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::core {

// One row of BUGS.md: the catalog the injector accepts and the diagnosis names.
struct FaultInfo {
  const char* name;
  const char* shows_at;     // where a correct harness first sees it
  const char* kind;         // "rank-divergent", "reference-divergent", "hang", "finding"
  const char* description;  // what the user did wrong
};
const std::vector<FaultInfo>& FaultCatalog();
const FaultInfo* FindFault(const std::string& name);

// The 22 fault names of BUGS.md, in its row order.
const std::vector<std::string>& KnownFaultNames();
bool IsKnownFaultName(const std::string& name);

// Parses "NAME[@RANK][:STEP]" into *out (rank -1 and step -1 when absent). RANK and STEP are non-negative
// decimal integers. Errors are InvalidArgument without a location prefix, e.g.
//   "unknown fault 'skip-setepoch'; did you mean 'skip-set-epoch'?"
//   "fault 'bypass-ddp@x': rank must be a non-negative integer, got 'x'"
// Whether the rank is below the world size is checked by ValidateScenario.
Status ParseFaultSpec(const std::string& text, FaultSpec* out);

// The spec written back as "NAME[@RANK][:STEP]".
std::string FaultSpecString(const FaultSpec& f);

}  // namespace ddpcheck::core
