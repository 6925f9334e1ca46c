// `ddpcheck diff TRACE_DIR TRACE_DIR`: compares two saved traces (from --dump-trace) of one scenario: the first
// trace's rank invariants and events, and the first against the second with the tolerance policy recorded in
// the traces' metadata (exact when both say so).
#include <iostream>

#include "cli/command.h"
#include "core/finite.h"
#include "core/report.h"
#include "sim/check.h"

namespace ddpcheck::cli {
namespace {

struct DiffArgs {
  std::string a, b;
  bool quiet = false;
};

int Run(const DiffArgs& args) {
  core::Trace a, b;
  core::Status st = core::Trace::Read(args.a, &a);
  if (st.ok()) st = core::Trace::Read(args.b, &b);
  if (st.ok()) st = core::CheckFinite(a, args.a);  // NaN/inf recorded: a finding (exit 1), never a PASS
  if (st.ok()) st = core::CheckFinite(b, args.b);
  if (!st.ok()) return Fail("diff", st);
  core::TolerancePolicy policy;
  policy.exact = a.meta.value("exact", false) && b.meta.value("exact", false);
  core::DType precision = core::DType::kFloat64;
  core::ParseDType(b.meta.value("precision", std::string("float64")), &precision);
  policy.precision = precision;
  policy.world = b.meta.value("world", 1);
  policy.reduction_length = b.meta.value("reduction_length", int64_t{1});
  core::RunReport report;
  report.provenance = core::Provenance({{"command", "diff"}, {"a", args.a}, {"b", args.b}});
  report.scenario = a.meta.value("scenario", std::string("?"));
  report.backend = args.a;
  report.against = args.b;
  report.world = policy.world;
  report.precision = precision;
  report.result = sim::CompareRun(a, b, policy);
  report.events = a.events();
  for (const auto& [key, v] : b.records()) report.steps = std::max(report.steps, key.step + 1);
  std::cout << (args.quiet ? core::VerdictLine(report) + "\n" : core::FormatTerminal(report));
  return report.ExitCode();
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand("diff",
                                 "Compare two saved traces (written by run --dump-trace / --dump-reference).\n"
                                 "  example: ddpcheck run --dump-trace /tmp/sim --dump-reference /tmp/ref && "
                                 "ddpcheck diff /tmp/sim /tmp/ref");
  auto args = std::make_shared<DiffArgs>();
  sub->add_option("got", args->a, "Trace folder under test")->required();
  sub->add_option("want", args->b, "Trace folder to compare against")->required();
  sub->add_flag("--quiet,-q", args->quiet, "Print only the verdict line");
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("diff", Setup);

}  // namespace
}  // namespace ddpcheck::cli
