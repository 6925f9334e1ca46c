// `ddpcheck torch-compare DUMP_DIR`: checks a real PyTorch DDP run recorded by tools/ddpcheck_torch.py.
//   (a) DDP's invariants between the dump's ranks and the BUGS.md patterns a dump shows directly
//       (core/dump_check.h), named by first step, checkpoint, tensor and rank;
//   (b) the run replayed on the reference and the sim world (same init, data and hyper-parameters), and every
//       recorded value of the dump compared with the replay at a derived tolerance.
// Exit 0 PASS, 1 divergence, 2 bad dump (missing rank, truncated .npy, mismatched steps).
#include <fstream>
#include <iostream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "cli/command.h"
#include "core/file.h"
#include "core/diagnose.h"
#include "core/dump.h"
#include "core/dump_check.h"
#include "core/dump_protocol.h"
#include "core/fault_spec.h"
#include "core/report.h"
#include "reference/step_local.h"
#include "sim/check.h"

namespace ddpcheck::cli {
namespace {

struct TorchCompareArgs {
  std::string dump;
  std::string report_json;
  std::string comm = "gloo";
  bool no_replay = false;
  bool quiet = false;
};

int Run(const TorchCompareArgs& args) {
  core::TorchDump dump;
  if (core::Status st = core::ReadTorchDump(args.dump, &dump); !st.ok()) return Fail("torch-compare", st);
  core::RunReport report;
  report.provenance = core::Provenance({{"command", "torch-compare"},
                                        {"dump", args.dump},
                                        {"backend", "torch " + dump.ranks[0].index.value("torch_version", "?")},
                                        {"world", dump.world},
                                        {"precision", core::DTypeName(dump.scenario.precision)}});
  report.scenario = dump.scenario.name;
  report.backend = "torch (recorded)";
  report.world = dump.world;
  report.precision = dump.scenario.precision;
  report.steps = dump.steps;

  core::Trace sim_trace, ref_trace;
  bool replayed = false, sim_pass = false;
  std::string replay_note = dump.replay_unsupported;
  if (args.no_replay && replay_note.empty()) replay_note = "--no-replay";
  if (replay_note.empty()) {
    sim::CheckOptions opts;
    opts.sim.comm = args.comm;
    core::RunReport replay;
    core::Status st = sim::RunCheck(dump.scenario, opts, &replay, &sim_trace, &ref_trace);
    if (!st.ok()) return Fail("torch-compare", st.Prefixed("replay"));
    replayed = true;
    sim_pass = replay.pass();
  }
  const core::TolerancePolicy policy = core::DumpPolicy(dump);
  core::CompareResult result;
  if (replayed && ref::StepLocalSupported(dump.scenario)) {
    // The verdict comes from the step-local check; the whole-trajectory replay feeds the patterns and the sim.
    core::Status st = ref::CheckStepLocal(dump.scenario, dump.trace, policy, &result);
    if (!st.ok()) return Fail("torch-compare", st.Prefixed("step-local replay"));
    report.against = "reference replay, step-local";
  } else if (replayed) {
    result = core::CompareTraces(dump.trace, ref_trace, policy);
    report.against = "reference replay";
  } else {
    result.derivation = "no replay (" + replay_note + "): only DDP's invariants between ranks were checked";
    report.against = "its own ranks";
  }
  result.Merge(core::CheckRankInvariants(dump.trace));
  // The model-agnostic protocol check (any nn.Module; the only verdict of a dump that cannot be replayed).
  core::ProtocolRecords records;
  if (core::Status st = core::LoadProtocolRecords(dump, &records); !st.ok()) return Fail("torch-compare", st);
  const core::ProtocolResult protocol = core::CheckProtocol(records);
  result.Merge(protocol.result);
  result.Merge(core::CheckEvents(dump.trace));
  report.events = dump.trace.events();
  core::FillSeries(dump.trace, &report);

  auto finding = core::FindDumpPattern(dump, replayed ? &ref_trace : nullptr);
  if (protocol.diagnosis && (!finding || protocol.result.first->key.step < finding->mismatch.key.step)) {
    result.first = protocol.result.first;
    report.diagnosis = protocol.diagnosis;
  } else if (finding) {
    result.Add(finding->mismatch);
    result.first = finding->mismatch;  // the pattern's own evidence is the headline
    report.diagnosis = finding->diagnosis;
  } else if (!result.pass && replayed) {  // Diagnose reads the replay's trace
    report.diagnosis = core::Diagnose(dump.scenario, dump.trace, ref_trace, result);
  }
  report.result = std::move(result);

  std::cout << (args.quiet ? core::VerdictLine(report) + "\n" : core::FormatTerminal(report));
  if (!args.quiet) {
    std::cout << "replay: "
              << (replayed ? std::string("reference and sim (") + args.comm + ") replayed " +
                                 std::to_string(dump.steps) + " steps; sim vs reference " +
                                 (sim_pass ? "PASS" : "FAIL (see ddpcheck run on the scenario)")
                           : "skipped: " + replay_note)
              << "\n";
    std::cout << "protocol: checked " << fmt::format("{}", fmt::join(protocol.checked, "; ")) << "\n";
    if (!protocol.skipped.empty()) std::cout << "protocol: not checked: " << fmt::format("{}", fmt::join(protocol.skipped, "; ")) << "\n";
    if (!protocol.reference.empty()) std::cout << "single-process reference: " << protocol.reference << "\n";
  }
  if (!args.report_json.empty()) {
    nlohmann::json j = core::ReportToJson(report);
    j["torch_compare"] = {{"dump", args.dump},
                          {"world", dump.world},
                          {"steps", dump.steps},
                          {"replayed", replayed},
                          {"replay_note", replay_note},
                          {"sim_vs_reference_pass", sim_pass},
                          {"scenario", replayed ? core::ScenarioToJson(dump.scenario) : nlohmann::json()},
                          {"protocol", {{"checked", protocol.checked},
                                        {"not_checked", protocol.skipped},
                                        {"reference", protocol.reference}}}};
    if (report.diagnosis && report.result.first) {
      const auto& k = report.result.first->key;
      j["torch_compare"]["finding"] = {{"pattern", report.diagnosis->pattern},
                                       {"step", k.step},
                                       {"checkpoint", core::CheckpointName(k.checkpoint)},
                                       {"tensor", k.tensor},
                                       {"rank", k.rank}};
    }
    const core::Status st = core::WriteStringToFile(args.report_json, j.dump(2) + "\n");
    if (!st.ok()) return Fail("torch-compare", st);
  }
  return report.ExitCode();
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "torch-compare",
      "Check a real PyTorch DDP run recorded with tools/ddpcheck_torch.py: DDP's invariants across ranks,\n"
      "BUGS.md patterns, and a replay on the reference and the sim world compared value by value.\n"
      "  example: /usr/bin/python3 tools/examples/ddp_example.py --out /tmp/dump && ddpcheck torch-compare /tmp/dump");
  auto args = std::make_shared<TorchCompareArgs>();
  sub->add_option("dump", args->dump, "Dump folder (rank<r>/index.json per rank)")->required();
  sub->add_option("--report-json", args->report_json, "Also write the report as JSON (reports/FORMAT.md)");
  sub->add_option("--comm", args->comm, "Communicator of the sim replay")->check(CLI::IsMember({"gloo", "local"}));
  sub->add_flag("--no-replay", args->no_replay, "Only check the invariants between the dump's ranks");
  sub->add_flag("--quiet,-q", args->quiet, "Print only the verdict line");
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("torch-compare", Setup);

}  // namespace
}  // namespace ddpcheck::cli
