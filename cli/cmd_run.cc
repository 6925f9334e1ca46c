// `ddpcheck run [SCENARIO]`: the main job. Runs the scenario on the reference and the chosen backend, compares
// them, prints the summary table and the verdict; the exit code is the verdict (0 PASS, 1 divergence, 2 bad
// input). Also writes the report as JSON, Markdown (PR comment), HTML (plots by gnuplot) and JUnit XML on request,
// and draws a progress bar on stderr when stderr is a terminal and the run is long.
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include "cli/command.h"
#include "cli/rank_env.h"
#include "cli/report_flags.h"
#include "cli/scenario_flags.h"
#include "harness/check.h"

namespace ddpcheck::cli {
namespace {

struct RunArgs {
  ScenarioFlags scenario;
  std::string backend = "sim";
  std::string comm = "gloo";
  std::string gloo_transport = "inproc";  // ranks as threads over gloo: inproc | tcp
  std::string math = "auto";  // GPU backends: fp32 GEMMs as fp32 or TF32
  int64_t timeout_ms = 0;  // 0: the scenario's ddp.timeout_ms
  std::string dump_trace, dump_reference;
  ReportFlags reports;
  std::string progress = "auto";  // auto (stderr is a TTY) | always | never
  RankFlags rank;  // ranks as processes (torchrun, mpirun, srun, ddpcheck launch): cli/rank_env.h
};


// A one-line bar on stderr, drawn by rank 0 after each step: only once the run has taken a second (short runs
// print nothing), redrawn at most every 100 ms, erased when the run ends.
class ProgressBar {
 public:
  void Update(int64_t done, int64_t total) {
    const auto now = std::chrono::steady_clock::now();
    if (now - start_ < std::chrono::seconds(1)) return;
    if (drawn_ && done < total && now - last_ < std::chrono::milliseconds(100)) return;
    last_ = now;
    drawn_ = true;
    constexpr int kWidth = 30;
    const int filled = total > 0 ? static_cast<int>(kWidth * done / total) : 0;
    const double secs = std::chrono::duration<double>(now - start_).count();
    std::cerr << "\r[" << std::string(static_cast<size_t>(filled), '#')
              << std::string(static_cast<size_t>(kWidth - filled), ' ') << "] step " << done << "/" << total << " ("
              << static_cast<int64_t>(secs) << " s)" << std::flush;
  }
  ~ProgressBar() {
    if (drawn_) std::cerr << "\r\033[K" << std::flush;
  }

