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
    double budget_used = 0;  // max |got - reference| / budget over non-exact floating values (0 when none)
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
  // A recorded torch run's protocol check (core/dump_protocol.h): what it checked, what not and why.
  struct Protocol {
    bool ran = false;
    std::vector<std::string> checked, not_checked;
    std::string reference;  // which single-process reference was used
  };
  Protocol protocol;
  // The same per checkpoint: checkpoint name -> rank -> step -> cell (HTML: one line per rank per checkpoint).
  std::map<std::string, std::map<int, std::map<int64_t, Cell>>> rank_error;
  // Per checkpoint, what a person reads: whether it is checked exactly (integers, sampler, lr, scaler state, or
  // an exact-by-construction scenario), the largest error relative to the reference's scale there (max |ref|
  // at that step and checkpoint, the scale the budget uses; never per element, so values near zero do not
  // inflate it), and the largest fraction of the budget used.
  struct CheckpointSummary {
    bool exact = true;
    double max_abs_err = 0;
    double max_scaled_err = 0;  // max |got - reference| / max |reference at that step and checkpoint|
    double max_budget_used = 0;
  };
  std::map<std::string, CheckpointSummary> checkpoint_summary;
  // Loss per rank: the backend's (FillSeries) and the reference's for the same rank's shard (FillDivergenceMap).
  std::map<int, std::map<int64_t, double>> loss_by_rank, reference_loss_by_rank;

  bool pass() const { return result.pass; }
  int ExitCode() const { return result.pass ? 0 : 1; }
};

// Provenance of this process: ddpcheck version and commit, host, time (UTC), plus the given extras.
nlohmann::json Provenance(const nlohmann::json& extra);
// Fills the series (lr, scale, loss of rank 0 or kAllRanks) and loss_by_rank from the backend's trace.
void FillSeries(const Trace& trace, RunReport* report);
// Fills from the backend's trace `got` against `want` (the reference), with the budgets of `policy`:
// divergence_map, rank_error, checkpoint_summary and reference_loss_by_rank; marks the cells of
// report->result's mismatches. Call after report->result is set. A checking command calls FillSeries(got) and
// this; without them the terminal table shows "-" for the relative columns and the HTML report has no per-rank
// lines.
void FillDivergenceMap(const Trace& got, const Trace& want, const TolerancePolicy& policy, RunReport* report);

// The summary for a terminal (core/report_terminal.cc): first divergence, pattern and how to fix, the table.
std::string FormatTerminal(const RunReport& r);
nlohmann::json ReportToJson(const RunReport& r);
std::string VerdictLine(const RunReport& r);
// "step 3, forward_buffers, tensor timeout, rank 1 (hang vs rank 0 waited)": where, and against what.
std::string MismatchHeadline(const Mismatch& m);
// The headline with the evidence (got, want, errors, budget, elements) or the message.
std::string DescribeMismatch(const Mismatch& m);
// The "how to fix" line of the diagnosed pattern (core/fault_guide.h); "" without a diagnosis or a guide.
std::string HowToFix(const RunReport& r);
// One row of the per-checkpoint table as text: "exact" checks say equal/differ and "-" for the ratios.
struct CheckpointCells {
  std::string check;           // "exact" | "budget"
  std::string max_abs_err;     // value units, or "equal" / "differ" for exact checks
  std::string max_scaled_err;  // max |err| / max |reference| at that step and checkpoint, or "-"
  std::string budget_used;     // max |err| / budget, or "-"
};
CheckpointCells FormatCheckpointCells(const RunReport& r, const std::string& name, const CheckpointStats& st);
// One line on the tolerance for the terminal; the derivation itself is r.result.derivation (reports).
std::string ToleranceSummary(const RunReport& r);
std::string ReportToMarkdown(const RunReport& r);
std::string ReportToJUnit(const RunReport& r);
// Runs gnuplot (see core/plot.h); NotFound (exit 2) naming the Debian package when gnuplot is absent.
Status ReportToHtml(const RunReport& r, std::string* html);
// abs_err / budget of a mismatch (how much of its tolerance it used); infinity when the budget is 0 (exact).
double BudgetUsed(const Mismatch& m);

constexpr int kReportFormatVersion = 1;  // reports/FORMAT.md; keys are only added within a version

}  // namespace ddpcheck::core
