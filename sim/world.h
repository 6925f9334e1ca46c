// The CPU world: W ranks as threads in this process, each with its own CpuReplica and Communicator (real
// Gloo over TCP on loopback with an in-process HashStore, or the in-memory LocalCommunicator for very large W),
// each running core::RunRank. Ranks as processes go through RunSimRank with a FileStore (cli `launch`).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "core/communicator.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"

namespace ddpcheck::sim {

struct SimOptions {
  std::string comm = "gloo";  // "gloo" | "local"
  std::chrono::milliseconds timeout = core::kDefaultTimeout;
  bool record = true;  // false: no trace (benchmarks)
  bool verify_fingerprints = true;
  std::string run_id = "ddpcheck";
};

// Runs the whole world. The scenario's data must be materialised. Returns a non-OK status only when the run
// could not be set up (bad input, a backend error); what the ranks found (timeouts, DDP errors) is recorded
// as trace events, and the first such status is returned in *finding when finding is non-null.
core::Status RunSim(const core::Scenario& s, const SimOptions& opts, core::Trace* out, core::Status* finding = nullptr);

// One rank of a world whose ranks are processes, rendezvousing through a FileStore in `store_dir`.
core::Status RunSimRank(const core::Scenario& s, const SimOptions& opts, int rank, const std::string& store_dir,
                        core::Trace* out);

}  // namespace ddpcheck::sim
