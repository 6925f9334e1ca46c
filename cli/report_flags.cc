#include "cli/report_flags.h"

#include <filesystem>
#include <iostream>
#include <utility>

#include <fmt/format.h>

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

namespace {

// An output that would overwrite what the command reads (QA round 16: `torch-compare DUMP --report-json
// DUMP/rank0/index.json` replaced the dump's index, and the next check of it failed): an input file itself, or an
// index.json, .npy or .npz inside an input folder, or any file in a dump's rank folders. A new file, or a report
// written there before, is fine.
core::Status NotAnInput(const char* flag, const std::string& out, const std::vector<std::string>& inputs) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (out.empty() || !fs::exists(out, ec)) return core::Status::Ok();
  const fs::path o = fs::weakly_canonical(out, ec);
  for (const std::string& in : inputs) {
    std::error_code e2;
    if (in.empty() || !fs::exists(in, e2)) continue;
    if (fs::equivalent(out, in, e2)) {
      return core::Status::Invalid(fmt::format("{} {}: is the input {} itself: write the report elsewhere", flag, out, in));
    }
    if (!fs::is_directory(in, e2)) continue;
    const fs::path rel = o.lexically_relative(fs::weakly_canonical(in, e2));
    if (rel.empty() || *rel.begin() == "..") continue;
    const std::string ext = o.extension().string();
    if (o.filename() == "index.json" || ext == ".npy" || ext == ".npz" ||
        rel.begin()->string().rfind("rank", 0) == 0) {  // (a dump's rank folders hold only what the recorder wrote)
      return core::Status::Invalid(fmt::format("{} {}: would overwrite a file of the input {} (the recording or trace "
                                               "being checked): write the report elsewhere", flag, out, in));
    }
  }
  return core::Status::Ok();
}

}  // namespace

core::Status ReportFlags::Preflight(const std::vector<std::string>& inputs) const {
  for (const auto& [flag, out] : {std::pair<const char*, const std::string*>{"--report-json", &json},
                                  {"--report-md", &md}, {"--report-html", &html}, {"--junit", &junit}}) {
    DDPCHECK_RETURN_IF_ERROR(NotAnInput(flag, *out, inputs));
  }
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
