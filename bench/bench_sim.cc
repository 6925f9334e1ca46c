// ddpcheck_bench_sim: steady-state time of one DDP training step in the CPU world.
//
// Runs sim::RunSim (Gloo communicator over loopback TCP by default, fingerprints ON unless --no-fingerprints,
// record=false) on an MLP Linear(h,h) -> ReLU -> Linear(h,h) -> ReLU -> Linear(h,h), MSE, SGD, fp32, per-rank
// batch B, world W, for `warmup + steps` optimizer steps. Rank 0 timestamps the end of each step through
// SimOptions::progress; step time = (end of step warmup+steps - end of step warmup) / steps, so setup (replicas,
// rendezvous, DDP construction and its broadcasts, the bucket rebuild of the 2nd step) and thread teardown are
// excluded. Every step ends with an all-reduce, so rank 0's clock paces the world. `reps` independent runs;
// the median is reported, with the process's CPU time per timed step (cpu_ms: every rank thread and Gloo's
// event loop; cpu_ms / step_ms is how many of the cores the step kept busy).
//
// With --floor it times instead the same step at W = 1 as a bare loop on the sim's BLAS (bench/step_floor.h),
// the least the sim's step could take: {"impl": "floor", ...}.
//
//   ddpcheck_bench_sim --hidden 56 --world 4 --batch 32 --warmup 3 --steps 20 --reps 3
// prints one JSON line: {"impl": "sim/gloo", "hidden": 56, "params": 9576, "world": 4, ..., "step_ms": 0.41}
#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/step_floor.h"
#include "core/scenario.h"
#include "core/train_loop.h"
#include "reference/blas.h"
#include "sim/world.h"

namespace {

using namespace ddpcheck;

struct Args {
  int64_t hidden = 56;
  int world = 4;
  int64_t batch = 32;
  int64_t warmup = 3;
  int64_t steps = 20;
  int reps = 3;
  bool fingerprints = true;
  int64_t direct_bytes = 256 * 1024;  // GlooCommunicator's one-round all-reduce up to this size; 0: always the ring
  std::string comm = "gloo";  // "gloo" (the realistic one) | "local" (in-memory, for comparison)
  std::string transport = "inproc";  // the Gloo pairs of the rank threads: inproc (the default) | tcp
  bool floor = false;         // time bench/step_floor.h's bare loop instead of the sim
};

[[noreturn]] void Usage(const char* why) {
  std::fprintf(stderr,
               "ddpcheck_bench_sim: %s\nusage: ddpcheck_bench_sim [--hidden H] [--world W] [--batch B] "
               "[--warmup N] [--steps N] [--reps N] [--no-fingerprints] [--comm gloo|local] [--gloo-transport inproc|tcp] [--gloo-ring-only] [--floor]\n",
               why);
  std::exit(2);
}

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--no-fingerprints") {
      a.fingerprints = false;
      continue;
    }
    if (k == "--gloo-ring-only") {
      a.direct_bytes = 0;
      continue;
    }
    if (k == "--floor") {
      a.floor = true;
      continue;
    }
    if (i + 1 >= argc) Usage(("missing value after " + k).c_str());
    if (k == "--comm") {
      a.comm = argv[++i];
      continue;
    }
    if (k == "--gloo-transport") {
      a.transport = argv[++i];
      continue;
    }
    const long long v = std::atoll(argv[++i]);
    if (v < 1) Usage((k + " must be >= 1").c_str());
    if (k == "--hidden") a.hidden = v;
    else if (k == "--world") a.world = static_cast<int>(v);
    else if (k == "--batch") a.batch = v;
    else if (k == "--warmup") a.warmup = v;
    else if (k == "--steps") a.steps = v;
    else if (k == "--reps") a.reps = static_cast<int>(v);
    else Usage(("unknown flag " + k).c_str());
  }
  return a;
}

core::Scenario MlpScenario(const Args& a, int64_t steps) {
  core::Scenario s;
  s.name = "bench-mlp";
  s.source = "<bench>";
  s.base_dir = ".";
  for (int l = 0; l < 3; ++l) {
    if (l > 0) {
      core::LayerSpec relu;
      relu.type = "relu";
      s.model.push_back(relu);
    }
    core::LayerSpec lin;
    lin.type = "linear";
    lin.in_features = a.hidden;
    lin.out_features = a.hidden;
    s.model.push_back(lin);
  }
  s.loss = "mse";
  s.world = a.world;
  s.batch_size = a.batch;
  s.precision = core::DType::kFloat32;
  s.optimizer.type = "sgd";
  s.optimizer.lr = 0.01;
  s.epochs = 1;
  s.steps = steps;
  s.data.kind = "regression";
  s.data.samples = a.batch * a.world * steps;  // one epoch holds exactly `steps` steps
  s.data.in_features = a.hidden;
  s.data.out_features = a.hidden;
  return s;
}

