// `ddpcheck torch-compare DUMP_DIR`: checks a real PyTorch DDP run recorded by tools/ddpcheck_torch.py.
//   (a) DDP's invariants between the dump's ranks and the BUGS.md patterns a dump shows directly
//       (core/dump_check.h), named by first step, checkpoint, tensor and rank;
//   (b) the run replayed on the reference and the sim world (same init, data and hyper-parameters), and every
//       recorded value of the dump compared with the replay at a derived tolerance.
// Exit 0 PASS, 1 divergence, 2 bad dump (missing rank, truncated .npy, mismatched steps).
#include "cli/command.h"
#include "cli/report_flags.h"
#include "core/fault_spec.h"
#include "core/file.h"
#include "core/scenario.h"
#include "harness/check.h"

namespace ddpcheck::cli {
namespace {

// The recorded run as a scenario (its model, initial state and data inline) with the finding's pattern as a
// fault, so `ddpcheck run OUT` reproduces the finding in the CPU world; a PASS exports the clean scenario.
core::Status ExportScenario(const std::string& dump, const core::RunReport& report, const core::Trace& dump_trace,
                            const std::string& out) {
  if (!report.replay_note.empty() || !dump_trace.meta.contains("scenario_spec")) {
    return core::Status::Invalid("--export-scenario " + out + ": the dump cannot be replayed (" +
                                 (report.replay_note.empty() ? "no scenario" : report.replay_note) +
                                 "), so no scenario reproduces it; the report above is the whole finding");
  }
  nlohmann::json spec = dump_trace.meta["scenario_spec"];
  std::string what = "a clean run";
  spec["faults"] = nlohmann::json::array();
  if (!report.pass()) {
    if (!report.diagnosis) {
      return core::Status::Invalid("--export-scenario " + out + ": the finding names no BUGS.md pattern, so no fault "
                                   "reproduces it; the report above is the whole finding");
    }
    core::FaultSpec fault;
    if (const core::Status st = core::ParseFaultSpec(report.diagnosis->pattern, &fault); !st.ok()) {
      return core::Status::Invalid("--export-scenario " + out + ": pattern '" + report.diagnosis->pattern +
                                   "' is seen in recorded runs only (docs/bugs.md): no scenario injects it");
    }
    // The scenario is the intended program and the fault the mistake: the replay mirrors what the run did
    // (a run that never called set_epoch replays with sampler.set_epoch false), so the option the fault stands
    // for is put back to DDP's correct usage, or the oracle would compute the mistake too.
    if (fault.name == "skip-set-epoch") spec["sampler"]["set_epoch"] = true;
    if (fault.name == "no-buffer-broadcast") spec["ddp"]["broadcast_buffers"] = true;
    spec["faults"].push_back(core::FaultSpecString(fault));
    what = "finding " + core::FaultSpecString(fault);
  }
  spec["name"] = spec.value("name", std::string("torch-run")) + "-exported";
  spec["description"] = "exported by ddpcheck torch-compare from " + dump + " (" + what +
                        "): `ddpcheck run` on this file reproduces it in the CPU world";
  core::Scenario check;
  DDPCHECK_RETURN_IF_ERROR(core::ParseScenario(spec, out, ".", &check).Prefixed("--export-scenario"));
  DDPCHECK_RETURN_IF_ERROR(core::ValidateScenario(check).Prefixed("--export-scenario"));
  return core::WriteStringToFile(out, spec.dump(2) + "\n");
}

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : "; ") + p;
  return out;
}

struct TorchCompareArgs {
  std::string dump;
  std::string comm = "gloo";
  std::string gloo_transport = "inproc";
  bool no_replay = false;
  std::string export_scenario;
  ReportFlags reports;
};

