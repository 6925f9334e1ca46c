// RunReport: what a run found, in the forms people and CI read. Rank 0 (the driving process) writes them.
//   FormatTerminal: a provenance header, a per-checkpoint table with a units row, the first divergence with
//                   its evidence, the tolerance derivation, and a one-line verdict.
//   ReportToJson:   the same as data; schema in reports/FORMAT.md (versioned).
//   ReportToMarkdown: a PR comment (verdict, provenance, the table, evidence, diagnosis, tolerance).
//   ReportToHtml:   one self-contained page with gnuplot-drawn SVG plots (error vs step per tensor, lr/scale/loss
//                   vs step, the rank x step divergence map); needs gnuplot (Debian: gnuplot-nox) at run time.
//   ReportToJUnit:  JUnit XML, one testcase per checkpoint, for CI systems.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/compare.h"
#include "core/scenario.h"
#include "core/status.h"
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
  // The rank x step divergence map: for each (rank, step) the backend recorded, the largest |got - reference|
  // over its floating values (0 when all equal), and whether anything there failed (a value beyond its budget,
  // a rank invariant, a missing value, a hang or error event).
  struct Cell {
    double max_abs_err = 0;
    bool failed = false;
  };
  std::map<int, std::map<int64_t, Cell>> divergence_map;  // rank -> step -> cell
  // Further runs checked against the same oracle (torch-compare's sim replay): one verdict each.
  struct CrossCheck {
    std::string name;   // "sim (gloo) vs reference"
    bool pass = true;
    std::string first;  // the first divergence, described ("" when it passed)
  };
  std::vector<CrossCheck> cross_checks;
  std::string replay_note;  // why the run was not compared with an oracle ("" when it was)

  bool pass() const { return result.pass; }
  int ExitCode() const { return result.pass ? 0 : 1; }
};

// Provenance of this process: ddpcheck version and commit, host, time (UTC), plus the given extras.
nlohmann::json Provenance(const nlohmann::json& extra);
// Fills the series (lr, scale, loss of rank 0 or kAllRanks) from a trace.
void FillSeries(const Trace& trace, RunReport* report);
// Fills report->divergence_map from the backend's trace `got` against `want` (the reference) with the budgets
// of `policy`, and marks the cells of report->result's mismatches. Call after report->result is set.
void FillDivergenceMap(const Trace& got, const Trace& want, const TolerancePolicy& policy, RunReport* report);

std::string FormatTerminal(const RunReport& r);
nlohmann::json ReportToJson(const RunReport& r);
std::string VerdictLine(const RunReport& r);
std::string DescribeMismatch(const Mismatch& m);
std::string ReportToMarkdown(const RunReport& r);
std::string ReportToJUnit(const RunReport& r);
// Runs gnuplot (see core/plot.h); NotFound (exit 2) naming the Debian package when gnuplot is absent.
Status ReportToHtml(const RunReport& r, std::string* html);
// abs_err / budget of a mismatch (how much of its tolerance it used); infinity when the budget is 0 (exact).
double BudgetUsed(const Mismatch& m);

constexpr int kReportFormatVersion = 1;  // reports/FORMAT.md; keys are only added within a version

}  // namespace ddpcheck::core
