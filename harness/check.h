// The one composer of a check: every command that checks (`run`, ranks as processes, `diff`, `torch-compare`,
// `gpu-run`, `gpu-report`) describes what to compare as Sources and calls Check (or CheckAsRank for one rank
// of a world of processes). The flow is always the same:
//   sources -> Traces -> one tolerance policy (harness/tolerance.h) -> Compare (rank invariants, events, the
//   run against the oracle) -> source evidence (a torch dump's patterns) -> diagnosis from the traces alone ->
//   one RunReport (series, divergence map, provenance).
// Ranks as threads and ranks as processes differ only in how the run under test's trace is produced: the rest
// of the path is this file's, so both print the same first divergence, diagnosis and divergence map.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "core/report.h"
#include "core/scenario.h"
#include "core/status.h"
#include "core/trace.h"

namespace ddpcheck::harness {

enum class SourceKind {
  kReference,    // reference::RunReference on the scenario (the oracle)
  kSim,          // the CPU world, ranks as threads (sim::RunSim)
  kGpu,          // the GPU world: CUDA replicas + NCCL (harness/gpu.h)
  kHybrid,       // the GPU world with Gloo collectives
  kTorchDump,    // a real PyTorch run recorded by tools/ddpcheck_torch.py (path = the dump folder)
  kStoredTrace,  // a trace written by --dump-trace / --dump-reference (path = the folder)
};
std::string SourceKindName(SourceKind kind);

struct Source {
  SourceKind kind = SourceKind::kReference;
  std::string path;  // kTorchDump, kStoredTrace
};

struct CheckOptions {
  Source got{SourceKind::kSim, ""};  // the run under test
  // The oracle. nullopt: the scenario's reference (for a torch dump: its replay), unless `replay` is false.
  std::optional<Source> want;
  // The oracle's precision when it is the reference (gpu-report compares with fp64; an AMP run's oracle keeps its
  // GradScaler and autocast's overflow, not its roundings: AmpSpec::range_only). nullopt: the scenario's own.
  std::optional<core::DType> oracle_precision;
  bool replay = true;  // false: compare nothing against an oracle; only the run's own invariants
  // Further runs compared against the same oracle; each one's verdict is listed in report.cross_checks
  // (torch-compare replays the dump's scenario on the sim world this way).
  std::vector<Source> cross_checks;

  // The worlds' settings.
  std::string comm = "gloo";  // sim: gloo | local
  std::string gloo_transport = "inproc";  // sim over gloo, ranks as threads: inproc | tcp (sim::SimOptions)
  std::chrono::milliseconds timeout{0};  // every collective's; 0: the scenario's ddp.timeout_ms
  std::string run_id = "ddpcheck";
  std::string gloo_host;
  bool tf32 = false;  // GPU worlds: fp32 GEMMs on TF32
  std::function<void(int64_t done, int64_t total)> progress;  // rank 0, after each step

  std::string dump_trace;      // write the run under test's trace here ("" = no)
  std::string dump_reference;  // write the oracle's trace here
};

// Runs the check. `s` (validated) is required when a source runs a scenario (reference, sim, GPU); torch dumps
// and stored traces carry their own. Non-OK only for bad input or a broken backend; divergences are in
// report->result and report->ExitCode() is the verdict. `got_trace`/`want_trace` receive the traces if non-null.
core::Status Check(std::optional<core::Scenario> s, const CheckOptions& opts, core::RunReport* report,
                   core::Trace* got_trace = nullptr, core::Trace* want_trace = nullptr);

// One rank of a world whose ranks are processes (`launch`, torchrun, mpirun, srun): opens the rendezvous store
// at `store_url` (file:///dir or redis://host:port, sim/store_open.h), runs this rank's part of the sim world
// through it, publishes its trace shard there, and on rank 0 gathers every shard into the
// world's trace and finishes exactly as Check does (same report). *reporter is true on rank 0 only; other ranks
// return their own finding (a timeout naming missing ranks, a mismatch) or OK. Rank 0 returns Timeout naming
// the ranks whose shards did not arrive within the timeout.
core::Status CheckAsRank(core::Scenario s, const CheckOptions& opts, int rank, const std::string& store_url,
                         core::RunReport* report, bool* reporter);

}  // namespace ddpcheck::harness