 private:
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_;
  bool drawn_ = false;
};

int Run(const RunArgs& a) {
  core::Scenario s;
  core::Status st = a.scenario.Resolve(&s);
  if (!st.ok()) return Fail("run", st);
  st = a.reports.Preflight({a.scenario.path});
  if (!st.ok()) return Fail("run", st);
  const bool gpu = a.backend == "real" || a.backend == "hybrid";
  if (!gpu && a.math == "tf32") {
    return Fail("run", core::Status::Invalid("--math tf32 is a GPU math mode: use it with --backend real or hybrid"));
  }
  if (gpu && a.rank.Active()) {
    return Fail("run", core::Status::Invalid("--backend " + a.backend + " as one rank of a world of processes is "
                                             "`ddpcheck gpu-run --rank R --store-dir DIR`; `run` runs the whole "
                                             "GPU world from one process"));
  }
  harness::CheckOptions opts;
  opts.got.kind = a.backend == "reference" ? harness::SourceKind::kReference
                  : a.backend == "real"    ? harness::SourceKind::kGpu
                  : a.backend == "hybrid"  ? harness::SourceKind::kHybrid
                                           : harness::SourceKind::kSim;
  if (a.backend == "reference") opts.replay = false;  // the reference alone: its own invariants, no oracle
  opts.comm = a.comm;
  opts.gloo_transport = a.gloo_transport;
  opts.tf32 = a.math == "tf32";
  opts.timeout = std::chrono::milliseconds(a.timeout_ms);
  opts.dump_trace = a.dump_trace;
  opts.dump_reference = a.dump_reference;
  std::optional<ProgressBar> bar;
  if (a.progress == "always" || (a.progress == "auto" && !a.reports.quiet && isatty(STDERR_FILENO))) {
    bar.emplace();
    opts.progress = [&bar](int64_t done, int64_t total) { bar->Update(done, total); };
  }
  // A large world of threads over Gloo sets up a TCP pair per two ranks before its first step: W = 256 is 32640
  // connections, minutes on a small machine with nothing on the screen (QA round 15 took it for a hang).
  constexpr int kManyGlooRanks = 128;  // (W = 128 took 36 s on 2 CPUs, 256 over a minute)
  if (opts.got.kind == harness::SourceKind::kSim && a.comm == "gloo" && a.gloo_transport == "tcp" &&
      !a.rank.Active() && s.world > kManyGlooRanks && !a.reports.quiet) {
    ErrLine(fmt::format("ddpcheck run: note: W={} over Gloo connects {} TCP pairs before the first step, which can take "
                        "minutes on {} CPU(s); --gloo-transport inproc (the default) connects them in memory\n",
                        s.world, static_cast<int64_t>(s.world) * (s.world - 1) / 2, std::thread::hardware_concurrency()));
  }
  core::RunReport report;
  if (a.rank.Active()) {  // this process is one rank of a world of processes; rank 0 reports (cli/rank_env.h)
    bool reporter = false;
    st = RunCheckAsRank(a.scenario, a.rank, opts, &report, &reporter);
    bar.reset();
    if (!st.ok()) return Fail("run", st);
    if (!reporter) return 0;
  } else {
    st = harness::Check(std::move(s), opts, &report);
  }
  bar.reset();
  if (!st.ok()) return Fail("run", st);
  return EmitReport("run", report, a.reports);
}

std::pair<CLI::App*, RunFn> Setup(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "run",
      "Run a scenario on a backend and on the reference, and compare them.\n"
      "  example: ddpcheck run                                   (default scenario, W=4, sim over Gloo)\n"
      "  example: ddpcheck run scenarios/tutorial_toymodel.json --world 8 --comm local\n"
      "  example: ddpcheck run --backend reference --dump-trace /tmp/ref\n"
      "  example: ddpcheck run --backend real --world 1 --math tf32     (GPU world: CUDA + NCCL)\n"
      "  example: ddpcheck run --backend hybrid --world 4               (CUDA replicas, Gloo collectives)");
  auto args = std::make_shared<RunArgs>();
  args->scenario.Add(sub);
  args->rank.Add(sub);
  sub->add_option("--backend", args->backend,
                  "sim (CPU world) | reference | real (GPU: CUDA + NCCL) | hybrid (GPU: CUDA + Gloo)")
      ->check(CLI::IsMember({"sim", "reference", "real", "hybrid"}));
  sub->add_option("--math", args->math, "fp32 GEMMs of the GPU backends: auto (= fp32) | fp32 | tf32")
      ->check(CLI::IsMember({"auto", "fp32", "tf32"}));
  sub->add_option("--comm", args->comm, "Collectives of the sim world: gloo (Gloo's collectives) | local (in memory)")
      ->check(CLI::IsMember({"gloo", "local"}));
  sub->add_option("--gloo-transport", args->gloo_transport,
                  "How Gloo's messages travel between the sim's rank threads: inproc (copied from buffer to buffer, "
                  "the default) | tcp (loopback sockets, as ranks in processes use); same collectives, same bits")
      ->check(CLI::IsMember({"inproc", "tcp"}));
  sub->add_option("--timeout-ms", args->timeout_ms, "Timeout of every collective, in ms (default: the scenario's ddp.timeout_ms, 30000)")->check(CLI::Range(int64_t{1}, core::kMaxTimeoutMs));
  sub->add_option("--dump-trace", args->dump_trace, "Write the backend's trace to this folder");
  sub->add_option("--dump-reference", args->dump_reference, "Write the reference's trace to this folder");
  args->reports.Add(sub);
  sub->add_option("--progress", args->progress,
                  "Progress bar on stderr: auto (when stderr is a terminal) | always | never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  return {sub, [args] { return Run(*args); }};
}

DDPCHECK_REGISTER_COMMAND("run", Setup);

}  // namespace
}  // namespace ddpcheck::cli
