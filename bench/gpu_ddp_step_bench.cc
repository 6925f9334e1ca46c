// gpu_ddp_step_bench: wall time of DDP training steps on the GPU world (NCCL, one GPU per rank, nothing
// recorded), for an MLP of --width (default 2048) with --layers (default 3) linear+relu blocks and a per-rank batch of
// --batch, fp32 or --amp bf16/fp16. Prints ms per step; docs/gpu.md has the PyTorch DDP script that times the
// same model side by side. Exit 2 without a GPU.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/scenario.h"
#include "core/train_loop.h"
#include "harness/gpu/rank_setup_ref.h"
#include "real/device.h"
#include "real/world.h"

using namespace ddpcheck;

int main(int argc, char** argv) {
  int world = real::DeviceCount(), layers = 3;  // 12.6M parameters: within ddpcheck's 16M
  int64_t width = 2048, batch = 256, steps = 20;
  std::string amp, math = "fp32";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--world") world = std::atoi(argv[i + 1]);
    if (a == "--layers") layers = std::atoi(argv[i + 1]);
    if (a == "--width") width = std::atoll(argv[i + 1]);
    if (a == "--batch") batch = std::atoll(argv[i + 1]);
    if (a == "--steps") steps = std::atoll(argv[i + 1]);
    if (a == "--amp") amp = argv[i + 1];
    if (a == "--math") math = argv[i + 1];
  }
  core::Scenario s = core::DefaultScenario();
  s.model.clear();
  for (int l = 0; l < layers; ++l) {
    core::LayerSpec lin;
    lin.type = "linear";
    lin.in_features = width;
    lin.out_features = width;
    s.model.push_back(lin);
    core::LayerSpec relu;
    relu.type = "relu";
    s.model.push_back(relu);
  }
  s.loss = "mse";
  s.world = world;
  s.batch_size = batch;
  s.precision = core::DType::kFloat32;
  s.amp.enabled = !amp.empty();
  if (!amp.empty()) s.amp.dtype = amp;
  s.data = core::DataSpec();
  // Four batches per rank an epoch, as many epochs as the steps need (within ddpcheck's data limit of 32M values).
  s.data.samples = batch * world * 4;
  s.data.in_features = s.data.out_features = width;  // (a file's 0 is resolved by the loader, not here)
  const int64_t warm = 10;  // steps before the timed ones
  s.steps = warm + steps;
  s.epochs = (s.steps + 3) / 4;
  s.faults.clear();
  core::Status st = core::ValidateScenario(s);
  if (st.ok()) st = core::MaterializeData(&s);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 2;
  }
  if (real::DeviceCount() == 0) {  // (after the scenario's checks: a bad flag is reported on any machine)
    std::fprintf(stderr, "gpu_ddp_step_bench: no CUDA device\n");
    return 2;
  }
  real::RealOptions ro = harness::WithReferenceSetup(real::RealOptions{});
  ro.record = false;
  ro.tf32 = math == "tf32";
  // The steps are timed inside the run (rank 0's step ends, RealOptions::on_step), after `warm` steps, so neither
  // the setup (the reference's initial values, the replicas, NCCL's communicator: 0.7 s on an H100, varying by
  // 0.1 s run to run) nor CUDA's first-use costs are in it. (Timing whole runs and subtracting was too noisy:
  // over 100 steps it gave 0.1 ms/step on the H100, reports/gpu/h100-x1/README.md.) A step ends when rank 0's
  // optimizer step has been queued; the next step's loss read waits for it, so over many steps the mean is the
  // GPU's step time.
  std::chrono::steady_clock::time_point t_warm, t_end;
  ro.on_step = [&](int64_t step, int64_t) {
    if (step == warm) t_warm = std::chrono::steady_clock::now();
    if (step == warm + steps) t_end = std::chrono::steady_clock::now();
  };
  core::Trace trace;
  core::Status finding;  // a rank that stopped early (a timeout, a DDP error) would time fewer steps
  const auto t0 = std::chrono::steady_clock::now();
  st = real::RunReal(s, ro, &trace, &finding);
  const double total = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (st.ok()) st = finding;
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  const double ms = std::chrono::duration<double, std::milli>(t_end - t_warm).count() / static_cast<double>(steps);
  std::printf("# ddpcheck gpu_ddp_step_bench: %s\n", real::ProvenanceLine(real::GetProvenance()).c_str());
  std::printf("W=%d layers=%d width=%lld batch/rank=%lld amp=%s math=%s: %.3f ms/step (mean of %lld steps after %lld "
              "warm-up steps; the whole run %.0f ms)\n",
              world, layers, static_cast<long long>(width), static_cast<long long>(batch),
              amp.empty() ? "off" : amp.c_str(), math.c_str(), ms, static_cast<long long>(steps),
              static_cast<long long>(warm), total);
  return 0;
}
