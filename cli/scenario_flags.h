// Flags that override a scenario's fields, shared by `run` (and later `launch`, `gpu-report`).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::cli {

struct ScenarioFlags {
  std::string path;  // empty: the default scenario
  std::optional<int> world;
  std::optional<int64_t> epochs, steps, batch_size;
  std::optional<std::string> precision;
  std::optional<std::string> amp;
  std::vector<std::string> faults;
  bool no_faults = false;

  void Add(CLI::App* app);
  // Loads the scenario (or the default), applies the overrides, validates.
  core::Status Resolve(core::Scenario* out) const;
};

}  // namespace ddpcheck::cli
