// The report flags every checking command takes (`run`, `diff`, `torch-compare`, `gpu-run`), declared and
// honoured in one place: --report-json, --report-md, --report-html, --junit, --quiet. The files are written
// before the verdict is printed, so a verdict on the terminal always means the reports exist.
#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "core/report.h"
#include "core/status.h"

namespace ddpcheck::cli {

struct ReportFlags {
  std::string json, md, html, junit;
  bool quiet = false;

  void Add(CLI::App* app);
  // Before the run: what can be known to fail early (the HTML report needs gnuplot; a report path that would
  // overwrite one of `inputs`, the files and folders the command reads).
  core::Status Preflight(const std::vector<std::string>& inputs = {}) const;
};

// Writes the requested files (the JSON report with `extra` merged in at the top level), then prints the
// terminal summary (or only the verdict line with --quiet) and `trailer`. Returns the exit code: the verdict,
// or the failure's code when a file could not be written (printed as "ddpcheck <cmd>: ...").
int EmitReport(const std::string& cmd, const core::RunReport& report, const ReportFlags& flags,
               const nlohmann::json& extra = nlohmann::json::object(), const std::string& trailer = "");

}  // namespace ddpcheck::cli
