// `ddpcheck gpu-run [SCENARIO] --backend real|hybrid`: the scenario on the GPU world, against the reference,
// with the report `run` prints. In the CPU-only binary it hands over to ddpcheck-gpu (cli/main.cc); on a
// machine without a GPU it says so and exits 2. `run --backend real|hybrid` runs the same check.
#include <iostream>
#include <memory>

#include "cli/command.h"
#include "cli/report_flags.h"
#include "cli/scenario_flags.h"
#include "core/communicator.h"
#include "core/train_loop.h"
#include "harness/check.h"
#include "harness/gpu.h"

namespace ddpcheck::cli {
namespace {

struct GpuRunArgs {
  ScenarioFlags scenario;
  std::string backend = "real";
  std::string math = "auto";
  int64_t timeout_ms = core::kDefaultTimeout.count();
  std::string dump_trace, dump_reference;
  ReportFlags reports;
  int rank = -1;  // >= 0: one rank of a world whose ranks are processes
  std::string store_dir;
};

// One rank as a process: rendezvous through a FileStore, trace to --dump-trace (merge with `ddpcheck diff`).
int RunAsRank(const GpuRunArgs& a, core::Scenario s) {
  core::Status st = core::MaterializeData(&s);
  if (!st.ok()) return Fail("gpu-run", st);
  harness::GpuWorldOptions go;
  go.tf32 = a.math == "tf32";
  go.timeout = std::chrono::milliseconds(a.timeout_ms);
  core::Trace trace;
  st = harness::RunGpuRank(s, go, a.rank, a.store_dir, &trace);
  if (!a.dump_trace.empty()) {
    const core::Status w = trace.Write(a.dump_trace);
    if (!w.ok()) return Fail("gpu-run", w);
  }
  if (!st.ok()) return Fail("gpu-run", st);
  std::cout << "rank " << a.rank << ": done\n";
  return 0;
}

int Run(const GpuRunArgs& a) {
  core::Scenario s;
  core::Status st = a.scenario.Resolve(&s);
  if (!st.ok()) return Fail("gpu-run", st);
  st = a.reports.Preflight({a.scenario.path});
  if (!st.ok()) return Fail("gpu-run", st);
  if (a.rank >= 0) return RunAsRank(a, std::move(s));
  // The whole world from this process: the same check as `run --backend real|hybrid`.
  harness::CheckOptions opts;
  opts.got.kind = a.backend == "hybrid" ? harness::SourceKind::kHybrid : harness::SourceKind::kGpu;
  opts.tf32 = a.math == "tf32";
  opts.timeout = std::chrono::milliseconds(a.timeout_ms);
  opts.run_id = "gpu-run";
  opts.dump_trace = a.dump_trace;
  opts.dump_reference = a.dump_reference;
  core::RunReport report;
  st = harness::Check(std::move(s), opts, &report);
  if (!st.ok()) return Fail("gpu-run", st);
  return EmitReport("gpu-run", report, a.reports);
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
  sub->add_option("--timeout-ms", args->timeout_ms, "Timeout of every collective, in ms")->check(CLI::Range(int64_t{1}, core::kMaxTimeoutMs));
  sub->add_option("--dump-trace", args->dump_trace, "Write the GPU world's trace to this folder");
  sub->add_option("--dump-reference", args->dump_reference, "Write the reference's trace to this folder");
  args->reports.Add(sub);
  sub->add_option("--rank", args->rank, "Run only this rank (ranks as processes; needs --store-dir)");
  sub->add_option("--store-dir", args->store_dir, "Shared folder of the FileStore the rank processes meet in");
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("gpu-run", Setup);

}  // namespace
}  // namespace ddpcheck::cli