int Run(const TorchCompareArgs& args) {
  core::Status st = args.reports.Preflight({args.dump});
  if (!st.ok()) return Fail("torch-compare", st);
  harness::CheckOptions opts;
  opts.got = {harness::SourceKind::kTorchDump, args.dump};
  opts.replay = !args.no_replay;
  opts.comm = args.comm;
  opts.gloo_transport = args.gloo_transport;
  opts.cross_checks.push_back({harness::SourceKind::kSim, ""});  // the CPU world replays the same run
  core::RunReport report;
  core::Trace dump_trace;
  st = harness::Check(std::nullopt, opts, &report, &dump_trace);
  if (!st.ok()) return Fail("torch-compare", st);
  report.provenance["command"] = "torch-compare";
  std::string trailer = "replay: ";
  if (report.replay_note.empty()) {
    trailer += "reference replayed " + std::to_string(report.steps) + " steps";
    for (const auto& c : report.cross_checks) trailer += "; " + c.name + " " + (c.pass ? "PASS" : "FAIL: " + c.first);
  } else {
    trailer += "skipped: " + report.replay_note;
  }
  trailer += "\n";
  if (report.protocol.ran) {
    trailer += "protocol: checked " + Join(report.protocol.checked) + "\n";
    if (!report.protocol.not_checked.empty()) trailer += "protocol: not checked: " + Join(report.protocol.not_checked) + "\n";
    if (!report.protocol.reference.empty()) trailer += "single-process reference: " + report.protocol.reference + "\n";
  }
  nlohmann::json extra;
  extra["torch_compare"] = {{"dump", args.dump},
                            {"world", report.world},
                            {"steps", report.steps},
                            {"replayed", report.replay_note.empty()},
                            {"replay_note", report.replay_note},
                            {"sim_vs_reference_pass",
                             !report.cross_checks.empty() && report.cross_checks.front().pass}};
  if (report.protocol.ran) {
    extra["torch_compare"]["protocol"] = {{"checked", report.protocol.checked},
                                          {"not_checked", report.protocol.not_checked},
                                          {"reference", report.protocol.reference}};
  }
  if (report.replay_note.empty() && dump_trace.meta.contains("scenario_spec")) extra["torch_compare"]["scenario"] = dump_trace.meta["scenario_spec"];
  if (report.diagnosis && report.result.first) {
    const auto& k = report.result.first->key;
    extra["torch_compare"]["finding"] = {{"pattern", report.diagnosis->pattern},
                                         {"step", k.step},
                                         {"checkpoint", core::CheckpointName(k.checkpoint)},
                                         {"tensor", k.tensor},
                                         {"rank", k.rank}};
  }
  const int code = EmitReport("torch-compare", report, args.reports, extra, trailer);
  if (!args.export_scenario.empty() && (code == 0 || code == 1)) {
    if (const core::Status ex = ExportScenario(args.dump, report, dump_trace, args.export_scenario); !ex.ok()) {
      return Fail("torch-compare", ex);
    }
    if (!args.reports.quiet) {
      std::cout << "exported: " << args.export_scenario << " (reproduce: ddpcheck run " << args.export_scenario
                << ")\n";
    }
  }
  return code;
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "torch-compare",
      "Check a real PyTorch DDP run recorded with tools/ddpcheck_torch.py: DDP's invariants across ranks,\n"
      "BUGS.md patterns, and a replay on the reference and the sim world compared value by value.\n"
      "  example: /usr/bin/python3 tools/examples/ddp_example.py --out /tmp/dump && ddpcheck torch-compare /tmp/dump");
  auto args = std::make_shared<TorchCompareArgs>();
  sub->add_option("dump", args->dump, "Dump folder (rank<r>/index.json per rank)")->required();
  args->reports.Add(sub);
  sub->add_option("--comm", args->comm, "Communicator of the sim replay")->check(CLI::IsMember({"gloo", "local"}));
  sub->add_option("--gloo-transport", args->gloo_transport,
                  "How Gloo's messages travel between the replay's rank threads: inproc (default) | tcp")
      ->check(CLI::IsMember({"inproc", "tcp"}));
  sub->add_option("--export-scenario", args->export_scenario,
                  "Write the replayed run as a scenario with the finding as a fault: `ddpcheck run FILE` reproduces "
                  "it in the CPU world");
  sub->add_flag("--no-replay", args->no_replay, "Only check the invariants between the dump's ranks");
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("torch-compare", Setup);

}  // namespace
}  // namespace ddpcheck::cli