// The process's CPU time (every rank thread and Gloo's event loop), seconds.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

struct StepTimes {
  double wall = 0;  // seconds per timed step
  double cpu = 0;   // process CPU seconds per timed step
};

// Steady-state seconds per step of one RunSim of `warmup + steps` steps (data materialised beforehand).
StepTimes StepSeconds(const Args& a) {
  const int64_t total = a.warmup + a.steps;
  core::Scenario s = MlpScenario(a, total);
  core::Status st = core::ValidateScenario(s);
  if (st.ok()) st = core::MaterializeData(&s);
  if (!st.ok()) {
    std::fprintf(stderr, "bench scenario: %s\n", st.ToString().c_str());
    std::exit(1);
  }
  using Clock = std::chrono::steady_clock;
  Clock::time_point warm, end;
  double cpu_warm = 0, cpu_end = 0;
  sim::SimOptions opts;
  opts.comm = a.comm;
  opts.record = false;
  opts.verify_fingerprints = a.fingerprints;
  opts.gloo_direct_allreduce_bytes = a.direct_bytes;
  opts.gloo_transport = a.transport;
  opts.run_id = "bench";
  opts.progress = [&](int64_t done, int64_t) {
    if (done == a.warmup) {
      warm = Clock::now();
      cpu_warm = ProcessCpuSeconds();
    }
    if (done == total) {
      end = Clock::now();
      cpu_end = ProcessCpuSeconds();
    }
  };
  core::Trace trace;
  core::Status finding;
  st = sim::RunSim(s, opts, &trace, &finding);
  if (!st.ok() || !finding.ok()) {
    std::fprintf(stderr, "RunSim failed: %s %s\n", st.ToString().c_str(), finding.ToString().c_str());
    std::exit(1);
  }
  const double steps = static_cast<double>(a.steps);
  return {std::chrono::duration<double>(end - warm).count() / steps, (cpu_end - cpu_warm) / steps};
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = ParseArgs(argc, argv);
  std::vector<double> per_step, cpu_per_step;
  for (int r = 0; r < a.reps; ++r) {
    if (a.floor) {
      per_step.push_back(bench::FloorStepSeconds(a.hidden, a.batch, a.warmup, a.steps));
      cpu_per_step.push_back(per_step.back());  // one thread, never waiting
    } else {
      const StepTimes t = StepSeconds(a);
      per_step.push_back(t.wall);
      cpu_per_step.push_back(t.cpu);
    }
  }
  std::sort(per_step.begin(), per_step.end());
  std::sort(cpu_per_step.begin(), cpu_per_step.end());
  const double median = per_step[per_step.size() / 2];
  const double cpu_median = cpu_per_step[cpu_per_step.size() / 2];
  const int64_t params = 3 * (a.hidden * a.hidden + a.hidden);
  const std::string impl = a.floor ? "floor" : "sim/" + a.comm + (a.comm == "gloo" ? "/" + a.transport : "");
  std::printf(
      "{\"impl\": \"%s\", \"hidden\": %lld, \"params\": %lld, \"world\": %d, \"batch\": %lld, \"steps\": %lld, "
      "\"reps\": %d, \"fingerprints\": %s, \"direct_allreduce_bytes\": %lld, \"blas\": \"%s\", \"step_ms\": %.4f, "
      "\"min_ms\": %.4f, \"max_ms\": %.4f, \"cpu_ms\": %.4f}\n",
      impl.c_str(), static_cast<long long>(a.hidden), static_cast<long long>(params), a.floor ? 1 : a.world,
      static_cast<long long>(a.batch), static_cast<long long>(a.steps), a.reps, a.fingerprints ? "true" : "false",
      static_cast<long long>(a.direct_bytes), ref::BlasBackend().c_str(), median * 1e3, per_step.front() * 1e3,
      per_step.back() * 1e3, cpu_median * 1e3);
  return 0;
}
