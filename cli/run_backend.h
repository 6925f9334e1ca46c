// Backends of `ddpcheck run` beyond the CPU world's (sim, reference), registered by the parts of the build that
// provide them: real/ registers "real" (CUDA + NCCL) and "hybrid" (CUDA + Gloo) when CUDA and NCCL were found at
// configure time. `run` keeps its flags, terminal table and report files whatever the backend.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <string>

#include "cli/command.h"
#include "core/report.h"
#include "core/scenario.h"
#include "core/status.h"

namespace ddpcheck::cli {

struct RunBackendRequest {
  std::chrono::milliseconds timeout{0};  // every collective's; 0: the scenario's ddp.timeout_ms
  std::string math = "auto";             // fp32 GEMMs: auto | fp32 | tf32
  std::string dump_trace, dump_reference;
};

// Runs the validated scenario on the backend and on the reference and fills *report (as sim::RunCheck does).
// Non-OK only for bad input (a missing device included) or a broken backend.
using RunBackendFn = std::function<core::Status(core::Scenario, const RunBackendRequest&, core::RunReport*)>;

bool RegisterRunBackend(const std::string& name, RunBackendFn fn);
const std::map<std::string, RunBackendFn>& RunBackends();

}  // namespace ddpcheck::cli

#define DDPCHECK_REGISTER_RUN_BACKEND(name, fn) \
  static const bool DDPCHECK_CONCAT(kRunBackend_, __LINE__) = ::ddpcheck::cli::RegisterRunBackend(name, fn)
