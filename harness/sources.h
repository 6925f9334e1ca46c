// Producing the traces a check compares: each Source kind run or read into a Trace (internal to harness/).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/dump.h"
#include "core/dump_protocol.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"
#include "harness/check.h"

namespace ddpcheck::harness {

struct Produced {
  core::Trace trace;
  std::string name;                            // the report's backend / against line
  nlohmann::json provenance = nlohmann::json::object();  // extras for the report's provenance
  std::optional<core::TorchDump> dump;         // kTorchDump: the whole dump (its evidence rules need it)
  std::optional<core::ProtocolResult> protocol;  // kTorchDump: the model-agnostic protocol check of its records
  std::optional<core::Scenario> scenario;      // what the source ran, when it carries its own (dump, stored)
};

// Runs or reads `src`. `s` (validated and materialised) is required for the kinds that run a scenario.
core::Status Produce(const Source& src, const core::Scenario* s, const CheckOptions& opts, Produced* out);

// The scenario a trace was recorded from (Check stamps it into the trace's metadata), or nullopt.
std::optional<core::Scenario> ScenarioFromMeta(const core::Trace& trace);
void StampScenario(const core::Scenario& unmaterialised, core::Trace* trace);

}  // namespace ddpcheck::harness
