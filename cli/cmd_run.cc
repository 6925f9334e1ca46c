// `ddpcheck run [SCENARIO]`: the main job. Runs the scenario on the reference and the chosen backend, compares
// them, prints the summary table and the verdict; the exit code is the verdict (0 PASS, 1 divergence, 2 bad
// input).
#include <fstream>
#include <iostream>

#include "cli/command.h"
#include "cli/scenario_flags.h"
#include "sim/check.h"

namespace ddpcheck::cli {
namespace {

struct RunArgs {
  ScenarioFlags scenario;
  std::string backend = "sim";
  std::string comm = "gloo";
  int64_t timeout_ms = core::kDefaultTimeout.count();
  std::string dump_trace, dump_reference, report_json;
  bool quiet = false;
};

core::Status WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  if (!out) return core::Status::Io(path + ": cannot write");
  out << text;
  return out ? core::Status::Ok() : core::Status::Io(path + ": write failed");
}

int Run(const RunArgs& a) {
  core::Scenario s;
  core::Status st = a.scenario.Resolve(&s);
  if (!st.ok()) return Fail("run", st);
  sim::CheckOptions opts;
  opts.backend = a.backend;
  opts.sim.comm = a.comm;
  opts.sim.timeout = std::chrono::milliseconds(a.timeout_ms);
  opts.dump_trace = a.dump_trace;
  opts.dump_reference = a.dump_reference;
  core::RunReport report;
  st = sim::RunCheck(std::move(s), opts, &report);
  if (!st.ok()) return Fail("run", st);
  if (!a.quiet) std::cout << core::FormatTerminal(report);
  else std::cout << core::VerdictLine(report) << "\n";
  if (!a.report_json.empty()) {
    st = WriteText(a.report_json, core::ReportToJson(report).dump(2) + "\n");
    if (!st.ok()) return Fail("run", st);
  }
  return report.ExitCode();
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "run",
      "Run a scenario on a backend and on the reference, and compare them.\n"
      "  example: ddpcheck run                                   (default scenario, W=4, sim over Gloo)\n"
      "  example: ddpcheck run scenarios/tutorial_toymodel.json --world 8 --comm local\n"
      "  example: ddpcheck run --backend reference --dump-trace /tmp/ref");
  auto args = std::make_shared<RunArgs>();
  args->scenario.Add(sub);
  sub->add_option("--backend", args->backend, "sim | reference")->check(CLI::IsMember({"sim", "reference"}));
  sub->add_option("--comm", args->comm, "Collectives of the sim world: gloo (TCP) | local (in memory)")
      ->check(CLI::IsMember({"gloo", "local"}));
  sub->add_option("--timeout-ms", args->timeout_ms, "Timeout of every collective, in ms")->check(CLI::PositiveNumber);
  sub->add_option("--dump-trace", args->dump_trace, "Write the backend's trace to this folder");
  sub->add_option("--dump-reference", args->dump_reference, "Write the reference's trace to this folder");
  sub->add_option("--report-json", args->report_json, "Write the JSON report (reports/FORMAT.md) to this file");
  sub->add_flag("--quiet,-q", args->quiet, "Print only the verdict line");
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("run", Setup);

}  // namespace
}  // namespace ddpcheck::cli
