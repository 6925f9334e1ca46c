// `ddpcheck diff TRACE_DIR TRACE_DIR`: compares two saved traces (from --dump-trace / --dump-reference) through
// the harness: the first trace's rank invariants and events, and the first against the second with the
// tolerance policy of the scenario the traces were recorded from (stamped into their metadata; exact when both
// say so otherwise), with the diagnosis and report `run` gives.
#include <iostream>

#include "cli/command.h"
#include "cli/report_flags.h"
#include "harness/check.h"

namespace ddpcheck::cli {
namespace {

struct DiffArgs {
  std::string a, b;
  ReportFlags reports;
};

int Run(const DiffArgs& args) {
  core::Status st = args.reports.Preflight({args.a, args.b});
  if (!st.ok()) return Fail("diff", st);
  harness::CheckOptions opts;
  opts.got = {harness::SourceKind::kStoredTrace, args.a};
  opts.want = harness::Source{harness::SourceKind::kStoredTrace, args.b};
  core::RunReport report;
  st = harness::Check(std::nullopt, opts, &report);
  if (!st.ok()) return Fail("diff", st);
  report.provenance["command"] = "diff";
  return EmitReport("diff", report, args.reports);
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand("diff",
                                 "Compare two saved traces (written by run --dump-trace / --dump-reference).\n"
                                 "  example: ddpcheck run --dump-trace /tmp/sim --dump-reference /tmp/ref && "
                                 "ddpcheck diff /tmp/sim /tmp/ref");
  auto args = std::make_shared<DiffArgs>();
  sub->add_option("got", args->a, "Trace folder under test")->required();
  sub->add_option("want", args->b, "Trace folder to compare against")->required();
  args->reports.Add(sub);
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("diff", Setup);

}  // namespace
}  // namespace ddpcheck::cli
