// `ddpcheck gpu-run [SCENARIO] --backend real|hybrid`: the scenario on the GPU world, against the reference,
// with the report `run` prints. Registered only in builds with real/ (CUDA and NCCL found); on a machine
// without a GPU it says so and exits 2. `run --backend real|hybrid` runs the same check (real/cli_run_backends.cc).
#include <filesystem>
#include <iostream>
#include <memory>

#include <gloo/rendezvous/file_store.h>

#include "cli/command.h"
#include "cli/run_backend.h"
#include "cli/scenario_flags.h"
#include "core/file.h"
#include "core/train_loop.h"
#include "real/compose/hybrid_gloo.h"
#include "real/compose/rank_setup_ref.h"
#include "real/device.h"
#include "real/world.h"

namespace ddpcheck::cli {
namespace {

struct GpuRunArgs {
  ScenarioFlags scenario;
  std::string backend = "real";
  std::string math = "auto";
  int64_t timeout_ms = core::kDefaultTimeout.count();
  std::string dump_trace, dump_reference, report_json;
  int rank = -1;  // >= 0: one rank of a world whose ranks are processes
  std::string store_dir;
  bool quiet = false;
};

// One rank as a process: rendezvous through a FileStore, trace to --dump-trace (merge with `ddpcheck diff`).
int RunAsRank(const GpuRunArgs& a, core::Scenario s) {
  core::Status st = core::MaterializeData(&s);
  if (!st.ok()) return Fail("gpu-run", st);
  if (a.store_dir.empty()) return Fail("gpu-run", core::Status::Invalid("--rank needs --store-dir (a shared folder)"));
  std::filesystem::create_directories(a.store_dir);
  auto store = std::make_shared<real::GlooKvStore>(std::make_shared<gloo::rendezvous::FileStore>(a.store_dir));
  real::RealOptions ro;
  ro.tf32 = a.math == "tf32";
  ro.timeout = std::chrono::milliseconds(a.timeout_ms);
  ro = real::WithReferenceSetup(ro);
  core::Trace trace;
  st = real::RunRealRank(s, ro, a.rank, store, &trace);
  if (!a.dump_trace.empty()) {
    const core::Status w = trace.Write(a.dump_trace);
    if (!w.ok()) return Fail("gpu-run", w);
  }
  if (!st.ok()) return Fail("gpu-run", st);
  std::cout << "rank " << a.rank << ": done\n";
  return 0;
}

int Run(const GpuRunArgs& a) {
  if (real::DeviceCount() == 0) {
    std::cerr << "ddpcheck gpu-run: no CUDA device on this machine (" << real::ProvenanceLine(real::GetProvenance())
              << "). The GPU world needs a GPU; the CPU world runs with `ddpcheck run`.\n";
    return 2;
  }
  core::Scenario s;
  core::Status st = a.scenario.Resolve(&s);
  if (!st.ok()) return Fail("gpu-run", st);
  if (a.rank >= 0) return RunAsRank(a, std::move(s));
  // The whole world from this process: the same check as `run --backend real|hybrid` (real/cli_run_backends.cc).
  RunBackendRequest request{std::chrono::milliseconds(a.timeout_ms), a.math, a.dump_trace, a.dump_reference};
  core::RunReport report;
  st = RunBackends().at(a.backend)(std::move(s), request, &report);
  if (!st.ok()) return Fail("gpu-run", st);
  if (!a.quiet) std::cout << core::FormatTerminal(report);
  else std::cout << core::VerdictLine(report) << "\n";
  if (!a.report_json.empty()) {
    st = core::WriteStringToFile(a.report_json, core::ReportToJson(report).dump(2) + "\n");
    if (!st.ok()) return Fail("gpu-run", st);
  }
  return report.ExitCode();
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "gpu-run",
      "Run a scenario on the GPU world and on the reference, and compare them.\n"
      "  example: ddpcheck gpu-run --world 2                        (NCCL, one GPU per rank)\n"
      "  example: ddpcheck gpu-run --backend hybrid --world 4       (CUDA replicas, Gloo collectives, shared GPUs)\n"
      "  example: ddpcheck gpu-run --amp bf16 --world 8\n"
      "  example: ddpcheck gpu-run s.json --rank 1 --store-dir /tmp/st --dump-trace /tmp/r1   (ranks as processes)");
  auto args = std::make_shared<GpuRunArgs>();
  args->scenario.Add(sub);
  sub->add_option("--backend", args->backend, "real (NCCL) | hybrid (CUDA + Gloo)")
      ->check(CLI::IsMember({"real", "hybrid"}));
  sub->add_option("--math", args->math, "fp32 GEMMs: auto (= fp32) | fp32 | tf32")
      ->check(CLI::IsMember({"auto", "fp32", "tf32"}));
  sub->add_option("--timeout-ms", args->timeout_ms, "Timeout of every collective, in ms")->check(CLI::PositiveNumber);
  sub->add_option("--dump-trace", args->dump_trace, "Write the GPU world's trace to this folder");
  sub->add_option("--dump-reference", args->dump_reference, "Write the reference's trace to this folder");
  sub->add_option("--report-json", args->report_json, "Write the JSON report (reports/FORMAT.md) to this file");
  sub->add_option("--rank", args->rank, "Run only this rank (ranks as processes; needs --store-dir)");
  sub->add_option("--store-dir", args->store_dir, "Shared folder of the FileStore the rank processes meet in");
  sub->add_flag("--quiet,-q", args->quiet, "Print only the verdict line");
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("gpu-run", Setup);

}  // namespace
}  // namespace ddpcheck::cli
