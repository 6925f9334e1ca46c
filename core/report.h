// RunReport: what a run found, in the forms people and CI read. Rank 0 (the driving process) writes them.
//   FormatTerminal: a provenance header, a per-checkpoint table with a units row, the first divergence with
//                   its evidence, the tolerance derivation, and a one-line verdict.
//   ReportToJson:   the same as data; schema in reports/FORMAT.md (versioned).
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/compare.h"
#include "core/scenario.h"
#include "core/trace.h"

namespace ddpcheck::core {

struct Diagnosis {
  std::string pattern;      // a BUGS.md fault name
  std::string kind;         // rank-divergent | reference-divergent | hang | finding
  std::string explanation;  // evidence in one or two sentences
  bool expected_semantics = false;  // DDP's documented behaviour rather than a bug
};

struct RunReport {
  nlohmann::json provenance;  // version, commit, host, backend, world, precision, seed, command
  std::string scenario;
  std::string backend;  // "sim (gloo)", "reference", ...
  std::string against;  // "reference"
  int world = 1;
  DType precision = DType::kFloat64;
  int64_t steps = 0;
  std::vector<std::string> faults;
  CompareResult result;
  std::optional<Diagnosis> diagnosis;
  std::vector<TraceEvent> events;
  // Series for plots: lr and scale per step (rank 0 / shared values).
  std::map<int64_t, double> lr_by_step, scale_by_step, loss_by_step;

  bool pass() const { return result.pass; }
  int ExitCode() const { return result.pass ? 0 : 1; }
};

// Provenance of this process: ddpcheck version and commit, host, time (UTC), plus the given extras.
nlohmann::json Provenance(const nlohmann::json& extra);
// Fills the series (lr, scale, loss of rank 0 or kAllRanks) from a trace.
void FillSeries(const Trace& trace, RunReport* report);

std::string FormatTerminal(const RunReport& r);
nlohmann::json ReportToJson(const RunReport& r);
std::string VerdictLine(const RunReport& r);
std::string DescribeMismatch(const Mismatch& m);

constexpr int kReportFormatVersion = 1;

}  // namespace ddpcheck::core
