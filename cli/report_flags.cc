#include "cli/report_flags.h"

#include <iostream>

#include "cli/command.h"
#include "core/file.h"
#include "core/plot.h"

namespace ddpcheck::cli {

void ReportFlags::Add(CLI::App* app) {
  app->add_option("--report-json", json, "Write the JSON report (reports/FORMAT.md) to this file");
  app->add_option("--report-md", md, "Write the report as Markdown (a PR comment) to this file");
  app->add_option("--report-html", html,
                  "Write a self-contained HTML report with plots to this file (needs gnuplot: Debian gnuplot-nox)");
  app->add_option("--junit", junit, "Write JUnit XML (one testcase per checkpoint) to this file");
  app->add_flag("--quiet,-q", quiet, "Print only the verdict line");
}

core::Status ReportFlags::Preflight() const {
  if (html.empty()) return core::Status::Ok();
  std::string gnuplot;
  return core::FindGnuplot(&gnuplot).Prefixed("--report-html");
}

int EmitReport(const std::string& cmd, const core::RunReport& report, const ReportFlags& flags,
               const nlohmann::json& extra, const std::string& trailer) {
  core::Status st;
  if (!flags.json.empty()) {
    nlohmann::json j = core::ReportToJson(report);
    for (const auto& [k, v] : extra.items()) j[k] = v;
    st = core::WriteStringToFile(flags.json, j.dump(2) + "\n").Prefixed("--report-json");
    if (!st.ok()) return Fail(cmd, st);
  }
  if (!flags.md.empty()) {
    st = core::WriteStringToFile(flags.md, core::ReportToMarkdown(report)).Prefixed("--report-md");
    if (!st.ok()) return Fail(cmd, st);
  }
  if (!flags.junit.empty()) {
    st = core::WriteStringToFile(flags.junit, core::ReportToJUnit(report)).Prefixed("--junit");
    if (!st.ok()) return Fail(cmd, st);
  }
  if (!flags.html.empty()) {
    std::string html;
    st = core::ReportToHtml(report, &html);
    if (st.ok()) st = core::WriteStringToFile(flags.html, html);
    if (!st.ok()) return Fail(cmd, st.Prefixed("--report-html"));
  }
  if (flags.quiet) {
    std::cout << core::VerdictLine(report) << "\n";
  } else {
    std::cout << core::FormatTerminal(report) << trailer;
  }
  return report.ExitCode();
}

}  // namespace ddpcheck::cli
